"""Opening a collection read-only, and the operations that read it.

Opening never writes: the SQLite file is opened with ``immutable=1`` (no
locks, no journal, no -wal/-shm), and LanceDB is read at the version the
file names. Nothing done at open time grows with the corpus.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path

from ..indexing import schema
from ..indexing.schema import FileIdentity  # noqa: F401  (part of the reading API)
from ..errors import ChunkNotFound, CollectionNotFound, IndexInconsistent, NotACollection
# The response models (pydantic) are imported where they are used: a fresh process that
# searches starts loading its query model before it imports them (adr/0037).
from ..indexing.names import LANCE_SUFFIX, NAME_PATTERN, SQLITE_SUFFIX, sqlite_path, validate_name
from .rows import CITATION_COLUMNS, HIT_SQL, ChunkRow, HitRow  # noqa: F401  (HitRow: the API)


_SEARCH_API = None
_BM25 = None  # the bm25 and views modules, bound by the first ranking (not at open: numpy)


def _search_api():
    """``(SearchRequest, run_search)``, imported by the first search (opening a collection
    imports neither pydantic nor the search) and then kept: an import statement in
    ``search`` cost about 1.4 us a call."""
    global _SEARCH_API
    from .models import SearchRequest
    from .search import run_search

    _SEARCH_API = (SearchRequest, run_search)
    return _SEARCH_API


_new_tuple = tuple.__new__  # a named tuple's _make without its length check (the SELECT fixes it)


# Hit rows (about 1 kB each) and citations kept per open collection, read by row id.
HIT_ROW_CACHE = 4096
_NOT_ASKED = object()


class Collection:
    """A read-only view of one published version of a collection: its connection, its lock
    and everything its searches keep (postings, tie order, reader views, hit rows,
    citations, the source check), all of one version, so never stale (adr/0054)."""

    def __init__(self, path: Path, name: str, *, base_dir: Path | None = None, embedder=None,
                 reranker=None):
        self.path = Path(path)
        self.name = name
        # Server configuration, never request fields: which models answer queries.
        self.embedder = embedder
        self.reranker = reranker
        self.identity = FileIdentity.of(self.path)
        self._conn = schema.connect_readonly(self.path)
        self._lock = threading.RLock()
        try:
            schema.check_stamp(self._conn)
            self.manifest = schema.read_manifest(self._conn)
        except sqlite3.DatabaseError:
            self._conn.close()
            raise NotACollection("not a groundkit collection") from None
        except Exception:
            self._conn.close()
            raise
        self.generation = int(self.manifest.get("generation", "0"))
        self.has_encoding = schema.has_encoding_column(self._conn)
        self.has_stat = schema.has_stat_columns(self._conn)
        self._vectors = None
        self._vectors_loaded = False
        # Not ``_lock``: opening LanceDB takes long and must not hold up BM25 on this object.
        self._vector_lock = threading.Lock()
        self._vector_search = None
        self._index_failed = False
        self._prefetch = None
        self._warm = None
        self._vector_total = None
        self._protected = None
        # What searches keep of this version (adr/0054), each read under ``_lock`` when filled.
        self._postings_cache = None  # bm25.PostingsCache, made by the first ranking
        self._tie_ranks = None
        self._chunk_total = None
        self._views = None  # views.ReaderViews
        self._whole_view = _NOT_ASKED
        self._hit_rows: dict = {}
        self._citations: dict = {}
        self._stale = None  # stale.StaleCheck of ``base_dir``
        self.base_dir = Path(base_dir) if base_dir is not None else self._manifest_base_dir()

    @classmethod
    def open(cls, name: str, *, index_dir: str | Path = ".", base_dir: str | Path | None = None,
             **config):
        """Open collection ``name`` in ``index_dir``; the name is validated before any lookup."""
        path = sqlite_path(Path(index_dir), name)
        if not path.is_file() or path.is_symlink() and not _inside(path, Path(index_dir)):
            raise CollectionNotFound(f"collection '{name}' not found")
        if not schema.is_collection_file(path):
            raise CollectionNotFound(f"collection '{name}' not found")
        return cls(path, name, base_dir=Path(base_dir) if base_dir is not None else None, **config)

    @classmethod
    def from_path(cls, path: str | Path, *, base_dir: str | Path | None = None, **config):
        path = Path(path)
        if not path.name.endswith(SQLITE_SUFFIX) or not schema.is_collection_file(path):
            raise NotACollection("not a groundkit collection")
        name = path.name[: -len(SQLITE_SUFFIX)]
        return cls(path, name, base_dir=base_dir, **config)

    def _manifest_base_dir(self) -> Path | None:
        rel = self.manifest.get("base_dir")
        if rel is None:
            return None
        return (self.path.parent / rel).resolve()

    def close(self) -> None:
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def is_current(self) -> bool:
        """False once an ingest has published a newer file at the same path."""
        try:
            return FileIdentity.of(self.path) == self.identity
        except FileNotFoundError:
            return False

    # -- low-level reads ------------------------------------------------------

    @property
    def protected(self) -> bool:
        """Whether this version has (or a former one had) access lists; asked of this
        object's own connection, so a publish cannot change the answer mid-request."""
        if self._protected is None:
            from ..indexing.access_lists import connection_is_protected

            with self._lock:
                self._protected = connection_is_protected(self._conn)
        return self._protected

    def query(self, sql: str, params=(), row=None) -> list[tuple]:
        """The rows of ``sql``: tuples, or ``row`` (a named tuple of the selected columns)."""
        with self._lock:
            if row is None:
                return self._conn.execute(sql, params).fetchall()
            cursor = self._conn.cursor()
            cursor.row_factory = lambda _cursor, values: _new_tuple(row, values)
            return cursor.execute(sql, params).fetchall()

    def chunk_total(self) -> int:
        """Chunks in this version, as BM25 counted them."""
        if self._chunk_total is None:
            with self._lock:
                self._chunk_total = self._conn.execute(
                    "SELECT count(*) FROM bm25_chunk_terms").fetchone()[0]
        return self._chunk_total

    # -- what searches keep of this version (adr/0054) ----------------------------

    def tie_ranks(self):
        """The BM25 tie-break order (``bm25.tie_ranks``), read once; None for a file written
        before it was stored."""
        if self._tie_ranks is None:
            with self._lock:
                if self._tie_ranks is None:
                    self._tie_ranks = (_bm25().tie_ranks(self._conn),)
        return self._tie_ranks[0]

    @property
    def postings_cache(self):
        """This version's postings as read so far (``bm25.PostingsCache``)."""
        return self._postings()

    def _postings(self):
        cache = self._postings_cache
        if cache is None:
            cache = self._postings_cache = _bm25().PostingsCache()
        return cache

    def bm25_top(self, query: str, depth: int, view=None):
        """``bm25.top_rows`` on this version's postings, or on ``view`` (a reader's, from
        :meth:`bm25_view`): ``([row id], [score])`` in rank order. Needs :meth:`tie_ranks`."""
        with self._lock:
            return _bm25().top_rows(self._conn, query, depth,
                                    self._postings() if view is None else view, self.tie_ranks())

    def bm25_scores(self, query: str, view=None, hidden=None):
        """``bm25.score``: every matching chunk's ``(row ids, scores)``, on ``view`` when given,
        else on the stored postings re-weighted without the ``hidden`` rows (a file without a
        document map)."""
        with self._lock:
            if view is not None:
                return _bm25().score(self._conn, query, view)
            total = self.chunk_total() if hidden is not None else None
            return _bm25().score(self._conn, query, self._postings(), hidden, total)

    def matched_terms(self, query: str, row_ids) -> list[list[str]]:
        """``bm25.matched_terms`` for the chunk rows ``row_ids``."""
        with self._lock:
            return _bm25().matched_terms(self._conn, query, row_ids, self._postings())

    def term_rows(self, query: str) -> list:
        """``bm25.term_rows``: the chunk row ids holding each of the query's terms."""
        with self._lock:
            return _bm25().term_rows(self._conn, query, self._postings())

    def reader_view(self, hidden_documents: tuple):
        """The BM25 view (``views.ReaderView``, adr/0051) of a reader from whom
        ``hidden_documents`` are hidden, kept per set (their chunk rows looked up once);
        :meth:`bm25_view` prepares it for ranking."""
        with self._lock:
            def hidden_rows():
                rows = self.query(
                    "SELECT id FROM chunks WHERE document_id IN (SELECT value FROM json_each(?))",
                    [json.dumps(list(hidden_documents))])
                import numpy as np

                return np.sort(np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)))

            return self._reader_views().get(tuple(hidden_documents), self._postings(), hidden_rows)

    def bm25_view(self, view=None):
        """The view BM25 ranks on: ``view`` (from :meth:`reader_view`) prepared, else, on a
        collection with access lists whose stored weights are not its own statistics, the
        view hiding nothing; None: the stored postings (a view cannot be made without the
        document map: the legacy re-weighting, ``bm25.without_hidden``)."""
        with self._lock:
            if view is not None:
                return view.prepare(self._conn)
            if self._whole_view is _NOT_ASKED:
                self._whole_view = self._unhidden_view()
            return self._whole_view

    def _reader_views(self):
        if self._views is None:
            raw = self.manifest.get("bm25_stats")
            try:
                stored = json.loads(raw) if raw else None
            except ValueError:
                stored = None
            self._views = _views().ReaderViews(stored if isinstance(stored, dict) else None)
        return self._views

    def _unhidden_view(self):
        # The manifest records access lists (sticky once any version had one); without them no
        # reader is shown anything another could not see, and the stored weights answer.
        if self.manifest.get("access_lists") != "1":
            return None
        views = self._reader_views()
        if not views.stale(self._conn, self._postings()):
            return None
        import numpy as np

        return views.get((), self._postings(), lambda: np.empty(0, np.int64)).prepare(self._conn)

    def hit_rows(self, key: str, values: list) -> list[HitRow]:
        """The hit rows of the chunks whose ``key`` (``id``, the row id, or ``chunk_id``) is
        one of ``values``: one SQL query. By row id, in the order of ``values``, rows already
        read come from memory and only the others are queried."""
        if not values:
            return []
        if key != "id":
            return self._query_hit_rows("chunk_id", values)
        cache = self._hit_rows
        get = cache.get
        rows = [get(i) for i in values]  # in the order of ``values``
        if None not in rows:
            return rows
        found = dict(zip(values, rows))
        missing = [i for i, r in found.items() if r is None]
        with self._lock:  # searches may run in several threads
            for r in self._query_hit_rows("id", missing):
                found[r.row_id] = cache[r.row_id] = r
            while len(cache) > HIT_ROW_CACHE:
                del cache[next(iter(cache))]  # the oldest first (dicts keep insertion order)
        return [r for r in found.values() if r is not None]

    def _query_hit_rows(self, key: str, values: list) -> list[HitRow]:
        stat = "d.source_size, d.source_mtime_ns" if self.has_stat else "NULL, NULL"
        sql = HIT_SQL.format(stat=stat, key=key, marks=",".join("?" * len(values)))
        return self.query(sql, values, row=HitRow)

    def citations(self, rows) -> list[dict]:
        """Each hit row's citation fields as a dict (``CITATION_COLUMNS``), kept by chunk id
        (bounded like the hit rows). Callers copy them: the kept dicts are never changed."""
        kept = self._citations
        cited = kept.get
        out = []
        for r in rows:
            citation = cited(r.chunk_id)
            if citation is None:  # the row's first twelve columns, by name, made once
                citation = dict(zip(CITATION_COLUMNS, r))
                if len(kept) >= HIT_ROW_CACHE:
                    kept.clear()
                kept[r.chunk_id] = citation
            out.append(citation)
        return out

    def sources_changed(self, rows) -> list:
        """For each hit row, whether its file's size or mtime differs from ingest's record
        (``stale.StaleCheck``, made again when ``base_dir`` is set to another directory)."""
        check = self._stale
        if check is None or check.base_dir is not self.base_dir:
            from .stale import StaleCheck

            check = self._stale = StaleCheck(self.base_dir)
        return check.changed_rows(rows)

    def sources_checked_locally(self) -> bool:
        """Whether a search's source checks stay off the network: no base directory, or one
        on a local file system the watcher covers (known after the first search; False
        before)."""
        if self.base_dir is None:
            return True
        check = self._stale
        return check is not None and check.base_dir is self.base_dir and check.local

    @property
    def lance_path(self) -> Path:
        return self.path.parent / (self.name + LANCE_SUFFIX)

    @property
    def embedding(self) -> EmbeddingManifest | None:
        m = self.manifest
        if not m.get("embedding_model"):
            return None
        from .models import EmbeddingManifest

        return EmbeddingManifest(
            provider=m["embedding_provider"],
            model=m["embedding_model"],
            dimensions=int(m["embedding_dimensions"]),
        )

    @property
    def embedding_max_length(self) -> int | None:
        """The ``max_length`` the documents were embedded at (``embedding_max_length`` in the
        manifest), which queries are embedded at too; None when not recorded (a collection
        from before the record, or an embedder without one): the embedder's default."""
        try:
            return int(self.manifest.get("embedding_max_length") or 0) or None
        except ValueError:
            return None

    @property
    def embedding_compute(self) -> str | None:
        """How the documents' vectors were computed (``embedding_compute`` in the manifest:
        MiniLM's "fp32" or "int8", adr/0040), which queries are computed with too; None when
        not recorded (a collection from before the record: fp32)."""
        return self.manifest.get("embedding_compute") or None

    def vectors(self):
        """The LanceDB table at the published version, or None for a BM25-only collection."""
        if not self._vectors_loaded:
            with self._vector_lock:
                if not self._vectors_loaded:
                    from ..indexing.vectors import open_table

                    version = self.manifest.get("lance_version")
                    table = None
                    if self.embedding is not None and version is not None:
                        try:
                            table = open_table(self.lance_path, int(version))
                        except Exception:
                            raise IndexInconsistent(
                                "the collection's vector index is missing or does not match its "
                                "documents; re-run groundkit ingest"
                            ) from None
                        if table is None:
                            raise IndexInconsistent(
                                "the collection's vector index is missing; re-run groundkit ingest"
                            )
                    self._vectors = table
                    self._vectors_loaded = True
        return self._vectors

    def vector_search(self):
        """The query side of the vectors (indexing/vectors.py ``VectorSearch``), opened
        once; None for a BM25-only collection."""
        if self._vector_search is None and not self._index_failed:
            name, version = self.manifest.get("vector_index"), self.manifest.get("lance_version")
            if self.embedding is not None and name and version is not None:
                # The memory-mapped index file: no lancedb import, nothing read up front.
                with self._vector_lock:
                    if self._vector_search is None:
                        from ..indexing.vectors import IndexSearch

                        try:
                            self._vector_search = IndexSearch(self.lance_path, name, int(version))
                        except (OSError, ValueError, KeyError):
                            self._index_failed = True  # LanceDB, the store of record, answers
        if self._vector_search is None:
            table = self.vectors()
            if table is None:
                return None
            with self._vector_lock:
                if self._vector_search is None:
                    from ..indexing.vectors import VectorSearch

                    self._vector_search = VectorSearch(table, ann=bool(self.manifest.get("ann_index")))
        return self._vector_search

    def prefetch(self, *, embedder: bool = True) -> None:
        """Start reading what dense search needs in a background thread: LanceDB, the table
        at this version, the vectors for exact search or the ANN index, and (``embedder``)
        the query embedder's model. Returns at once; a search that needs them waits for
        what is not ready yet. Called by the first dense or hybrid query, so a fresh
        process loads the vectors while it embeds the query and ranks BM25; servers may
        call it at open. Failures are left for the search itself to report."""
        if self.embedding is None or self._prefetch is not None:
            return
        with self._vector_lock:
            if self._prefetch is not None:
                return
            self._prefetch = threading.Thread(target=self._prefetch_run, args=(embedder,),
                                              name=f"groundkit-prefetch-{self.name}", daemon=True)
        self._prefetch.start()

    def _prefetch_run(self, embedder: bool) -> None:
        try:
            if embedder:
                from .rankers import query_embedder

                model = query_embedder(self, probe=False)
                threading.Thread(target=getattr(model, "load", lambda: None), daemon=True).start()
            search = self.vector_search()
            if search is not None:
                search.load()
        except Exception:  # an optimisation only: the search reports the real error
            pass

    # -- operations -----------------------------------------------------------

    def search(self, request: SearchRequest | None = None, /, **fields) -> SearchResponse:
        if request is None:
            # The model load starts first: the request's validation imports pydantic.
            self._warm_query_model(fields.get("mode"), fields.get("query"), fields.get("vector"))
            request = (_SEARCH_API or _search_api())[0].model_validate(fields)  # 1 us under (**fields)
        else:
            self._warm_query_model(request.mode, request.query, request.vector)
        return (_SEARCH_API or _search_api())[1](self, request)

    def _warm_query_model(self, mode, query, vector) -> None:
        """A text query in a dense mode on a collection embedded with the default MiniLM:
        load the model in a thread now, while this process imports and validates the rest
        of the search (adr/0037). Its ``load`` takes the result. Nothing to do when the
        server configured its own embedder or the model is loaded already."""
        if (self._warm is not None or self.embedder is not None or vector is not None
                or mode not in (None, "dense", "hybrid") or not isinstance(query, str) or not query.strip()):
            return
        m = self.manifest  # not ``self.embedding``: that imports the models first
        from ..registry import DEFAULT_EMBEDDER

        if not m.get("embedding_model") or m.get("embedder", DEFAULT_EMBEDDER) != DEFAULT_EMBEDDER:
            return
        from ..embedding.embedders import MiniLMEmbedder

        if (m.get("embedding_provider"), m.get("embedding_model"), m.get("embedding_dimensions")) != (
                MiniLMEmbedder.provider, MiniLMEmbedder.model_name, str(MiniLMEmbedder.dimensions)):
            return
        # At the documents' length: the query embedder is built at it (rankers.query_embedder).
        from ..embedding.embedders import UNRECORDED_COMPUTE  # loaded with MiniLMEmbedder: no cost

        self._warm = MiniLMEmbedder.start_warm(self.embedding_max_length,
                                               self.embedding_compute or UNRECORDED_COMPUTE) or False

    def fetch_chunk(self, chunk_id: str) -> ChunkResponse:
        from .models import ChunkCitation, ChunkResponse, FetchChunkRequest

        FetchChunkRequest(chunk_id=chunk_id)
        rows = self.query(
            """SELECT c.chunk_id, c.document_id, c.chunk_index, d.source, d.title, c.start_offset,
                      c.end_offset, c.line_start, c.line_end, c.page_start, c.page_end, c.heading,
                      c.content, c.content_hash, d.source_class, d.extractor, d.extractor_version,
                      {encoding}
               FROM chunks c JOIN documents d USING (document_id) WHERE c.chunk_id = ?""".format(
                encoding="d.encoding" if self.has_encoding else "NULL"),
            (chunk_id,), row=ChunkRow,
        )
        if not rows:
            raise ChunkNotFound("chunk not found")  # the same words for a chunk hidden by permissions
        r = rows[0]
        citation = ChunkCitation(**{f: getattr(r, f) for f in ChunkCitation.model_fields})
        from .citations import verify_citation  # here: BM25 and dense searches never need it

        verification = verify_citation(
            source=r.source, source_class=r.source_class, extractor=r.extractor,
            extractor_version=r.extractor_version, start=r.start_offset, end=r.end_offset,
            content=r.content, base_dir=self.base_dir, encoding=r.encoding,
        )
        return ChunkResponse(
            collection=self.name, generation=self.generation, chunk=citation,
            verification=verification,
        )

    def status(self, *, embedder_check=None) -> IndexStatus:
        from .models import IndexStatus

        documents = self.query("SELECT count(*) FROM documents")[0][0]
        chunks = self.query("SELECT count(*) FROM chunks")[0][0]
        terms = self.query("SELECT count(*) FROM bm25_vocab")[0][0]
        embedding = self.embedding
        from .search import dense_unavailable_reason

        # What this server can do, not only what the manifest records.
        reason = dense_unavailable_reason(self)
        vectors = None
        if embedding is not None:
            vectors = self.vector_count()
            if reason is None:
                reason = coverage_reason(vectors, chunks)
        dense = reason is None
        from .modes import available_modes
        chunker = json.loads(self.manifest["chunker"]) if self.manifest.get("chunker") else None
        return IndexStatus(
            collection=self.name,
            generation=self.generation,
            schema_version=schema.read_stamp(self._conn)[1],
            documents=documents,
            chunks=chunks,
            embedding=embedding,
            dense_available=dense,
            dense_unavailable_reason=reason,
            modes=available_modes(self, reason),
            ann_index=self.manifest.get("ann_index") or None,
            chunker=chunker,
            bm25_terms=terms,
            vectors=vectors,
            last_ingest=self._last_ingest(),
        )

    def _last_ingest(self):
        """The manifest's ingest record; file names only where no access list could hide one."""
        from .models import LastIngest

        at, raw = self.manifest.get("ingested_at"), self.manifest.get("ingest_report")
        if at is None and raw is None:
            return None
        try:
            report = json.loads(raw) if raw else {}
        except ValueError:
            report = {}
        named = self.manifest.get("access_lists") != "1"

        def files(key):
            if not named:
                return None
            return [{"source": str(s), "reason": str(r)} for s, r in report.get(key, [])]

        return LastIngest(ingested_at=at, skipped=int(report.get("skipped", 0)),
                          failed=int(report.get("failed", 0)),
                          skipped_files=files("skipped_files"), failed_files=files("failed_files"))

    def vector_count(self, hidden_documents=()) -> int:
        """Chunks of this version that have a vector, leaving out ``hidden_documents``' chunks."""
        if not hidden_documents and self._vector_total is None:
            try:
                search = self.vector_search()
            except IndexInconsistent:
                return 0
            self._vector_total = search.rows if search is not None else 0
        if not hidden_documents:
            return self._vector_total
        try:
            table = self.vectors()
        except IndexInconsistent:
            return 0
        if table is None:
            return 0
        hidden = set(hidden_documents)
        ids = table.to_arrow().select(["chunk_id", "document_id"]).to_pydict()
        with_vector = {c for c, d in zip(ids["chunk_id"], ids["document_id"]) if d not in hidden}
        readable = {r[0] for r in self.query(
            "SELECT chunk_id FROM chunks WHERE document_id NOT IN (SELECT value FROM json_each(?))",
            (json.dumps(sorted(hidden)),),
        )}
        return len(with_vector & readable)


