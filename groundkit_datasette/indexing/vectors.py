"""Chunk vectors in LanceDB, keyed by ``chunk_id``.

The SQLite manifest names the table version it goes with (``lance_version``);
readers check that version out, so vectors written by an unfinished ingest
are never seen.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

TABLE = "chunks"
ADD_BATCH = 4096
# Below this many vectors an exact scan is fast enough and always exact.
ANN_THRESHOLD = 5000
ANN_INDEX = "IVF_HNSW_SQ"
# Query-time settings measured to give recall@10 >= 0.95 (benchmarks/dense.py).
ANN_EF = 150
ANN_REFINE = 2
# Index upkeep (adr/0030-postings-and-index-upkeep.md). Rows the index does not cover are
# scanned exactly by every query; up to this many (or this share of the table) stay so.
ANN_UNINDEXED_ROWS = 2000
ANN_UNINDEXED_FRACTION = 0.01
# Past that, the new rows are added to the trained index (``optimize``: partitions are
# kept, nothing is retrained) until the table holds this many times the rows it was
# trained on; then the index is trained again from every row.
ANN_RETRAIN_GROWTH = 1.5
# ``optimize`` never prunes versions: readers hold the published one, and a dead run is
# rolled back to it (adr/0002).
_KEEP_VERSIONS_DAYS = 365 * 100
# Query side: at or below this many vectors, search exactly in numpy over the vectors held in
# memory (read once per collection version) instead of asking LanceDB (benchmarks/dense.py:
# 0.2 ms against 4 ms at 10k; adr/0026-dense-exact-search.md).
EXACT_MAX_ROWS = 50_000
# A run keeps at most this many of its added vectors for the index file's delta.
_RUN_KEEP_MAX = 50_000


def _schema(dimensions: int):
    import pyarrow as pa  # the writer's: a query process never needs pyarrow

    return pa.schema(
        [
            pa.field("chunk_id", pa.string()),
            pa.field("document_id", pa.string()),
            pa.field("vector", pa.list_(pa.float32(), dimensions)),
        ]
    )


def open_table(lance_dir: Path, version: int | None = None):
    """Open the vector table read-only at ``version`` (or ``None`` when there is none)."""
    import lancedb

    if not Path(lance_dir).is_dir():
        return None
    db = lancedb.connect(str(lance_dir))
    try:
        table = db.open_table(TABLE)
    except Exception:
        return None
    if version is not None:
        table.checkout(int(version))
    return table


class VectorSearch:
    """The query side of one published table version, opened once per open collection.

    Small tables are searched exactly in numpy (the vectors are read once, kept read-only);
    larger ones through LanceDB's ANN index (its public query builder). Either
    way a document filter is a prefilter: a chunk outside it never takes a top-k slot.
    """

    def __init__(self, table, *, ann: bool, exact_max_rows: int | None = None):
        self.table = table
        self.ann = bool(ann)
        self.rows = table.count_rows()
        limit = EXACT_MAX_ROWS if exact_max_rows is None else exact_max_rows
        self.exact = self.rows <= limit
        self._lock = threading.Lock()
        self._matrix = None

    # -- exact ----------------------------------------------------------------

    def load(self) -> None:
        """Read what the first search needs now: the vectors for exact search, or (ANN) one
        throw-away query so LanceDB has read the index."""
        if not self.exact:
            probe = np.zeros(self._dimensions(), dtype=np.float32)
            probe[0] = 1.0
            self._ann(probe, 10, None)
            return
        self._exact_data()

    def _dimensions(self) -> int:
        return self.table.schema.field("vector").type.list_size

    def _exact_data(self):
        if self._matrix is None:
            with self._lock:
                if self._matrix is None:
                    data = self.table.to_arrow().select(["chunk_id", "document_id", "vector"])
                    vectors = data.column("vector").combine_chunks()
                    width = vectors.type.list_size
                    matrix = np.ascontiguousarray(
                        vectors.values.to_numpy(zero_copy_only=False).reshape(-1, width),
                        dtype=np.float32)
                    norms = np.linalg.norm(matrix, axis=1)
                    docs = data.column("document_id").to_pylist()
                    names, codes = np.unique(np.asarray(docs, dtype=object), return_inverse=True)
                    ids = np.asarray(data.column("chunk_id").to_pylist(), dtype=object)
                    for a in (matrix, norms, codes):
                        a.flags.writeable = False
                    self._doc_code = {d: i for i, d in enumerate(names.tolist())}
                    self._codes = codes.astype(np.int64).reshape(-1)
                    self._ids = ids
                    self._norms = np.maximum(norms, 1e-12)
                    self._matrix = matrix
        return self._matrix

    def _exact(self, vector, depth, documents, exclude):
        matrix = self._exact_data()
        if not matrix.shape[0]:
            return []
        q = np.asarray(vector, dtype=np.float32)
        # Cosine similarity, as LanceDB's flat search scores it (1 - cosine distance).
        scores = dots(matrix, q) / (self._norms * max(float(np.linalg.norm(q)), 1e-12))
        rows = None
        if documents is not None:
            wanted = np.zeros(len(self._doc_code), dtype=bool)
            known = [self._doc_code[d] for d in documents if d in self._doc_code]
            wanted[known] = True
            keep = wanted[self._codes]
            rows = np.flatnonzero(~keep if exclude else keep)
            scores = scores[rows]
        if not scores.size:
            return []
        top = _best_first(scores, depth)  # equal scores in table order
        positions = rows[top] if rows is not None else top
        return list(zip(self._ids[positions].tolist(), scores[top].astype(float).tolist()))

    # -- ANN ------------------------------------------------------------------

    def _ann(self, vector, depth, where):
        # LanceDB's public query builder. The private single hop into its event loop it
        # replaces (``table._table`` on ``background_loop.LOOP``) was 6.4 against 6.5 ms at
        # depth 10, 7.7 against 9.7 at 100 (50k, adr/0056); this path answers only a
        # collection without an index file, so no user-visible figure depends on it.
        q = np.asarray(vector, dtype=np.float32)
        query = self.table.search(q, vector_column_name="vector")
        query = query.distance_type("cosine").limit(depth).select(["chunk_id", "_distance"])
        if self.ann:
            # LanceDB needs ef >= the candidates it refines (depth x refine factor).
            query = query.ef(max(ANN_EF, depth * ANN_REFINE)).refine_factor(ANN_REFINE)
        if where is not None:
            query = query.where(where, prefilter=True)
        result = query.to_arrow()
        ids = result.column("chunk_id").to_pylist()
        dist = result.column("_distance").to_numpy(zero_copy_only=False)
        return list(zip(ids, (1.0 - dist.astype(np.float64)).tolist()))

    def search(self, vector, depth: int, documents=None, exclude: bool = False):
        """``[(chunk_id, cosine similarity)]`` best first, at most ``depth``.

        ``documents``: only their chunks (``exclude``: all but theirs); None: every chunk.
        """
        if documents is not None and not documents and not exclude:
            return []
        if self.exact:
            return self._exact(vector, depth, documents, exclude)
        where = None
        if documents is not None and documents:
            quoted = ",".join("'" + d.replace("'", "''") + "'" for d in documents)
            where = f"document_id {'NOT IN' if exclude else 'IN'} ({quoted})"
        return self._ann(vector, depth, where)


class _ByDocument(dict):
    """``{document_id: its chunk ids}``, each document's set made when it is first asked for
    (a run touches a few of the 45k documents; building every set costs seconds)."""

    def __init__(self, chunk_ids: list[str], document_ids):
        import pyarrow.compute as pc

        super().__init__()
        encoded = pc.dictionary_encode(document_ids.combine_chunks()
                                       if hasattr(document_ids, "combine_chunks") else document_ids)
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        self._index = {d: i for i, d in enumerate(encoded.dictionary.to_pylist())}
        self._order = np.argsort(codes, kind="stable")
        self._bounds = np.searchsorted(codes[self._order], np.arange(len(self._index) + 1))
        self._chunk_ids = chunk_ids

    def _load(self, document_id):
        i = self._index.pop(document_id, None)
        if i is None:
            return None
        ids = {self._chunk_ids[j] for j in self._order[self._bounds[i]:self._bounds[i + 1]].tolist()}
        super().__setitem__(document_id, ids)
        return ids

    def get(self, document_id, default=None):
        if dict.__contains__(self, document_id):
            return dict.__getitem__(self, document_id)
        found = self._load(document_id)
        return default if found is None else found

    def __getitem__(self, document_id):
        found = self.get(document_id)
        if found is None:
            raise KeyError(document_id)
        return found

    def __contains__(self, document_id):
        return dict.__contains__(self, document_id) or document_id in self._index

    def __setitem__(self, document_id, ids):
        self._index.pop(document_id, None)
        super().__setitem__(document_id, ids)


class _LazyByDocument(dict):
    """``{document_id: its chunk ids}``, read from the table for the documents asked for."""

    def __init__(self, writer: "VectorWriter"):
        super().__init__()
        self._writer = writer

    def get(self, document_id, default=None):
        if not dict.__contains__(self, document_id):
            writer = self._writer
            if not writer._all_loaded:
                writer.load_documents([document_id])
            elif writer._stored is not None and document_id in writer._stored:
                dict.__setitem__(self, document_id, set(writer._stored[document_id]))
        return dict.get(self, document_id, default)

    def __getitem__(self, document_id):
        found = self.get(document_id)
        if found is None:
            raise KeyError(document_id)
        return found

    def __contains__(self, document_id):
        return self.get(document_id) is not None


class VectorWriter:
    """Buffers one ingest run's vector changes and applies them at commit.

    The chunk ids already stored are read for the documents a run touches, a filtered scan
    of the id columns each time (adr/0034-one-file-edit-cost.md); past :data:`LAZY_ID_QUERIES` such reads, or when
    :meth:`load_all` is called, every id is read at once."""

    LAZY_ID_QUERIES = 16

    def __init__(self, lance_dir: Path, dimensions: int, published_version: str | None,
                 ann_threshold: int = ANN_THRESHOLD, trained_rows: int | None = None):
        import lancedb

        self.lance_dir = Path(lance_dir)
        self.published_version = None if published_version is None else int(published_version)
        # The index file commit wrote (``manifest_entries``), and how: "none", "kept",
        # "delta" or "built".
        self.index_name: str | None = None
        self.index_file_action = "none"
        # This run's changes, kept for the index file's delta (None: too many to keep).
        self._run_added: list | None = []
        self._run_deleted: set[str] = set()
        self.dimensions = dimensions
        self.ann_threshold = ann_threshold
        self.ann_index: str | None = None
        # Rows the published index was trained on (the manifest's ``ann_trained_rows``).
        self.trained_rows = trained_rows
        # What commit did to the index: "none", "kept", "updated" or "trained".
        self.index_action = "none"
        self.db = lancedb.connect(str(lance_dir))
        self.table = None
        # ``ids``: the stored chunk ids read so far, as this run leaves them.
        self.by_document = _LazyByDocument(self)
        self.ids: set[str] = set()
        # Rows of the published version at start (0 without a table): the caller compares it
        # with the collection's chunk count to tell whether every chunk has its vector.
        self.start_rows = 0
        self._all_loaded = True
        self._stored = None
        self._queries = 0
        if TABLE in self.db.list_tables().tables:
            self.table = self.db.open_table(TABLE)
            if published_version is not None and self.table.version != int(published_version):
                # A run that died after writing vectors but before publishing: roll back.
                self.table.restore(int(published_version))
            self.start_rows = self.table.count_rows()
            self._all_loaded = self.start_rows == 0
        self.to_delete: set[str] = set()
        self.to_add: list[tuple[str, str, np.ndarray]] = []

    def load_documents(self, document_ids) -> None:
        """Read the stored chunk ids of these documents (each once, before the run changes it)."""
        if self._all_loaded:
            return
        todo = [d for d in dict.fromkeys(document_ids) if not dict.__contains__(self.by_document, d)]
        if not todo:
            return
        self._queries += 1
        if self._queries > self.LAZY_ID_QUERIES:
            self.load_all()
            return
        for i in range(0, len(todo), 1000):
            part = todo[i : i + 1000]
            quoted = ",".join("'" + d.replace("'", "''") + "'" for d in part)
            found = (self.table.search().where(f"document_id IN ({quoted})")
                     .select(["chunk_id", "document_id"]).limit(None).to_arrow())
            for d in part:
                dict.__setitem__(self.by_document, d, set())
            for cid, did in zip(found.column("chunk_id").to_pylist(),
                                found.column("document_id").to_pylist()):
                dict.__getitem__(self.by_document, did).add(cid)
                self.ids.add(cid)

    def load_all(self) -> None:
        """Read every stored chunk id (the two id columns, not the vectors)."""
        if self._all_loaded:
            return
        # The table may hold this run's flushed adds already, never its deletes (those wait
        # for commit); documents the run has read or changed keep their entries.
        current = self.table.search().select(["chunk_id", "document_id"]).limit(None).to_arrow()
        chunk_ids = current.column("chunk_id").to_pylist()
        self._stored = _ByDocument(chunk_ids, current.column("document_id"))
        self.ids = (set(chunk_ids) - self.to_delete) | {cid for cid, _, _ in self.to_add}
        self._all_loaded = True

    def existing_ids(self, chunk_ids, document_ids=()) -> set[str]:
        """Which of ``chunk_ids`` (of the documents ``document_ids``) have a vector. Without
        ``document_ids`` every stored id is read first."""
        if document_ids:
            self.load_documents(document_ids)
        else:
            self.load_all()
        return {c for c in chunk_ids if c in self.ids}

    def replace_document(self, document_id: str, new_rows, keep_ids) -> None:
        keep = set(keep_ids)
        old = self.by_document.get(document_id, set())
        gone = old - keep
        self.to_delete |= gone
        self.ids -= gone
        for cid, vec in new_rows:
            self.to_add.append((cid, document_id, np.asarray(vec, dtype=np.float32)))
            self.ids.add(cid)
        if self._run_added is not None:
            self._run_added.extend(self.to_add[len(self.to_add) - len(new_rows):])
            if len(self._run_added) > _RUN_KEEP_MAX:
                self._run_added = None
        dict.__setitem__(self.by_document, document_id, (old & keep) | {cid for cid, _ in new_rows})
        if len(self.to_add) >= ADD_BATCH:
            self._flush_adds()

    def _ensure_table(self):
        if self.table is None:
            self.table = self.db.create_table(TABLE, schema=_schema(self.dimensions))

    def _flush_adds(self):
        if not self.to_add:
            return
        import pyarrow as pa

        self._ensure_table()
        flat = np.stack([v for _, _, v in self.to_add]).astype(np.float32).ravel()
        batch = pa.table(
            {
                "chunk_id": [c for c, _, _ in self.to_add],
                "document_id": [d for _, d, _ in self.to_add],
                "vector": pa.FixedSizeListArray.from_arrays(pa.array(flat), self.dimensions),
            },
            schema=_schema(self.dimensions),
        )
        self.table.add(batch)
        self.to_add = []

    def commit(self) -> int:
        self._ensure_table()
        doomed = sorted(self.to_delete)
        self._run_deleted |= self.to_delete
        for i in range(0, len(doomed), 1000):
            quoted = ",".join("'" + c.replace("'", "''") + "'" for c in doomed[i : i + 1000])
            self.table.delete(f"chunk_id IN ({quoted})")
        self.to_delete = set()
        self._flush_adds()
        self._maybe_index()
        self._write_index_file(self.table.version)
        return self.table.version

    # -- the memory-mapped index file --------------------------------------------

    def index_missing(self) -> bool:
        """Whether the published version has no index file yet (a collection ingested before
        it existed): the ingest then publishes one even when no file changed."""
        if self.published_version is None:
            return False
        return not (self.lance_dir / index_file_name(self.published_version)).is_file()

    def manifest_entries(self) -> list[tuple[str, str]]:
        """What the manifest records about the vectors after ``commit``."""
        return [("lance_version", str(self.table.version)), ("ann_index", self.ann_index or ""),
                ("ann_trained_rows", str(self.trained_rows or "")),
                ("vector_index", self.index_name or "")]

    def _write_index_file(self, version: int) -> None:
        name = index_file_name(version)
        path = self.lance_dir / name
        prev_path = (self.lance_dir / index_file_name(self.published_version)
                     if self.published_version is not None else None)
        prev = None
        if prev_path is not None and prev_path.is_file():
            try:
                prev = IndexFile(prev_path)
            except (OSError, ValueError):
                prev = None
        if version == self.published_version and prev is not None:
            self.index_name, self.index_file_action = name, "kept"
            return
        rows = self.table.count_rows()
        if prev is not None and self._run_added is not None:
            if self._write_delta(path, version, prev, rows):
                self.index_name, self.index_file_action = name, "delta"
                self._cleanup_index_files(keep={name, self._base_of(name)})
                return
        centroids = trained = None
        if prev is not None:
            base = prev if prev.header.get("kind") == "base" else IndexFile(
                self.lance_dir / prev.header["base"])
            if "centroids" in base.arrays and rows < INDEX_RETRAIN_GROWTH * base.header.get("trained_rows", rows):
                centroids, trained = np.array(base["centroids"]), base.header.get("trained_rows")
        build_index_from_table(self.lance_dir, self.table, version, centroids=centroids,
                               trained_rows=trained)
        self.index_name, self.index_file_action = name, "built"
        self._cleanup_index_files(keep={name})

    def _base_of(self, name: str) -> str:
        f = IndexFile(self.lance_dir / name)
        return f.header.get("base", name)

    def _write_delta(self, path: Path, version: int, prev: IndexFile, rows: int) -> bool:
        """Write a delta on the previous file's base when the changes since it are few."""
        if prev.header.get("kind") == "delta":
            base_name = prev.header["base"]
            base = _Part(IndexFile(self.lance_dir / base_name))
            delta = _Part(prev)
            deleted = set(prev["deleted"].tolist())
            names = delta.doc_names()
            carried = [(cid, names[delta.docs[i]], i) for i, cid in enumerate(delta.chunk_ids())]
        else:
            base_name = index_file_name(self.published_version)
            base = _Part(prev)
            delta, deleted, carried = None, set(), []
        gone = self._run_deleted
        limit = max(INDEX_DELTA_ROWS, INDEX_DELTA_FRACTION * base.rows)
        added = [(c, d, delta.vectors[i]) for c, d, i in carried if c not in gone]
        added += [(c, d, v) for c, d, v in self._run_added]
        if len(added) > limit:
            return False
        if gone:
            position = {cid: i for i, cid in enumerate(base.chunk_ids())}
            deleted |= {position[c] for c in gone if c in position}
        if len(added) + len(deleted) > limit:
            return False
        # The delta must describe exactly the table LanceDB now holds.
        if base.rows - len(deleted) + len(added) != rows:
            return False
        matrix = (np.stack([v for _, _, v in added]) if added
                  else np.zeros((0, self.dimensions), dtype=np.float32))
        write_delta_index(path, version, base_name, np.asarray(sorted(deleted), dtype=np.int64),
                          [c for c, _, _ in added], [d for _, d, _ in added], matrix)
        return True

    def _cleanup_index_files(self, keep: set[str]) -> None:
        """Remove index files no manifest can name any more: all but this run's (and its base)
        and the published one (a reader holding that version may not have opened it yet)."""
        folder = self.lance_dir / INDEX_SUBDIR
        if self.published_version is not None:
            published = index_file_name(self.published_version)
            keep = keep | {published}
            try:
                keep.add(self._base_of(published))
            except (OSError, ValueError):
                pass
        for entry in folder.iterdir() if folder.is_dir() else ():
            if f"{INDEX_SUBDIR}/{entry.name}" not in keep:
                try:
                    entry.unlink()
                except OSError:
                    pass

    def _maybe_index(self) -> None:
        """Keep the ANN index current without retraining it for every run."""
        from datetime import timedelta

        from lancedb.index import IvfHnswSq

        rows = self.table.count_rows()
        indices = self.table.list_indices()
        if rows < self.ann_threshold:
            self.ann_index = None
            self.trained_rows = None
            if indices:
                self.table.drop_index(indices[0].name)
                self.index_action = "dropped"
            return
        stats = self.table.index_stats(indices[0].name) if indices else None
        self.ann_index = ANN_INDEX
        if self.trained_rows is None and stats is not None:
            self.trained_rows = stats.num_indexed_rows  # a file from before the record
        if stats is not None and self.trained_rows and rows < ANN_RETRAIN_GROWTH * self.trained_rows:
            if stats.num_unindexed_rows <= max(ANN_UNINDEXED_ROWS, ANN_UNINDEXED_FRACTION * rows):
                self.index_action = "kept"
                return
            # New rows go into the trained partitions; compaction comes with it.
            self.table.optimize(cleanup_older_than=timedelta(days=_KEEP_VERSIONS_DAYS))
            self.index_action = "updated"
            return
        self.table.create_index("vector", config=IvfHnswSq(distance_type="cosine"), replace=True)
        self.trained_rows = rows
        self.index_action = "trained"


