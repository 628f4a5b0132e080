"""The query side of the vector table (adr/0026, adr/0056): open it read-only at the
published version and search it, exactly in numpy up to EXACT_MAX_ROWS vectors, through
LanceDB's own ANN index above. Used when the manifest names no index file
(indexing/vector_index.py answers when it does); ``dots`` and ``best_first`` are shared with it,
so both paths score and order ties alike.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

TABLE = "chunks"
# Query-time settings measured to give recall@10 >= 0.95 (benchmarks/dense.py).
ANN_EF = 150
ANN_REFINE = 2
# At or below this many vectors, search exactly in numpy over the vectors held in memory
# (read once per collection version) instead of asking LanceDB (benchmarks/dense.py: 0.2 ms
# against 4 ms at 10k; adr/0026-dense-exact-search.md).
EXACT_MAX_ROWS = 50_000


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
        top = best_first(scores, depth)  # equal scores in table order
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


def best_first(scores: np.ndarray, depth: int, *ties: np.ndarray) -> np.ndarray:
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
