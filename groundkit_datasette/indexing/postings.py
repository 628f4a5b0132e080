"""The BM25 postings as ingest writes them: every (term, chunk) weight precomputed from the
term rows (indexing/terms.py), built whole or updated term by term after a run (adr/0003,
adr/0030-postings-and-index-upkeep.md).

Scoring a query over these postings is ``retrieval/bm25.py``.
"""

import json
import sqlite3

import numpy as np

from .schema import read_manifest

K1 = 1.5
B = 0.5  # chunks are length-capped; see adr/0018-bm25-over-chunks.md
# A reserved postings row: every chunk row id in content-hash order, the BM25 tie-breaker.
TIE_ORDER_ID = -1
# A reserved postings row: ``documents[row id]`` = the document ordinal of each chunk row
# (-1 for a gap), so a reader's IDF can be recounted in documents. Older files lack it.
DOCUMENT_MAP_ID = -2
# What the stored weights were computed with; ingest records it in the manifest and
# rebuilds the postings of a collection whose record differs.
IDF_UNIT = "document"



def settings() -> dict:
    """The scoring settings the stored weights depend on (the manifest's ``bm25`` record)."""
    return {"k1": K1, "b": B, "idf": IDF_UNIT}


def idf_of(n, df):
    """BM25's IDF (the Lucene form, never negative) of a term in ``df`` of ``n`` units.

    The units are documents (see adr/0018-bm25-over-chunks.md): a term that a long
    document repeats in each of its chunks is not thereby more common.
    """
    return np.log1p((n - df + 0.5) / (df + 0.5))



# (term, chunk) pairs decoded at once while postings are built or updated: the memory
# of a rebuild is bounded by this, not by the corpus (adr/0030-postings-and-index-upkeep.md).
PAIRS_PER_PASS = 3_000_000
# Chunk rows fetched from SQLite at a time; postings weighed at a time.
_FETCH_ROWS = 4096
_WEIGH_SLICE = 262_144
# The statistics the stored weights were computed with (document count, average chunk
# length) are kept while the collection's own stay within this relative distance of them;
# past it every weight is recomputed. See adr/0030-postings-and-index-upkeep.md.
STATS_DRIFT = 0.01


def term_weights(idf, freqs, dl, avgdl: float, k1: float = K1, b: float = B) -> np.ndarray:
    """BM25 weights (float32) of postings, element by element: the one formula every path uses,
    so a weight does not depend on which pass computed it."""
    return (idf * freqs * (k1 + 1) / (freqs + k1 * (1 - b + b * dl / avgdl))).astype(np.float32)


