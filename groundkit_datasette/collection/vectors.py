"""Chunk vectors in LanceDB, keyed by ``chunk_id``.

The SQLite manifest names the table version it goes with (``lance_version``);
readers check that version out, so vectors written by an unfinished ingest
are never seen.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow as pa

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


def _schema(dimensions: int) -> pa.Schema:
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
    larger ones through LanceDB's ANN index with a single call into its event loop. Either
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
        scores = (matrix @ q) / (self._norms * max(float(np.linalg.norm(q)), 1e-12))
        rows = None
        if documents is not None:
            wanted = np.zeros(len(self._doc_code), dtype=bool)
            known = [self._doc_code[d] for d in documents if d in self._doc_code]
            wanted[known] = True
            keep = wanted[self._codes]
            rows = np.flatnonzero(~keep if exclude else keep)
            scores = scores[rows]
        n = scores.size
        if not n:
            return []
        k = min(depth, n)
        if k < n:
            # Every row tied with the k-th too, so that which of equal rows make the cut does not
            # depend on k: a shallower search is always a prefix of a deeper one (paging).
            kth = scores[np.argpartition(-scores, k - 1)[k - 1]]
            top = np.flatnonzero(scores >= kth)
        else:
            top = np.arange(n)
        # Best first; equal scores in table order, so the answer is the same every time.
        top = top[np.lexsort((top, -scores[top]))][:k]
        positions = rows[top] if rows is not None else top
        return list(zip(self._ids[positions].tolist(), scores[top].astype(float).tolist()))

    # -- ANN ------------------------------------------------------------------

    def _ann(self, vector, depth, where):
        q = np.asarray(vector, dtype=np.float32)
        inner = getattr(self.table, "_table", None)
        if inner is None:  # a LanceDB without the async table underneath: its sync builder
            query = self.table.search(q, vector_column_name="vector")
            query = query.distance_type("cosine").limit(depth).select(["chunk_id", "_distance"])
            if self.ann:
                query = query.ef(max(ANN_EF, depth * ANN_REFINE)).refine_factor(ANN_REFINE)
            if where is not None:
                query = query.where(where, prefilter=True)
            result = query.to_arrow()
        else:
            from lancedb.background_loop import LOOP

            async def run():
                query = (inner.query().nearest_to(q).column("vector").distance_type("cosine")
                         .limit(depth).select(["chunk_id", "_distance"]))
                if self.ann:
                    # LanceDB needs ef >= the candidates it refines (depth x refine factor).
                    query = query.ef(max(ANN_EF, depth * ANN_REFINE)).refine_factor(ANN_REFINE)
                if where is not None:
                    query = query.where(where)  # a prefilter (the async API's default)
                return await query.to_arrow()

            # One hop into LanceDB's event loop per query (the sync builder makes six).
            result = LOOP.run(run())
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
    of the id columns each time (adr/0031-edit-one-file-edit-cost.md); past :data:`LAZY_ID_QUERIES` such reads, or when
    :meth:`load_all` is called, every id is read at once."""

    LAZY_ID_QUERIES = 16

    def __init__(self, lance_dir: Path, dimensions: int, published_version: str | None,
                 ann_threshold: int = ANN_THRESHOLD, trained_rows: int | None = None):
        import lancedb

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
        dict.__setitem__(self.by_document, document_id, (old & keep) | {cid for cid, _ in new_rows})
        if len(self.to_add) >= ADD_BATCH:
            self._flush_adds()

    def _ensure_table(self):
        if self.table is None:
            self.table = self.db.create_table(TABLE, schema=_schema(self.dimensions))

    def _flush_adds(self):
        if not self.to_add:
            return
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
        for i in range(0, len(doomed), 1000):
            quoted = ",".join("'" + c.replace("'", "''") + "'" for c in doomed[i : i + 1000])
            self.table.delete(f"chunk_id IN ({quoted})")
        self.to_delete = set()
        self._flush_adds()
        self._maybe_index()
        return self.table.version

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
