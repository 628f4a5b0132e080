"""One reader's BM25 over one published version (adr/0051): the postings of the chunks it
may read, weighted with the statistics of those chunks alone. A :class:`ReaderView` is a
``bm25.TermCache``, so every ranking path of ``bm25.py`` runs on it unchanged."""

import sqlite3
from collections import OrderedDict

import numpy as np

from .bm25 import B, K1, Postings, TermCache, postings_of, document_map, idf_of, term_weights


def _distinct_count(values: np.ndarray) -> int:
    """How many distinct values ``values`` holds (a term's documents: ascending, as ingest
    writes a document's chunks together, unless the file was edited by hand)."""
    if values.size < 2:
        return int(values.size)
    step = values[1:] != values[:-1]
    if (values[1:] >= values[:-1]).all():
        return int(np.count_nonzero(step)) + 1
    return int(np.unique(values).size)


class VersionStats:
    """What per-reader BM25 needs of one published version, read once (on the first search
    by a reader with a view, under the collection's lock): the document map, each chunk
    row's token count, and the statistics the stored weights were computed with (the
    manifest's ``bm25_stats``), from which a term's frequency in each chunk is solved."""

    def __init__(self, stored: dict | None):
        self.stored = stored
        self.documents = None  # documents[row id] = ordinal, -1: no chunk row
        self.lengths = None  # lengths[row id] = token count

    def load(self, conn: sqlite3.Connection, cache: "TermCache | None") -> "VersionStats | None":
        """Self, read; None for a file without a document map (no view can be exact)."""
        if self.lengths is None:
            documents = document_map(conn, cache)
            if documents is None:
                return None
            cur = conn.execute("SELECT id, length FROM bm25_chunk_terms")
            pairs = np.fromiter((v for row in cur for v in row), dtype=np.int64).reshape(-1, 2)
            size = max(documents.size, int(pairs[:, 0].max()) + 1 if pairs.size else 0)
            lengths = np.zeros(size, dtype=np.int64)
            lengths[pairs[:, 0]] = pairs[:, 1]
            if documents.size < size:
                documents = np.concatenate([documents, np.full(size - documents.size, -1, np.int32)])
            self.documents, self.lengths = documents, lengths
        return self

    def own(self) -> dict:
        """The statistics of every chunk row, as ingest computes them (``_Chunks.stats``)."""
        rows = np.flatnonzero(self.documents >= 0)
        return _stats_of(self.documents, self.lengths, rows)

    def tf(self, conn: sqlite3.Connection, term: str, p: Postings) -> np.ndarray:
        """Term ``term``'s frequency in each chunk of its postings ``p`` (float64), kept on
        ``p`` (one published version's postings)."""
        tf = p.tf
        if tf is None:
            tf = p.tf = self._solve_tf(conn, term, p)
        return tf

    def _solve_tf(self, conn, term: str, p: Postings) -> np.ndarray:
        # The stored weight is term_weights(idf, tf, ...) with the recorded statistics and the
        # term's document frequency: solved for tf and kept where tf, and neither of its
        # neighbours, gives the stored weight back (the weight rises with tf, so then no other
        # tf does); the rest is read from the chunk term rows.
        ids, weights = p.ids, p.weights
        tf = np.ones(ids.size)
        ok = np.zeros(ids.size, dtype=bool)
        stored = self.stored
        if stored and stored.get("documents") and stored.get("avgdl"):
            n, avgdl = int(stored["documents"]), float(stored["avgdl"])
            idf = idf_of(n, np.array([_distinct_count(self.documents[ids])], dtype=np.int64))
            dl = self.lengths[ids].astype(np.float64)
            w = weights.astype(np.float64)
            norm = K1 * (1 - B + B * dl / avgdl)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                solved = np.rint(w * norm / (idf * (K1 + 1) - w))
            tf = np.where(np.isfinite(solved) & (solved >= 1) & (solved < 2**31), solved, 1.0)
            ok = ((term_weights(idf, tf, dl, avgdl) == weights)
                  & (term_weights(idf, tf + 1, dl, avgdl) != weights)
                  & (term_weights(idf, tf - 1, dl, avgdl) != weights))
        if not ok.all():
            tf[~ok] = _stored_tf(conn, term, ids[~ok])
        return tf