# -- the memory-mapped index file ---------------------------------------------------------
#
# A copy of the vectors derived from the LanceDB table at one version, laid out so that a
# query process opens it with one ``mmap`` (no lancedb import, nothing read up front) and
# searches it in numpy: exactly (flat) up to IVF_MIN_ROWS vectors, through an inverted file
# (k-means lists, each list's vectors stored together, NPROBE lists read per query) above.
# It lives in ``<name>.lance/_groundkit/``, is named by the table version it copies, is
# written (temporary name, fsync, rename) before the SQLite file that names it in its
# manifest (``vector_index``) is published, and is never written by a read. A small ingest
# writes a delta file (the rows added since the base file, and the base rows deleted) that
# names its base, instead of copying the whole table again (adr/0033-mmap-vector-index.md).

INDEX_SUBDIR = "_groundkit"
INDEX_MAGIC = b"GKVEC001"
_ALIGN = 64
# Flat (every vector scored) up to this many vectors; an inverted file above.
IVF_MIN_ROWS = EXACT_MAX_ROWS
# Lists: about IVF_LIST_FACTOR * sqrt(rows). Lists probed per query: PROBE_FRACTION of them,
# at least NPROBE (benchmarks/dense.py --real-vectors, real MiniLM vectors: recall@10 >= 0.95).
IVF_LIST_FACTOR = 2.0
NPROBE = 32
PROBE_FRACTION = 0.10
KMEANS_SAMPLE_PER_LIST = 32
KMEANS_ITERATIONS = 8
# Above IVF_MIN_ROWS the base file also holds a proximity graph (HNSW, usearch) over the unit
# vectors quantised to GRAPH_DTYPE: a query walks it to a shortlist of GRAPH_SHORTLIST rows
# (or the depth asked for, when deeper) and ranks that shortlist by its exact float32 cosine
# scores. The shortlist does not depend on the depth up to GRAPH_SHORTLIST, so a shallower
# search stays a prefix of a deeper one (paging), and hybrid's 100 candidates cost what the
# top 10 cost (adr/0033, "Graph index"). Files without the graph (older ones, or written where
# usearch is missing) are probed as an inverted file, as before.
GRAPH_DTYPE = "i8"
GRAPH_CONNECTIVITY = 16
GRAPH_EXPANSION_ADD = 128
GRAPH_EXPANSION_SEARCH = 256
GRAPH_SHORTLIST = 100
# A deny-list that leaves at most this many base rows is answered by scoring them all: about
# what one walk computes (expansion x connectivity distances), and exact, where a walk or a
# probe would find only the few allowed rows that happen to lie on its path.
DENY_EXACT_ROWS = GRAPH_EXPANSION_SEARCH * GRAPH_CONNECTIVITY // 2
_NO_ROWS = np.zeros(0, dtype=np.int64)
# A delta holds at most this many rows (added plus deleted) or this share of the base, as
# LanceDB's unindexed tail does (adr/0030); past that the base file is written again (its
# lists kept, vectors reassigned) and, past INDEX_RETRAIN_GROWTH x the rows the lists were
# trained on, the lists are trained again.
INDEX_DELTA_ROWS = ANN_UNINDEXED_ROWS
INDEX_DELTA_FRACTION = ANN_UNINDEXED_FRACTION
INDEX_RETRAIN_GROWTH = ANN_RETRAIN_GROWTH