def _bm25():
    """The bm25 module, imported by the first ranking and then kept."""
    global _BM25
    if _BM25 is None:
        from . import bm25, views

        _BM25 = (bm25, views)
    return _BM25[0]


def _views():
    _bm25()
    return _BM25[1]


def coverage_reason(vectors: int, chunks: int) -> str | None:
    """Why dense search is off when vectors cover only part of the chunks (None: all)."""
    if vectors >= chunks:
        return None
    return f"vectors cover {vectors} of {chunks} chunks; re-run groundkit ingest to embed the rest"


def _inside(path: Path, directory: Path) -> bool:
    real = path.resolve()
    root = directory.resolve()
    return real.parent == root


def list_collections(index_dir: str | Path) -> CollectionsResponse:
    """Names of the collections in ``index_dir``, checked from their headers without writing."""
    from .models import CollectionsResponse

    root = Path(index_dir)
    names = []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return CollectionsResponse(collections=[])
    for entry in entries:
        if not entry.name.endswith(SQLITE_SUFFIX):
            continue
        name = entry.name[: -len(SQLITE_SUFFIX)]
        if not NAME_PATTERN.fullmatch(name):
            continue
        path = Path(entry.path)
        if entry.is_symlink() and not _inside(path, root):
            continue
        if path.is_file() and schema.is_collection_file(path):
            names.append(name)
    return CollectionsResponse(collections=names)


__all__ = ["Collection", "list_collections", "validate_name"]
