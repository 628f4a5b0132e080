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
# Rebuild the index when this share of rows is not covered by it (they are scanned exactly).
ANN_STALE_FRACTION = 0.2
# Query side: at or below this many vectors, search exactly in numpy over the vectors held in
# memory (read once per collection version) instead of asking LanceDB (benchmarks/dense.py:
# 0.2 ms against 4 ms at 10k; adr/0025-dense-exact-search.md).
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


class VectorWriter:
    """Buffers one ingest run's vector changes and applies them at commit."""

    def __init__(self, lance_dir: Path, dimensions: int, published_version: str | None,
                 ann_threshold: int = ANN_THRESHOLD):
        import lancedb

        self.dimensions = dimensions
        self.ann_threshold = ann_threshold
        self.ann_index: str | None = None
        self.db = lancedb.connect(str(lance_dir))
        self.table = None
        self.by_document: dict[str, set[str]] = {}
        self.ids: set[str] = set()
        if TABLE in self.db.list_tables().tables:
            self.table = self.db.open_table(TABLE)
            if published_version is not None and self.table.version != int(published_version):
                # A run that died after writing vectors but before publishing: roll back.
                self.table.restore(int(published_version))
            current = self.table.to_arrow().select(["chunk_id", "document_id"]).to_pydict()
            for cid, did in zip(current["chunk_id"], current["document_id"]):
                self.ids.add(cid)
                self.by_document.setdefault(did, set()).add(cid)
        self.to_delete: set[str] = set()
        self.to_add: list[tuple[str, str, np.ndarray]] = []

    def existing_ids(self, chunk_ids) -> set[str]:
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
        self.by_document[document_id] = (old & keep) | {cid for cid, _ in new_rows}
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
        from lancedb.index import IvfHnswSq

        rows = self.table.count_rows()
        indices = self.table.list_indices()
        if rows < self.ann_threshold:
            self.ann_index = None
            if indices:
                self.table.drop_index(indices[0].name)
            return
        if indices:
            stats = self.table.index_stats(indices[0].name)
            if stats is not None and stats.num_unindexed_rows <= ANN_STALE_FRACTION * rows:
                self.ann_index = ANN_INDEX
                return
        self.table.create_index("vector", config=IvfHnswSq(distance_type="cosine"), replace=True)
        self.ann_index = ANN_INDEX