def index_file_name(version: int) -> str:
    return f"{INDEX_SUBDIR}/v{int(version)}.gkv"


def _checked_name(name: str) -> str:
    """An index file name as ``index_file_name`` makes them, never a path elsewhere."""
    import re

    if not isinstance(name, str) or not re.fullmatch(rf"{INDEX_SUBDIR}/v[0-9]{{1,18}}\.gkv", name):
        raise ValueError("bad index file name")
    return name


def _blob(strings) -> tuple[np.ndarray, np.ndarray]:
    encoded = [s.encode("utf-8") for s in strings]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    if encoded:
        np.cumsum([len(b) + 1 for b in encoded], out=offsets[1:])
    blob = np.frombuffer(b"\n".join(encoded) + (b"\n" if encoded else b""), dtype=np.uint8)
    return blob, offsets


def _unblob(blob: np.ndarray) -> list[str]:
    if not blob.size:
        return []
    return blob.tobytes()[:-1].decode("utf-8").split("\n")


def _write_file(path: Path, header: dict, arrays: dict, mode: int | None = None) -> None:
    """Write ``arrays`` after a JSON header, each 64-byte aligned; publish by rename."""
    import json
    import os

    layout, offset = {}, 0
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        arrays[name] = a
        layout[name] = [offset, a.dtype.str, list(a.shape)]
        offset += -(-a.nbytes // _ALIGN) * _ALIGN
    head = json.dumps(dict(header, arrays=layout), sort_keys=True).encode()
    start = -(-(len(INDEX_MAGIC) + 8 + len(head)) // _ALIGN) * _ALIGN
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(INDEX_MAGIC + len(head).to_bytes(8, "little") + head)
        f.write(b"\0" * (start - f.tell()))
        for name, a in arrays.items():
            here = f.tell() - start
            f.write(b"\0" * (layout[name][0] - here))
            f.write(memoryview(a).cast("B") if a.nbytes else b"")
        f.write(b"\0" * (start + offset - f.tell()))
        f.flush()
        os.fsync(f.fileno())
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)


def _usearch():
    """usearch's compiled module, or None where it is not installed (the inverted file answers)."""
    try:
        from usearch import compiled
    except ImportError:
        return None
    return compiled


def _graph_kind(compiled, dtype: str):
    return {"f32": compiled.ScalarKind.F32, "f16": compiled.ScalarKind.F16,
            "i8": compiled.ScalarKind.I8}[dtype]


def _duplicate_groups(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows grouped by equal vectors: ``(rows, offsets)``, group ``g`` being
    ``rows[offsets[g]:offsets[g + 1]]`` (ascending), groups in order of their first row."""
    n = matrix.shape[0]
    raw = np.ascontiguousarray(matrix, dtype=np.float32).view(np.dtype((np.void, 4 * matrix.shape[1])))
    _, first, inverse = np.unique(raw.reshape(-1), return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    group = rank[inverse]
    rows = np.argsort(group, kind="stable").astype(np.int64)
    offsets = np.searchsorted(group[rows], np.arange(first.size + 1)).astype(np.int64)
    assert offsets[-1] == n
    return rows, offsets


def build_graph(matrix: np.ndarray, norms: np.ndarray, dtype: str | None = None) -> dict | None:
    """The arrays of an HNSW graph over the rows of ``matrix`` (``norms``: their lengths), at
    unit length: one node per distinct vector (``graph_rows``/``graph_off`` give each node's rows;
    boilerplate chunks repeat, and a graph of many equal vectors loses its way), serialised
    for the index file; None without usearch."""
    compiled = _usearch()
    if compiled is None or not matrix.shape[0]:
        return None
    dtype = dtype or GRAPH_DTYPE
    rows, offsets = _duplicate_groups(matrix)
    nodes = offsets.size - 1
    first = rows[offsets[:-1]]
    unit = matrix[first] / np.maximum(norms[first], 1e-12)[:, None]
    index = compiled.Index(ndim=int(matrix.shape[1]), dtype=_graph_kind(compiled, dtype),
                           connectivity=GRAPH_CONNECTIVITY, expansion_add=GRAPH_EXPANSION_ADD,
                           metric_kind=compiled.MetricKind.Cos)
    index.add_many(np.arange(nodes, dtype=np.uint64), np.ascontiguousarray(unit, dtype=np.float32),
                   threads=0)
    del unit
    blob = np.frombuffer(bytes(index.save_index_to_buffer()), dtype=np.uint8)
    return {"graph": blob, "graph_rows": rows, "graph_off": offsets,
            "meta": {"engine": "usearch", "dtype": dtype, "connectivity": GRAPH_CONNECTIVITY,
                     "dims": int(matrix.shape[1]), "nodes": int(nodes)}}


class _Graph:
    """A file's HNSW graph, viewed in place in the file's mapping (usearch ``view``: nothing
    copied, pages read as the walk touches them)."""

    def __init__(self, compiled, blob: np.ndarray, meta: dict, rows: np.ndarray, offsets: np.ndarray):
        self.rows, self.offsets = rows, offsets
        self.index = compiled.Index(ndim=int(meta["dims"]), dtype=_graph_kind(compiled, meta["dtype"]),
                                    connectivity=int(meta["connectivity"]),
                                    metric_kind=compiled.MetricKind.Cos)
        self.index.view_index_from_buffer(blob)
        self.index.expansion_search = GRAPH_EXPANSION_SEARCH
        self._lock = threading.Lock()

    def shortlist(self, q: np.ndarray, count: int) -> np.ndarray:
        """Row numbers of about ``count`` near neighbours of ``q``, nearest first."""
        q = np.ascontiguousarray(q, dtype=np.float32).reshape(1, -1)
        with self._lock:  # the search width is the index's state: one walk at a time
            self.index.expansion_search = max(GRAPH_EXPANSION_SEARCH, count)
            keys, _dist, counts = self.index.search_many(q, count, threads=1)[:3]
        nodes = keys[0][: int(counts[0])].astype(np.int64)
        starts, ends = self.offsets[nodes], self.offsets[nodes + 1]
        if int((ends - starts).max(initial=1)) == 1:
            return self.rows[starts]
        return np.concatenate([self.rows[a:b] for a, b in zip(starts.tolist(), ends.tolist())])


class IndexFile:
    """One ``.gkv`` file opened read-only by ``mmap``; arrays are views into the mapping."""

    def __init__(self, path: Path):
        import json
        import mmap

        with open(path, "rb") as f:
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if self.map[: len(INDEX_MAGIC)] != INDEX_MAGIC:
            raise ValueError("not a groundkit vector index file")
        n = int.from_bytes(self.map[8:16], "little")
        self.header = json.loads(self.map[16 : 16 + n])
        start = -(-(16 + n) // _ALIGN) * _ALIGN
        self.arrays = {}
        for name, (offset, dtype, shape) in self.header["arrays"].items():
            count = int(np.prod(shape)) if shape else 1
            a = np.frombuffer(self.map, dtype=np.dtype(dtype), count=count, offset=start + offset)
            self.arrays[name] = a.reshape(shape)

    def __getitem__(self, name):
        return self.arrays[name]


class _Part:
    """The rows of one file (a base, or a delta's added rows) as searched together."""

    def __init__(self, f: IndexFile):
        self.vectors, self.norms = f["vectors"], f["norms"]
        self.docs, self.id_off, self.id_blob = f["docs"], f["id_off"], f["id_blob"]
        self.doc_blob = f["doc_blob"]
        self.offsets = f.arrays.get("offsets")
        self.centroids = f.arrays.get("centroids")
        self.graph_blob = f.arrays.get("graph")
        self.graph_meta = f.header.get("graph")
        self.graph_rows, self.graph_off = f.arrays.get("graph_rows"), f.arrays.get("graph_off")
        self.rows = int(self.norms.shape[0])
        self._doc_code = None
        self._id_view = None

    def chunk_id(self, row: int) -> str:
        return self.id_blob[self.id_off[row] : self.id_off[row + 1] - 1].tobytes().decode("utf-8")

    def chunk_ids_at(self, rows) -> list[str]:
        """The chunk ids of ``rows`` (one slice of the mapped bytes each, no numpy scalar)."""
        if self._id_view is None:
            self._id_view = memoryview(self.id_blob)
        rows = np.asarray(rows, dtype=np.int64)
        view = self._id_view
        return [str(view[a : b - 1], "utf-8")
                for a, b in zip(self.id_off[rows].tolist(), self.id_off[rows + 1].tolist())]

    def chunk_ids(self) -> list[str]:
        return _unblob(self.id_blob)

    def doc_names(self) -> list[str]:
        return _unblob(self.doc_blob)

    def doc_code(self) -> dict:
        if self._doc_code is None:
            self._doc_code = {d: i for i, d in enumerate(self.doc_names())}
        return self._doc_code

    def rows_of(self, documents) -> np.ndarray:
        """Row numbers whose document is in ``documents``."""
        codes = [self.doc_code()[d] for d in documents if d in self.doc_code()]
        if not codes:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(np.isin(self.docs, np.asarray(codes, dtype=self.docs.dtype)))


_vecdot = getattr(np, "vecdot", None)  # numpy 2: one dot product per row


def dots(vectors: np.ndarray, q: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Each row's dot product with ``q``, computed row by row (one vector dot product each,
    numpy's einsum loop before numpy 2): a chunk's score then does not depend on where its
    row sits or how many rows are searched. BLAS's matrix-vector product adds the rows at
    the end of a block, or of a thread's share, in another order, which moved the last
    bits of a readable chunk's score with the hidden rows around it (adr/0051)."""
    if _vecdot is not None:
        return _vecdot(vectors, q, out=out)
    return np.einsum("ij,j->i", vectors, q, out=out)


def _score(vectors, norms, q, qnorm):
    return dots(vectors, q) / (np.maximum(norms, 1e-12) * qnorm)


class IndexSearch:
    """Dense search over an index file (and its delta): the query side used when the manifest
    names one. Same answers as ``VectorSearch``'s exact numpy search when flat; an inverted
    file probed at NPROBE lists above IVF_MIN_ROWS. Filters are prefilters: an allow-list is
    searched exactly over its own rows; a deny-list is applied to the probed rows, and an
    exact scan answers when that leaves fewer than the depth asked for."""

    exact = True  # for callers that ask which path answered (benchmarks)

    def __init__(self, lance_dir: Path, name: str, version: int, nprobe: int | None = None,
                 graph: bool | None = None):
        """``nprobe``: probe that many lists of the inverted file (and not the graph, unless
        ``graph`` is True); ``graph``: whether to walk the file's graph when it has one
        (default: when no ``nprobe`` is given)."""
        f = IndexFile(Path(lance_dir) / _checked_name(name))
        if int(f.header.get("lance_version", -1)) != int(version):
            raise ValueError("index file does not match the table version")
        self.delta = None
        self.deleted = None
        if f.header.get("kind") == "delta":
            base = IndexFile(Path(lance_dir) / _checked_name(f.header["base"]))
            self.delta = _Part(f)
            deleted = f["deleted"]
            self.base = _Part(base)
            if deleted.size:
                self.deleted = np.zeros(self.base.rows, dtype=bool)
                self.deleted[deleted] = True
            self.files = (base, f)
        else:
            self.base = _Part(f)
            self.files = (f,)
        self.ivf = self.base.centroids is not None and self.base.centroids.shape[0] > 1
        self.exact = not self.ivf
        lists = self.base.centroids.shape[0] if self.ivf else 1
        self.nprobe = nprobe if nprobe is not None else max(NPROBE, int(np.ceil(PROBE_FRACTION * lists)))
        self.rows = self.base.rows + (self.delta.rows if self.delta else 0)
        if self.deleted is not None:
            self.rows -= int(self.deleted.sum())
        want_graph = nprobe is None if graph is None else graph
        self.graph = None  # opened on first use (``load``): usearch imported only then
        self._use_graph = bool(want_graph and self.base.graph_blob is not None
                               and self.base.graph_rows is not None and self.base.graph_off is not None
                               and (self.base.graph_meta or {}).get("engine") == "usearch")
        self._graph_lock = threading.Lock()

    def load(self) -> None:
        """Nothing to read up front (pages come in as queries touch them) but the graph's
        view, when the file has one."""
        self._open_graph()

    def _open_graph(self):
        if self._use_graph and self.graph is None:
            with self._graph_lock:
                if self.graph is None and self._use_graph:
                    compiled = _usearch()
                    try:
                        self.graph = _Graph(compiled, self.base.graph_blob, self.base.graph_meta,
                                            self.base.graph_rows, self.base.graph_off) \
                            if compiled is not None else None
                    except (RuntimeError, ValueError, KeyError, TypeError):
                        self.graph = None
                    if self.graph is None:
                        self._use_graph = False  # no usearch here: the inverted file answers
        return self.graph

    def _left_by_deny_list(self, q, qnorm, depth, documents, hidden_rows):
        """Every base row a deny-list leaves, scored exactly, and the delta's rows it leaves."""
        part = self.base
        keep = np.ones(part.rows, dtype=bool)
        keep[hidden_rows] = False
        if self.deleted is not None:
            keep &= ~self.deleted
        rows = np.flatnonzero(keep)
        out = [(part, rows, _score(part.vectors[rows], part.norms[rows], q, qnorm))]
        if self.delta is not None and self.delta.rows:
            out += self._candidates(q, qnorm, depth, documents, True, base=False)
        return out

    def _graph_candidates(self, q, qnorm, depth, documents, exclude, hidden_rows):
        """The graph's shortlist, less ``hidden_rows`` (a deny-list's), with exact scores; None
        when too few rows are left after the filter (the inverted file, or an exact scan,
        answers then)."""
        graph = self._open_graph()
        if graph is None:
            return None
        part = self.base
        count = max(depth, GRAPH_SHORTLIST)
        for _attempt in range(2):  # a wider walk once when the filter leaves too few rows
            rows = graph.shortlist(q / qnorm, count)
            keep = None
            if self.deleted is not None:
                keep = ~self.deleted[rows]
            if hidden_rows is not None:  # a deny-list (allow-lists never come here)
                hidden = np.isin(rows, hidden_rows)
                keep = ~hidden if keep is None else keep & ~hidden
            if keep is not None:
                rows = rows[keep]
            if keep is None or rows.size >= min(depth, part.rows):
                break
            count *= 4
        else:
            return None
        rows = np.sort(rows)  # memory order; ties are broken by row number anyway
        out = [(part, rows, _score(part.vectors[rows], part.norms[rows], q, qnorm))]
        if self.delta is not None and self.delta.rows:
            out += self._candidates(q, qnorm, depth, documents, exclude, base=False)
        return out

    def _candidates(self, q, qnorm, depth, documents, exclude, base=True):
        """``(part, rows, scores)`` triples to rank (``base``: False for the delta's alone)."""
        out = []
        parts = [(self.base, self.deleted)] + ([(self.delta, None)] if self.delta else [])
        for i, (part, deleted) in enumerate(parts):
            if not part.rows or (i == 0 and not base):
                continue
            if documents is not None and not exclude:
                rows = part.rows_of(documents)
                if deleted is not None:
                    rows = rows[~deleted[rows]]
                out.append((part, rows, _score(part.vectors[rows], part.norms[rows], q, qnorm)))
                continue
            if i == 0 and self.ivf:
                cs = part.centroids @ q
                probe = min(self.nprobe, cs.size)
                lists = np.argpartition(-cs, probe - 1)[:probe] if probe < cs.size else np.arange(cs.size)
                lists.sort()
                starts, ends = part.offsets[lists], part.offsets[lists + 1]
                sizes = ends - starts
                total = int(sizes.sum())
                # One matrix-vector product per list, written in place; rows and norms after.
                scored = np.empty(total, dtype=np.float32)
                at = 0
                for a, b in zip(starts.tolist(), ends.tolist()):
                    if b > a:
                        dots(part.vectors[a:b], q, out=scored[at : at + b - a])
                        at += b - a
                rows = np.repeat(starts - np.concatenate(([0], np.cumsum(sizes)[:-1])), sizes) + np.arange(total)
                scores = scored / (np.maximum(part.norms[rows], 1e-12) * qnorm)
            else:
                rows = np.arange(part.rows)
                scores = _score(part.vectors, part.norms, q, qnorm)
            keep = None
            if deleted is not None:
                keep = ~deleted[rows]
            if documents is not None:  # exclude
                hidden = np.zeros(rows.size, dtype=bool)
                if documents:
                    hidden_rows = part.rows_of(documents)
                    hidden = np.isin(rows, hidden_rows)
                keep = ~hidden if keep is None else keep & ~hidden
            if keep is not None:
                rows, scores = rows[keep], scores[keep]
            out.append((part, rows, scores))
        return out

    def search(self, vector, depth: int, documents=None, exclude: bool = False):
        """``[(chunk_id, cosine similarity)]`` best first, at most ``depth``."""
        if documents is not None and not documents and not exclude:
            return []
        q = np.asarray(vector, dtype=np.float32)
        qnorm = max(float(np.linalg.norm(q)), 1e-12)
        found = None
        hidden_rows = self.base.rows_of(documents) if self.ivf and exclude and documents else None
        if hidden_rows is not None and self.base.rows - hidden_rows.size <= DENY_EXACT_ROWS:
            found = self._left_by_deny_list(q, qnorm, depth, documents, hidden_rows)
        else:
            if self._use_graph and (documents is None or exclude):
                found = self._graph_candidates(q, qnorm, depth, documents, exclude, hidden_rows)
            if found is None:
                found = self._candidates(q, qnorm, depth, documents, exclude)
            if self.ivf and documents is not None and exclude and sum(r.size for _, r, _ in found) < depth:
                # Too few left after the deny-list: every row it leaves, scored exactly.
                found = self._left_by_deny_list(q, qnorm, depth, documents,
                                                _NO_ROWS if hidden_rows is None else hidden_rows)
        if not found:
            return []
        which = np.concatenate([np.full(r.size, i, dtype=np.int64) for i, (_, r, _) in enumerate(found)])
        rows = np.concatenate([r for _, r, _ in found])
        scores = np.concatenate([s for _, _, s in found]).astype(np.float32, copy=False)
        if not scores.size:
            return []
        top = _best_first(scores, depth, rows, which)  # equal scores: base rows, then the delta's
        ids = [None] * top.size
        for i, (part, _, _) in enumerate(found):
            at = np.flatnonzero(which[top] == i)
            if at.size:
                for j, cid in zip(at.tolist(), part.chunk_ids_at(rows[top[at]])):
                    ids[j] = cid
        return list(zip(ids, scores[top].astype(float).tolist()))


def _best_first(scores: np.ndarray, depth: int, *ties: np.ndarray) -> np.ndarray:
    """Positions of the ``depth`` best scores, best first, equal scores ordered by ``ties``
    (the last the primary key, as in ``np.lexsort``; by position when none is given).

    Every row tied with the k-th is considered, so which of equal rows make the cut does not
    depend on the depth: a shallower search is always a prefix of a deeper one (paging)."""
    n = scores.size
    k = min(depth, n)
    if k < n:
        kth = scores[np.argpartition(-scores, k - 1)[k - 1]]
        top = np.flatnonzero(scores >= kth)
    else:
        top = np.arange(n)
    keys = tuple(t[top] for t in ties) or (top,)
    return top[np.lexsort(keys + (-scores[top],))][:k]


def _unit(matrix: np.ndarray) -> np.ndarray:
    return matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)


def _assign(unit: np.ndarray, centroids: np.ndarray, block: int = 16384) -> np.ndarray:
    out = np.empty(unit.shape[0], dtype=np.int64)
    for i in range(0, unit.shape[0], block):
        out[i : i + block] = np.argmax(unit[i : i + block] @ centroids.T, axis=1)
    return out


def train_lists(matrix: np.ndarray, nlist: int, seed: int = 0) -> np.ndarray:
    """Spherical k-means on a sample of ``matrix``: ``nlist`` unit-length centroids."""
    rng = np.random.default_rng(seed)
    n = matrix.shape[0]
    take = min(n, nlist * KMEANS_SAMPLE_PER_LIST)
    sample = _unit(matrix[np.sort(rng.choice(n, take, replace=False))].astype(np.float32))
    centroids = sample[rng.choice(take, nlist, replace=False)].copy()
    for _ in range(KMEANS_ITERATIONS):
        assign = _assign(sample, centroids)
        order = np.argsort(assign, kind="stable")
        counts = np.bincount(assign, minlength=nlist)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        filled = counts > 0
        sums = np.add.reduceat(sample[order], starts[filled], axis=0)
        centroids[filled] = _unit(sums)
        empty = np.flatnonzero(~filled)
        if empty.size:  # an empty list restarts at a random sample vector
            centroids[empty] = sample[rng.choice(take, empty.size, replace=False)]
    return centroids.astype(np.float32)


def write_base_index(path: Path, version: int, ids, docs, matrix: np.ndarray, *,
                     centroids: np.ndarray | None = None, trained_rows: int | None = None,
                     graph_index: bool = True) -> dict:
    """Write the whole index file for ``version`` from every row; returns its header.
    Above IVF_MIN_ROWS: the inverted file's lists and (``graph_index``, usearch installed)
    the HNSW graph over the same rows."""
    matrix = np.ascontiguousarray(matrix, dtype=np.float32)
    n = matrix.shape[0]
    ids = np.asarray(ids, dtype=object)
    norms = np.linalg.norm(matrix, axis=1).astype(np.float32)
    ordered = None
    header = {"kind": "base", "lance_version": int(version), "rows": n,
              "dims": int(matrix.shape[1]) if matrix.ndim == 2 else 0}
    arrays = {}
    if n > IVF_MIN_ROWS:
        nlist = max(2, int(IVF_LIST_FACTOR * n ** 0.5))
        if centroids is None or centroids.shape[1] != matrix.shape[1]:
            centroids, trained_rows = train_lists(matrix, nlist), n
        assign = _assign(matrix / np.maximum(norms, 1e-12)[:, None], centroids)
        order = np.argsort(assign, kind="stable")
        offsets = np.searchsorted(assign[order], np.arange(centroids.shape[0] + 1)).astype(np.int64)
        arrays["centroids"] = centroids
        arrays["offsets"] = offsets
        header["trained_rows"] = int(trained_rows or n)
        ordered = matrix[order]
        graph = build_graph(ordered, norms[order]) if graph_index else None
        if graph is not None:
            header["graph"] = graph.pop("meta")
            arrays.update(graph)
    else:
        order = np.arange(n)
    names, codes = np.unique(np.asarray(docs, dtype=object), return_inverse=True) if n else (
        np.zeros(0, dtype=object), np.zeros(0, dtype=np.int64))
    id_blob, id_off = _blob(ids[order].tolist())
    doc_blob, _ = _blob(names.tolist())
    arrays.update(vectors=matrix[order] if ordered is None else ordered, norms=norms[order],
                  docs=codes.reshape(-1)[order].astype(np.int32), id_blob=id_blob, id_off=id_off,
                  doc_blob=doc_blob)
    _write_file(path, header, arrays)
    return header


def write_delta_index(path: Path, version: int, base_name: str, deleted: np.ndarray, ids, docs,
                      matrix: np.ndarray) -> None:
    """Write a delta for ``version``: base rows ``deleted``, and the rows added since the base."""
    matrix = np.ascontiguousarray(matrix, dtype=np.float32).reshape(len(ids), -1)
    names, codes = np.unique(np.asarray(docs, dtype=object), return_inverse=True) if len(ids) else (
        np.zeros(0, dtype=object), np.zeros(0, dtype=np.int64))
    id_blob, id_off = _blob(list(ids))
    doc_blob, _ = _blob(names.tolist())
    _write_file(path, {"kind": "delta", "lance_version": int(version), "base": base_name,
                       "rows": len(ids)},
                {"deleted": np.asarray(sorted(set(int(d) for d in deleted)), dtype=np.int64),
                 "vectors": matrix, "norms": np.linalg.norm(matrix, axis=1).astype(np.float32),
                 "docs": codes.reshape(-1).astype(np.int32), "id_blob": id_blob, "id_off": id_off,
                 "doc_blob": doc_blob})


def build_index_from_table(lance_dir: Path, table, version: int, *, centroids=None,
                           trained_rows=None) -> str:
    """Write the base index file for the table at ``version`` (every row read once)."""
    data = table.to_arrow().select(["chunk_id", "document_id", "vector"])
    vectors = data.column("vector").combine_chunks()
    width = vectors.type.list_size
    matrix = vectors.values.to_numpy(zero_copy_only=False).reshape(-1, width)
    name = index_file_name(version)
    write_base_index(Path(lance_dir) / name, version, data.column("chunk_id").to_pylist(),
                     data.column("document_id").to_pylist(), matrix, centroids=centroids,
                     trained_rows=trained_rows)
    return name


def build_index(lance_dir: Path, version: int) -> str:
    """Write the index file for an existing table version (collections ingested before the
    file existed; benchmarks). The manifest must still name it before readers use it."""
    table = open_table(Path(lance_dir), version)
    if table is None:
        raise FileNotFoundError("no vector table")
    return build_index_from_table(lance_dir, table, version)