def _stats_of(documents: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> dict:
    """``{"documents", "avgdl"}`` of the chunk rows ``rows``: the distinct documents and the
    mean token count (integers summed exactly, divided once: the value numpy's mean of the
    same lengths gives, so bit for bit what ingest records for those chunks alone)."""
    if not rows.size:
        return {"documents": 0, "avgdl": 1.0}
    total = int(lengths[rows].sum())
    return {"documents": int(np.unique(documents[rows]).size),
            "avgdl": float(max(total / rows.size, 1e-9))}


def _stored_tf(conn: sqlite3.Connection, term: str, ids: np.ndarray) -> np.ndarray:
    """``term``'s frequency in each chunk row ``ids``, read from the chunk term rows."""
    row = conn.execute("SELECT term_id FROM bm25_vocab WHERE term = ?", (term,)).fetchone()
    found = {}
    if row is not None:
        term_id = row[0]
        for g in range(0, ids.size, 900):
            part = ids[g:g + 900].tolist()
            for rid, tids, freqs in conn.execute(
                    "SELECT id, term_ids, term_freqs FROM bm25_chunk_terms WHERE id IN "
                    f"({','.join('?' * len(part))})", part):
                at = np.flatnonzero(np.frombuffer(tids, dtype=np.int32) == term_id)
                if at.size:
                    found[rid] = float(np.frombuffer(freqs, dtype=np.int32)[at[0]])
    return np.array([found.get(i, 1.0) for i in ids.tolist()], dtype=np.float64)


class ReaderView(TermCache):
    """One reader's BM25 over one published version: a dict like the collection's postings
    cache (term -> :class:`Postings` or None), so every ranking path runs on it unchanged.

    A term's postings here hold only the chunks the reader may read, weighted by the stored
    formula (``term_weights``) with the statistics of those chunks alone: their documents,
    the term's documents among them, their mean length. The weights are bit for bit what
    ingest would store for a collection of only those documents, so nothing a reader is
    shown (scores, ranks, the top-k cut, ties) depends on the chunks it may not read.
    Derived per term on first use and kept with the view (one per published version and
    set of hidden documents, see ``Collection.reader_view``)."""

    TERMS = 10_000  # terms kept per view (its postings are at most the collection's)

    def __init__(self, version: VersionStats, base: dict, hidden_rows: np.ndarray):
        super().__init__()
        self.version = version
        self.base = base  # the collection's postings cache: the stored postings
        self.hidden_rows = hidden_rows
        self.visible = None
        self.stats = None

    def prepare(self, conn: sqlite3.Connection) -> "ReaderView | None":
        """Self, with the reader's statistics; None for a file without a document map."""
        if self.visible is None:
            version = self.version.load(conn, self.base)
            if version is None:
                return None
            visible = version.documents >= 0
            hidden = self.hidden_rows
            visible[hidden[hidden < visible.size]] = False
            self.stats = _stats_of(version.documents, version.lengths, np.flatnonzero(visible))
            self.visible = visible
        return self

    def derive(self, conn: sqlite3.Connection, terms: list[str]) -> dict:
        """``{term: Postings or None}``: the reader's postings of ``terms``."""
        self.prepare(conn)
        stored = postings_of(conn, terms, self.base)
        return {t: None if p is None else self._restricted(conn, t, p) for t, p in stored.items()}

    def _restricted(self, conn, term: str, p: Postings) -> Postings | None:
        version = self.version
        keep = self.visible[p.ids]
        every = bool(keep.all())
        ids = p.ids if every else p.ids[keep]
        if not ids.size:
            return None
        tf = version.tf(conn, term, p)
        if not every:
            tf = tf[keep]
        n, avgdl = self.stats["documents"], self.stats["avgdl"]
        # As ingest computes them: IDF from an int64 array of document counts, then the
        # weights from float64 frequencies and lengths (the same elementwise operations).
        idf = idf_of(n, np.array([_distinct_count(version.documents[ids])], dtype=np.int64))
        weights = term_weights(idf, tf, version.lengths[ids].astype(np.float64), avgdl)
        return Postings(ids, weights)


class ReaderViews:
    """The open collection's reader views, most recently used last, and the one its
    unrestricted readers need when the stored weights are not its own statistics."""

    KEPT = 16

    def __init__(self, stored: dict | None):
        self.version = VersionStats(stored)
        self.views: OrderedDict = OrderedDict()

    def get(self, key, base: dict, hidden_rows) -> ReaderView:
        """The view for ``key`` (the hidden documents), made with ``hidden_rows()``
        (sorted chunk row ids) when not kept. Call under the collection's lock."""
        view = self.views.get(key)
        if view is None:
            view = self.views[key] = ReaderView(self.version, base, hidden_rows())
            if len(self.views) > self.KEPT:
                self.views.popitem(last=False)
        else:
            self.views.move_to_end(key)
        return view

    def stale(self, conn: sqlite3.Connection, base: dict) -> bool:
        """Whether the stored weights were computed with other statistics than the
        version's own (an incremental ingest keeps them while they stay within
        ``STATS_DRIFT``, adr/0030): then a reader who may read everything ranks on a view
        too, so its figures are those of a view hiding nothing."""
        version = self.version.load(conn, base)
        if version is None:
            return False
        stored = version.stored or {}
        own = version.own()
        return (stored.get("documents") != own["documents"]
                or float(stored.get("avgdl") or 0) != own["avgdl"])