class _Chunks:
    """Row ids, lengths and document ordinals of every chunk with terms, in row order.

    Documents are numbered by first appearance in row order; ``monotone`` says whether each
    document's chunks are adjacent (ingest writes them so; hand edits may not)."""

    def __init__(self, ids: np.ndarray, lengths: np.ndarray, docs: np.ndarray, documents: int):
        self.ids, self.docs, self.documents = ids, docs, documents
        self.lengths = lengths.astype(np.float64)
        self.monotone = bool(np.all(np.diff(docs) >= 0))
        top = int(ids[-1]) + 1 if ids.size else 0
        self.length_of = np.zeros(top, dtype=np.float64)
        self.length_of[ids] = self.lengths
        self.doc_of = np.full(top, -1, dtype=np.int64)
        self.doc_of[ids] = docs

    @classmethod
    def read(cls, conn: sqlite3.Connection) -> "_Chunks":
        rows = conn.execute(
            "SELECT t.id, t.length, c.document_id FROM bm25_chunk_terms t "
            "JOIN chunks c ON c.id = t.id ORDER BY t.id").fetchall()
        ordinal: dict[str, int] = {}
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        lengths = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
        docs = np.fromiter((ordinal.setdefault(r[2], len(ordinal)) for r in rows), dtype=np.int64,
                           count=len(rows))
        return cls(ids, lengths, docs, len(ordinal))

    @classmethod
    def after_run(cls, conn: sqlite3.Connection, first_new_row: int, gone: np.ndarray) -> "_Chunks | None":
        """Row ids and document ordinals as :meth:`read` gives them, from the published document
        map, the deleted rows ``gone`` and this run's new rows, without reading the other chunk
        rows (lengths are read on demand, :meth:`lengths_of`). A run deletes every row of a document
        it rewrites, so the surviving documents keep their order and the new rows' documents
        come after them. None when the map does not fit the table (the caller reads it all)."""
        row = conn.execute("SELECT chunk_ids FROM bm25_postings WHERE term_id = ?",
                           (DOCUMENT_MAP_ID,)).fetchone()
        if row is None:
            return None
        published = np.frombuffer(row[0], dtype=np.int32)
        old = np.flatnonzero(published >= 0)
        old = old[old < first_new_row]
        if gone.size:
            old = old[~np.isin(old, gone)]
        new = conn.execute("SELECT t.id, t.length, c.document_id FROM bm25_chunk_terms t "
                           "JOIN chunks c ON c.id = t.id WHERE t.id >= ? ORDER BY t.id",
                           (first_new_row,)).fetchall()
        if old.size + len(new) != conn.execute("SELECT count(*) FROM chunks").fetchone()[0]:
            return None
        _, docs_old = np.unique(published[old], return_inverse=True)
        offset = int(docs_old.max()) + 1 if docs_old.size else 0
        ordinal: dict[str, int] = {}
        new_docs = [ordinal.setdefault(did, offset + len(ordinal)) for _i, _l, did in new]
        if ordinal:  # a new row's document must have no older rows left
            marks = ",".join("?" * len(ordinal))
            if conn.execute(f"SELECT 1 FROM chunks WHERE id < ? AND document_id IN ({marks}) LIMIT 1",
                            (first_new_row, *ordinal)).fetchone():
                return None
        ids = np.concatenate([old.astype(np.int64), np.array([r[0] for r in new], dtype=np.int64)])
        docs = np.concatenate([docs_old.astype(np.int64).ravel(), np.array(new_docs, dtype=np.int64)])
        lengths = np.zeros(ids.size, dtype=np.int64)  # known for the new rows only
        lengths[old.size:] = [r[1] for r in new]
        out = cls(ids, lengths, docs, offset + len(ordinal))
        # Whether each document that lost rows lost all of them (as a run rewrites documents):
        # then a term's df moves only by the documents of the deleted and the added rows.
        out.gone_docs = published[gone[gone < published.size]].astype(np.int64)
        out.whole_documents = bool((gone < published.size).all() and (out.gone_docs >= 0).all()
                                   and not np.isin(out.gone_docs, published[old]).any())
        out._conn = conn
        out._known = np.zeros(out.length_of.size, dtype=bool)
        out._known[ids[old.size:]] = True
        return out

    def lengths_of(self, ids: np.ndarray) -> np.ndarray:
        """The token counts of the chunk rows ``ids`` (read from the table when not yet known)."""
        known = getattr(self, "_known", None)
        if known is not None:
            todo = np.unique(ids[~known[ids]])
            if todo.size > 50_000:  # cheaper in one sorted scan
                rows = self._conn.execute("SELECT id, length FROM bm25_chunk_terms").fetchall()
                a = np.array(rows, dtype=np.int64).reshape(-1, 2)
                a = a[a[:, 0] < self.length_of.size]
                self.length_of[a[:, 0]] = a[:, 1]
                self._known[:] = True
            else:
                for g in range(0, todo.size, 900):
                    part = todo[g : g + 900].tolist()
                    for i, n in self._conn.execute(
                            "SELECT id, length FROM bm25_chunk_terms WHERE id IN "
                            f"({','.join('?' * len(part))})", part):
                        self.length_of[i] = n
                known[todo] = True
        return self.length_of[ids]

    def stats(self) -> dict:
        """The collection's own statistics, as the weights use them."""
        return {"documents": self.documents, "avgdl": float(max(self.lengths.mean(), 1e-9))}


