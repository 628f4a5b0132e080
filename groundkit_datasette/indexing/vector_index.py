"""The memory-mapped vector index file (adr/0033).

Kept beside LanceDB's own index because it buys dense p50 0.62 against 6.75 ms at 200k (recall
0.994 against 0.9995) and a cold start without ``import lancedb`` (1.06 against 15.9 s here),
measured in one run (adr/0056).

A copy of the vectors derived from the LanceDB table at one version, laid out so that a
query process opens it with one ``mmap`` (no lancedb import, nothing read up front) and
searches it in numpy: exactly (flat) up to IVF_MIN_ROWS vectors, through an inverted file
(k-means lists, each list's vectors stored together, NPROBE lists read per query) above.
It lives in ``<name>.lance/_groundkit/``, is named by the table version it copies, is
written (temporary name, fsync, rename) before the SQLite file that names it in its
manifest (``vector_index``) is published, and is never written by a read. A small ingest
writes a delta file (the rows added since the base file, and the base rows deleted) that
names its base, instead of copying the whole table again (adr/0033-mmap-vector-index.md).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from .vector_search import EXACT_MAX_ROWS, best_first, dots, open_table

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


class IndexPart:
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
            self.delta = IndexPart(f)
            deleted = f["deleted"]
            self.base = IndexPart(base)
            if deleted.size:
                self.deleted = np.zeros(self.base.rows, dtype=bool)
                self.deleted[deleted] = True
            self.files = (base, f)
        else:
            self.base = IndexPart(f)
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
        top = best_first(scores, depth, rows, which)  # equal scores: base rows, then the delta's
        ids = [None] * top.size
        for i, (part, _, _) in enumerate(found):
            at = np.flatnonzero(which[top] == i)
            if at.size:
                for j, cid in zip(at.tolist(), part.chunk_ids_at(rows[top[at]])):
                    ids[j] = cid
        return list(zip(ids, scores[top].astype(float).tolist()))


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