def _term_rows(conn: sqlite3.Connection, where: str = "", params=(), order: str = "t.id"):
    """Batches of ``(row ids, terms per row, term ids, freqs)`` of chunk term rows."""
    cur = conn.execute(
        "SELECT t.id, t.term_ids, t.term_freqs FROM bm25_chunk_terms t JOIN chunks c ON c.id = t.id "
        f"{where} ORDER BY {order}", params)
    while True:
        rows = cur.fetchmany(_FETCH_ROWS)
        if not rows:
            return
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        per_row = np.fromiter((len(r[1]) // 4 for r in rows), dtype=np.int64, count=len(rows))
        tids = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.int32)
        freqs = np.frombuffer(b"".join(r[2] for r in rows), dtype=np.int32)
        yield ids, per_row, tids, freqs


def _vocab_size(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT coalesce(max(term_id), -1) + 1 FROM bm25_vocab").fetchone()[0])


def _grow(a: np.ndarray, size: int, fill=0) -> np.ndarray:
    if a.size >= size:
        return a
    out = np.full(size, fill, dtype=a.dtype)
    out[: a.size] = a
    return out


def _document_frequencies(conn, chunks: _Chunks, vocab_size: int):
    """``(df, postings per term)``: documents and chunks holding each term, in one pass."""
    df = np.zeros(vocab_size, dtype=np.int64)
    cf = np.zeros(vocab_size, dtype=np.int64)
    last = np.full(vocab_size, -1, dtype=np.int64)  # the last document group counted per term
    group_of = None
    if not chunks.monotone:
        # Visit rows document by document, numbering the documents as they come.
        order = "c.document_id, t.id"
    else:
        order = "t.id"
    group = -1
    previous_doc = None
    for ids, per_row, tids, _freqs in _term_rows(conn, order=order):
        if tids.size and int(tids.max()) >= df.size:
            size = int(tids.max()) + 1
            df, cf, last = _grow(df, size), _grow(cf, size), _grow(last, size, -1)
        docs = chunks.doc_of[ids]
        if chunks.monotone:
            group_of = docs
        else:
            change = np.ones(docs.size, dtype=bool)
            change[1:] = docs[1:] != docs[:-1]
            if docs.size and previous_doc is not None and docs[0] == previous_doc:
                change[0] = False
            group_of = group + np.cumsum(change)
            group = int(group_of[-1]) if group_of.size else group
            previous_doc = int(docs[-1]) if docs.size else previous_doc
        cf += np.bincount(tids, minlength=cf.size)
        if not tids.size:
            continue
        owner = np.repeat(group_of, per_row)
        o = np.argsort(tids, kind="stable")  # groups rise within each term
        st, sg = tids[o], owner[o]
        same_term = st[1:] == st[:-1]
        new = np.ones(st.size, dtype=bool)
        new[1:] = ~same_term | (sg[1:] != sg[:-1])
        start = np.ones(st.size, dtype=bool)
        start[1:] = ~same_term
        new[start] = sg[start] != last[st[start]]  # the same document continued from the last batch
        df += np.bincount(st[new], minlength=df.size)
        end = np.ones(st.size, dtype=bool)
        end[:-1] = ~same_term
        last[st[end]] = sg[end]
    return df, cf


def _ranges(cf: np.ndarray, budget: int):
    """Term-id ranges ``[lo, hi)`` holding at most ``budget`` postings each (a bigger term alone)."""
    out, lo, acc = [], 0, 0
    for t in np.flatnonzero(cf):
        n = int(cf[t])
        if acc and acc + n > budget:
            out.append((lo, int(t)))
            lo, acc = int(t), 0
        acc += n
    if acc:
        out.append((lo, cf.size))
    return out


def _write_rows(conn, terms: np.ndarray, owner: np.ndarray, weights: np.ndarray) -> None:
    """Replace the postings of the (sorted, grouped) ``terms`` with ``owner``/``weights`` slices."""
    if not terms.size:
        return
    starts = np.flatnonzero(np.r_[True, terms[1:] != terms[:-1]])
    ends = np.append(starts[1:], terms.size)
    conn.executemany(
        "INSERT OR REPLACE INTO bm25_postings(term_id, chunk_ids, weights) VALUES (?, ?, ?)",
        ((int(terms[s]), owner[s:e].tobytes(), weights[s:e].tobytes()) for s, e in zip(starts, ends)),
    )


def _tie_order_after_run(conn, gone: np.ndarray, first_new_row: int) -> np.ndarray | None:
    """The published tie order without the deleted rows, this run's rows placed in it by
    binary search (a few hash lookups each); None when it cannot be trusted."""
    import bisect

    row = conn.execute("SELECT chunk_ids FROM bm25_postings WHERE term_id = ?",
                       (TIE_ORDER_ID,)).fetchone()
    if row is None:
        return None
    order = np.frombuffer(row[0], dtype=np.int32)
    order = order[~np.isin(order, gone)]
    new = conn.execute("SELECT content_hash, id FROM chunks WHERE id >= ? ORDER BY content_hash, id",
                       (first_new_row,)).fetchall()
    hashes: dict[int, str] = {}

    def key(i):
        cid = int(order[i])
        h = hashes.get(cid)
        if h is None:
            found = conn.execute("SELECT content_hash FROM chunks WHERE id = ?", (cid,)).fetchone()
            h = hashes[cid] = found[0] if found else ""
        return h, cid

    at = [bisect.bisect_left(range(order.size), (h, cid), key=key) for h, cid in new]
    out = np.insert(order, at, np.array([cid for _h, cid in new], dtype=np.int32))
    if out.size != conn.execute("SELECT count(*) FROM chunks").fetchone()[0]:
        return None
    return out


def _write_orders(conn, chunks: _Chunks, tie_order=None) -> None:
    """The reserved rows: tie order (content-hash order) and the document map."""
    if tie_order is None:
        tie_order = [r[0] for r in conn.execute("SELECT id FROM chunks ORDER BY content_hash, id")]
    conn.execute(
        "INSERT OR REPLACE INTO bm25_postings(term_id, chunk_ids, weights) VALUES (?, ?, x'')",
        (TIE_ORDER_ID, np.asarray(tie_order, dtype=np.int32).tobytes()),
    )
    documents = np.full(int(chunks.ids[-1]) + 1, -1, dtype=np.int32)
    documents[chunks.ids] = chunks.docs
    conn.execute(
        "INSERT OR REPLACE INTO bm25_postings(term_id, chunk_ids, weights) VALUES (?, ?, x'')",
        (DOCUMENT_MAP_ID, documents.tobytes()),
    )


def _set_doc_freqs(conn, terms: np.ndarray, df: np.ndarray) -> None:
    conn.executemany("UPDATE bm25_vocab SET doc_freq = ? WHERE term_id = ?",
                     ((int(n), int(t)) for t, n in zip(terms, df)))


def rebuild_postings(conn: sqlite3.Connection, k1: float = K1, b: float = B,
                     stats: dict | None = None, totals: dict | None = None) -> dict:
    """Recompute every posting weight from ``bm25_chunk_terms``, in bounded memory.

    The chunk term rows are read once for document frequencies, then once per range of
    term ids holding at most :data:`PAIRS_PER_PASS` postings. ``stats`` (``documents``,
    ``avgdl``) are the statistics to weight with; by default the collection's own.
    Returns the statistics used (the manifest's ``bm25_stats``).
    """
    chunks = _Chunks.read(conn)
    if totals is not None:  # the token count of every chunk row (the manifest's bm25_length)
        totals["length"] = int(chunks.lengths.sum())
    conn.execute("DELETE FROM bm25_postings")
    if not chunks.ids.size:
        conn.execute("DELETE FROM bm25_vocab")
        return chunks.stats() if stats is None else stats
    used = chunks.stats() if stats is None else stats
    n, avgdl = used["documents"], used["avgdl"]
    df, cf = _document_frequencies(conn, chunks, _vocab_size(conn))
    idf = idf_of(n, df)
    for lo, hi in _ranges(cf, PAIRS_PER_PASS):
        parts = []
        for ids, per_row, tids, freqs in _term_rows(conn):
            sel = np.flatnonzero((tids >= lo) & (tids < hi))
            if sel.size:
                parts.append((tids[sel], np.repeat(ids.astype(np.int32), per_row)[sel], freqs[sel]))
        if not parts:
            continue
        tids, owner, freqs = (np.concatenate(p) for p in zip(*parts))
        del parts
        order = np.argsort(tids, kind="stable")  # row order within each term
        tids, owner, freqs = tids[order], owner[order], freqs[order]
        del order
        weights = np.empty(tids.size, dtype=np.float32)
        for s0 in range(0, tids.size, _WEIGH_SLICE):  # element-wise: slices change no bit
            sl = slice(s0, s0 + _WEIGH_SLICE)
            weights[sl] = term_weights(idf[tids[sl]], freqs[sl].astype(np.float64),
                                       chunks.length_of[owner[sl]], avgdl, k1, b)
        _write_rows(conn, tids, owner, weights)
        del tids, owner, freqs, weights
    _write_orders(conn, chunks)
    present = np.flatnonzero(df)
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS _df(term_id INTEGER PRIMARY KEY, n INTEGER)")
    conn.execute("DELETE FROM _df")
    conn.executemany("INSERT INTO _df VALUES (?, ?)", ((int(t), int(df[t])) for t in present))
    conn.execute("DELETE FROM bm25_vocab WHERE term_id NOT IN (SELECT term_id FROM _df)")
    conn.execute(
        "UPDATE bm25_vocab SET doc_freq = (SELECT n FROM _df WHERE _df.term_id = bm25_vocab.term_id)"
    )
    conn.execute("DROP TABLE _df")
    return used


def drifted(stats: dict | None, own: dict) -> bool:
    """Whether the collection's own statistics moved past :data:`STATS_DRIFT` from ``stats``."""
    if not stats or not stats.get("documents") or not stats.get("avgdl"):
        return True
    return (abs(own["documents"] - stats["documents"]) > STATS_DRIFT * stats["documents"]
            or abs(own["avgdl"] - stats["avgdl"]) > STATS_DRIFT * stats["avgdl"])


def _frequencies_from_weights(weights, idf, dl, avgdl, k1, b):
    """Term frequencies that reproduce stored ``weights`` (the formula solved for tf, rounded),
    and a mask of those that reproduce them exactly."""
    w = weights.astype(np.float64)
    norm = k1 * (1 - b + b * dl / avgdl)
    with np.errstate(divide="ignore", invalid="ignore"):
        tf = np.rint(w * norm / (idf * (k1 + 1) - w))
    tf = np.where(np.isfinite(tf) & (tf >= 1), tf, 1.0)
    exact = term_weights(idf, tf, dl, avgdl, k1, b) == weights
    return tf, exact


def update_postings(conn: sqlite3.Connection, removed: dict[int, bytes], first_new_row: int,
                    stats: dict, k1: float = K1, b: float = B, totals: dict | None = None) -> dict | None:
    """Bring the postings up to date after a run that removed the chunk rows ``removed``
    (row id -> its term ids) and added rows from ``first_new_row`` on, rewriting only the
    terms those rows hold, with the statistics ``stats`` the stored weights were computed with.

    ``totals``: ``{"length": the token count of every chunk row now}`` when the caller knows it
    (the manifest keeps it); otherwise it is summed here. It is updated in place.
    The result is byte for byte what :func:`rebuild_postings` gives with the same ``stats``.
    Returns the statistics used, or None when the collection's own have drifted past
    :data:`STATS_DRIFT` (the caller then rebuilds).
    """
    totals = {} if totals is None else totals
    if not removed and conn.execute(
            "SELECT 1 FROM bm25_chunk_terms WHERE id >= ? LIMIT 1", (first_new_row,)).fetchone() is None:
        return stats  # no chunk row changed: nor did any posting
    gone = np.unique(np.fromiter(removed, dtype=np.int64, count=len(removed)))
    chunks = _Chunks.after_run(conn, first_new_row, gone)
    if chunks is None:  # no usable document map: every row read
        chunks = _Chunks.read(conn)
        totals["length"] = int(chunks.lengths.sum())
    if totals.get("length") is None:
        totals["length"] = int(conn.execute("SELECT coalesce(sum(length), 0) FROM bm25_chunk_terms").fetchone()[0])
    own = {"documents": chunks.documents, "avgdl": float(max(totals["length"] / max(chunks.ids.size, 1), 1e-9))}
    if not chunks.ids.size or drifted(stats, own):
        return None
    n, avgdl = stats["documents"], stats["avgdl"]
    touched = [np.frombuffer(blob, dtype=np.int32) for blob in removed.values()]
    added = list(_term_rows(conn, "WHERE t.id >= ?", (first_new_row,)))
    touched += [tids for _ids, _per, tids, _f in added]
    touched = np.unique(np.concatenate(touched)) if touched else np.empty(0, np.int32)
    if touched.size:
        # The rows this run added: (term, row id, tf) of the touched terms, in row order.
        if added:
            a_ids = np.concatenate([np.repeat(ids, per) for ids, per, _t, _f in added])
            a_terms = np.concatenate([t for _i, _p, t, _f in added])
            a_freqs = np.concatenate([f for _i, _p, _t, f in added]).astype(np.float64)
        else:
            a_ids, a_terms, a_freqs = (np.empty(0, np.int64), np.empty(0, np.int32),
                                       np.empty(0, np.float64))
        sizes = {}
        for g in range(0, touched.size, 900):
            part = [int(t) for t in touched[g : g + 900]]
            sizes.update(conn.execute(
                "SELECT term_id, length(chunk_ids) / 4 FROM bm25_postings WHERE term_id IN "
                f"({','.join('?' * len(part))})", part))
        cf = np.array([sizes.get(t, 0) for t in touched.tolist()], dtype=np.int64)
        if getattr(chunks, "whole_documents", False):
            # Terms whose df the run leaves as it was keep their stored weights: their lists are
            # spliced as bytes. The others are rewritten below, weights recomputed.
            same = _unchanged_df(conn, touched, removed, gone, chunks, a_ids, a_terms)
            _splice_terms(conn, touched[same], gone, a_ids, a_terms, a_freqs, chunks, n, avgdl, k1, b)
            touched, cf = touched[~same], cf[~same]
        budget = max(1, PAIRS_PER_PASS // 3)  # an update holds more per posting than a rebuild
        lo = 0
        while lo < touched.size:  # groups of terms holding at most that many old postings
            hi = lo + max(1, int(np.searchsorted(np.cumsum(cf[lo:]), budget, side="right")))
            hi = min(hi, lo + 900)  # and few enough to name in one statement
            _update_terms(conn, touched[lo:hi], gone, a_ids, a_terms, a_freqs, chunks,
                          n, avgdl, k1, b)
            lo = hi
    _write_orders(conn, chunks, _tie_order_after_run(conn, gone, first_new_row))
    return stats


def _unchanged_df(conn, terms, removed, gone, chunks, a_ids, a_terms) -> np.ndarray:
    """Which of ``terms`` keep their df: documents that lost rows lost all of them, so a term's
    df drops by the documents of the deleted rows holding it and rises by those of the added
    rows holding it (each counted once per document)."""
    def per_term(t, d):
        if not t.size:
            return np.zeros(terms.size, dtype=np.int64)
        pairs = np.unique(t.astype(np.int64) * (chunks.documents + chunks.gone_docs.max(initial=0) + 2) + d)
        counted = pairs // (chunks.documents + chunks.gone_docs.max(initial=0) + 2)
        out = np.zeros(terms.size, dtype=np.int64)
        u, k = np.unique(counted, return_counts=True)
        out[np.searchsorted(terms, u)] = k
        return out

    r_terms = [np.frombuffer(removed[int(i)], dtype=np.int32) for i in gone]
    r_docs = [np.full(t.size, d, dtype=np.int64) for t, d in zip(r_terms, chunks.gone_docs.tolist())]
    lost = per_term(np.concatenate(r_terms) if r_terms else np.empty(0, np.int32),
                    np.concatenate(r_docs) if r_docs else np.empty(0, np.int64))
    gained = per_term(a_terms, chunks.doc_of[a_ids])
    delta = gained - lost
    before = {}
    for g in range(0, terms.size, 900):
        part = [int(t) for t in terms[g : g + 900]]
        before.update(conn.execute(f"SELECT term_id, doc_freq FROM bm25_vocab WHERE term_id IN "
                                   f"({','.join('?' * len(part))}) AND doc_freq > 0", part))
    known = np.array([t in before for t in terms.tolist()], dtype=bool)
    return known & (delta == 0)


def _splice_terms(conn, terms, gone, a_ids, a_terms, a_freqs, chunks, n, avgdl, k1, b) -> None:
    """Rewrite the lists of ``terms`` (whose df is unchanged): the stored ids and weights as
    bytes, the deleted rows cut out (they lie between the lowest and highest deleted id), the
    added rows appended with weights from the same statistics."""
    if not terms.size:
        return
    sel = np.flatnonzero(np.isin(a_terms, terms))
    order = sel[np.argsort(a_terms[sel], kind="stable")]  # row order within each term
    t_add, i_add = a_terms[order], a_ids[order]
    dfs = {}
    for g in range(0, terms.size, 900):
        part = [int(t) for t in terms[g : g + 900]]
        dfs.update(conn.execute(f"SELECT term_id, doc_freq FROM bm25_vocab WHERE term_id IN "
                                f"({','.join('?' * len(part))})", part))
    df = np.array([dfs[t] for t in terms.tolist()], dtype=np.int64)
    at = np.searchsorted(terms, t_add)
    w_add = term_weights(idf_of(n, df)[at], a_freqs[order], chunks.lengths_of(i_add), avgdl, k1, b)
    ids_add = i_add.astype(np.int32)
    bounds = np.searchsorted(t_add, terms), np.searchsorted(t_add, terms, side="right")
    g_lo, g_hi = (int(gone[0]), int(gone[-1])) if gone.size else (0, -1)
    rows = []
    for g in range(0, terms.size, 900):
        part = [int(t) for t in terms[g : g + 900]]
        for t, ids_blob, w_blob in conn.execute(
                f"SELECT term_id, chunk_ids, weights FROM bm25_postings WHERE term_id IN "
                f"({','.join('?' * len(part))})", part):
            ids = np.frombuffer(ids_blob, dtype=np.int32)
            k = int(np.searchsorted(terms, t))
            s0, s1 = int(bounds[0][k]), int(bounds[1][k])
            if g_hi >= g_lo:
                lo, hi = int(np.searchsorted(ids, g_lo)), int(np.searchsorted(ids, g_hi, side="right"))
            else:
                lo = hi = ids.size
            if lo < hi:
                keep = ~np.isin(ids[lo:hi], gone)
                mid_i = ids[lo:hi][keep].tobytes()
                mid_w = np.frombuffer(w_blob, dtype=np.float32)[lo:hi][keep].tobytes()
            else:
                mid_i = mid_w = b""
            rows.append((t, ids_blob[: 4 * lo] + mid_i + ids_blob[4 * hi :] + ids_add[s0:s1].tobytes(),
                         w_blob[: 4 * lo] + mid_w + w_blob[4 * hi :] + w_add[s0:s1].tobytes()))
        if rows:
            conn.executemany("INSERT OR REPLACE INTO bm25_postings(term_id, chunk_ids, weights) "
                             "VALUES (?, ?, ?)", rows)
            rows = []


def _update_terms(conn, terms, gone, a_ids, a_terms, a_freqs, chunks, n, avgdl, k1, b) -> None:
    """Rewrite the postings of ``terms``: the old lists without the rows ``gone``, plus the added
    rows. Where a term's df is unchanged its old weights are the stored ones (same statistics,
    same tf and length); only where it changed are they recomputed, from the tf each weight
    was made with."""
    marks = ",".join("?" * len(terms))
    params = [int(t) for t in terms]
    old_df = dict(conn.execute(f"SELECT term_id, doc_freq FROM bm25_vocab WHERE term_id IN ({marks})",
                               params))
    o_terms, o_ids, o_weights = [], [], []
    for t, ids, weights in conn.execute(
            f"SELECT term_id, chunk_ids, weights FROM bm25_postings WHERE term_id IN ({marks})", params):
        ids = np.frombuffer(ids, dtype=np.int32)
        o_terms.append(np.full(ids.size, t, dtype=np.int32))
        o_ids.append(ids)
        o_weights.append(np.frombuffer(weights, dtype=np.float32))
    if o_ids:
        o_terms, o_ids, o_weights = (np.concatenate(x) for x in (o_terms, o_ids, o_weights))
        if gone.size:
            kept = ~np.isin(o_ids, gone)
            o_terms, o_ids, o_weights = o_terms[kept], o_ids[kept], o_weights[kept]
        o_ids = o_ids.astype(np.int64)
    else:
        o_terms, o_ids, o_weights = np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.float32)
    sel = np.isin(a_terms, terms)
    n_terms, n_ids, n_freqs = a_terms[sel], a_ids[sel], a_freqs[sel]
    # Old rows come first: every row this run added has a higher id than every older row.
    all_terms = np.concatenate([o_terms, n_terms])
    all_ids = np.concatenate([o_ids, n_ids])
    order = np.argsort(all_terms, kind="stable")
    all_terms, all_ids = all_terms[order], all_ids[order]
    docs = chunks.doc_of[all_ids]
    if chunks.monotone:
        first = np.ones(all_terms.size, dtype=bool)
        first[1:] = (all_terms[1:] != all_terms[:-1]) | (docs[1:] != docs[:-1])
        counted = all_terms[first]
    else:
        pairs = np.unique(all_terms.astype(np.int64) * (chunks.documents + 1) + docs)
        counted = pairs // (chunks.documents + 1)
    present, df_present = np.unique(counted, return_counts=True)
    df = np.zeros(terms.size, dtype=np.int64)
    df[np.searchsorted(terms, present)] = df_present
    df_before = np.array([old_df.get(t) or 0 for t in terms.tolist()], dtype=np.int64)
    idf_new = idf_of(n, df)
    w_old = o_weights.copy()
    redo = np.flatnonzero(np.isin(o_terms, terms[df != df_before]))
    if redo.size:
        r_terms, r_ids = o_terms[redo], o_ids[redo]
        dl = chunks.lengths_of(r_ids)
        at = np.searchsorted(terms, r_terms)
        tf, exact = _frequencies_from_weights(o_weights[redo], idf_of(n, df_before)[at], dl, avgdl, k1, b)
        if not exact.all():  # read those rows' own frequencies
            tf[~exact] = _stored_frequencies(conn, r_ids[~exact], r_terms[~exact])
        w_old[redo] = term_weights(idf_new[at], tf, dl, avgdl, k1, b)
    w_new = term_weights(idf_new[np.searchsorted(terms, n_terms)], n_freqs, chunks.lengths_of(n_ids),
                         avgdl, k1, b)
    weights = np.concatenate([w_old, w_new])[order]
    _write_rows(conn, all_terms, all_ids.astype(np.int32), weights)
    empty = [int(t) for t, d in zip(terms.tolist(), df.tolist()) if d == 0]
    if empty:
        marks = ",".join("?" * len(empty))
        conn.execute(f"DELETE FROM bm25_postings WHERE term_id IN ({marks})", empty)
        conn.execute(f"DELETE FROM bm25_vocab WHERE term_id IN ({marks})", empty)
    changed = df != df_before
    _set_doc_freqs(conn, terms[changed & (df > 0)], df[changed & (df > 0)])


def _stored_frequencies(conn, ids: np.ndarray, terms: np.ndarray) -> np.ndarray:
    out = np.empty(ids.size, dtype=np.float64)
    for i, (cid, t) in enumerate(zip(ids, terms)):
        tids, freqs = conn.execute(
            "SELECT term_ids, term_freqs FROM bm25_chunk_terms WHERE id = ?", (int(cid),)).fetchone()
        tids = np.frombuffer(tids, dtype=np.int32)
        out[i] = np.frombuffer(freqs, dtype=np.int32)[np.searchsorted(tids, t)]
    return out


def track_removed_terms(conn: sqlite3.Connection) -> None:
    """Keep, in ``temp.removed_terms``, the term row of every chunk row the run deletes (by any
    path: an update, a removed document, a cascade): :func:`keep_postings` rewrites the
    postings of just those terms and of the rows added."""
    conn.execute("CREATE TEMP TABLE removed_terms(id INTEGER PRIMARY KEY, term_ids BLOB, length INTEGER)")
    conn.execute("CREATE TEMP TRIGGER removed_terms AFTER DELETE ON main.bm25_chunk_terms BEGIN "
                 "INSERT OR REPLACE INTO removed_terms VALUES (old.id, old.term_ids, old.length); END")


def keep_postings(conn: sqlite3.Connection, first_new_row: int, rebuild: bool) -> bool:
    """Rewrite the postings of the terms a run's chunk rows touched (those from
    ``first_new_row`` on, and those :func:`track_removed_terms` recorded), or all of them when
    ``rebuild`` (new settings, a re-chunk), the statistics drifted or the file has none
    recorded (adr/0030-postings-and-index-upkeep.md). True when all were rebuilt."""
    manifest = read_manifest(conn)
    recorded = manifest.get("bm25_stats")
    used = None
    # The token count of every chunk row (for avgdl), kept in the manifest so that a run
    # need not read every row: the recorded one, less the rows deleted, plus those added.
    totals = {}
    if recorded and not rebuild:
        removed = dict(conn.execute("SELECT id, term_ids FROM temp.removed_terms"))
        if manifest.get("bm25_length"):
            totals["length"] = (
                int(manifest["bm25_length"])
                - conn.execute("SELECT coalesce(sum(length), 0) FROM temp.removed_terms").fetchone()[0]
                + conn.execute("SELECT coalesce(sum(length), 0) FROM bm25_chunk_terms WHERE id >= ?",
                               (first_new_row,)).fetchone()[0])
        used = update_postings(conn, removed, first_new_row, json.loads(recorded), totals=totals)
    rebuilt = used is None
    if rebuilt:
        totals = {}
        used = rebuild_postings(conn, totals=totals)
    conn.executemany(
        "INSERT INTO groundkit_manifest(key, value) VALUES (?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        [("bm25_stats", json.dumps(used)), ("bm25_length", str(totals.get("length", "")))])
    return rebuilt
