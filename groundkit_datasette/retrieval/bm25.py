"""BM25 scoring over the postings ingest stored (``indexing/terms.py``, adr/0003):
a query is a handful of indexed blob reads and a vector sum. A reader from whom access lists
hide documents ranks over its own view of them (``views.ReaderView``, adr/0051): postings of
the chunks it may read, weighted with the statistics of those chunks alone.
"""

import sqlite3
from collections import Counter
from functools import lru_cache
from itertools import compress

import numpy as np

from ..indexing.postings import (  # noqa: F401  (the reading side uses the writer's rules)
    B, DOCUMENT_MAP_ID, IDF_UNIT, K1, TIE_ORDER_ID, idf_of, rebuild_postings, settings, term_weights,
)
from ..indexing.terms import TermTable  # noqa: F401
from ..indexing.tokenizer import STOP_WORDS, cjk_bigrams, tokenize, words as _words  # noqa: F401
from ..indexing.tokenizer import CJK_CHAR as _CJK_CHAR, STEMMER as _stemmer

# Postings kept in memory per open collection (one published version, so never stale).
POSTINGS_CACHE_TERMS = 50_000


def _documents_of(ids: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """The distinct document ordinals of the chunk rows ``ids``."""
    return np.unique(documents[ids])


def without_hidden(postings, hidden: np.ndarray, total: int, documents: np.ndarray | None = None):
    """Re-weight each term's postings' IDF as if the ``hidden`` chunk rows were not there.

    Only for a file written before the document map (a reader's view needs it), until
    its next ingest: the average chunk length stays the whole collection's, and the
    re-weighting is a float32 product, not the weights a collection of the readable
    chunks alone would store. ``documents`` counts in documents, as the stored weights
    do; without it in chunks.
    """
    if documents is None:
        visible = total - hidden.size
        out = []
        for ids, weights in postings:
            df = ids.size
            df_visible = df - int(np.count_nonzero(np.isin(ids, hidden, assume_unique=True)))
            factor = idf_of(visible, df_visible) / idf_of(total, df)
            out.append((ids, weights * np.float32(factor)))
        return out
    n = int(documents.max()) + 1 if documents.size else 0
    hidden_docs = _documents_of(hidden[hidden < documents.size], documents)
    hidden_docs = hidden_docs[hidden_docs >= 0]
    visible = n - hidden_docs.size
    out = []
    for ids, weights in postings:
        docs = _documents_of(ids, documents)
        df = docs.size
        df_visible = df - int(np.count_nonzero(np.isin(docs, hidden_docs, assume_unique=True)))
        factor = idf_of(visible, df_visible) / idf_of(n, df)
        out.append((ids, weights * np.float32(factor)))
    return out


def document_map(conn: sqlite3.Connection, cache: "TermCache | None" = None) -> np.ndarray | None:
    """``documents[chunk row id]`` = document ordinal, or None for a file without the map;
    kept on the open version's :class:`PostingsCache` (a view's is its base's)."""
    if cache is not None:
        cache = cache.base  # a reader's view shares its version's
    if cache is not None and cache.document_map is not _UNREAD:
        return cache.document_map
    row = conn.execute(
        "SELECT chunk_ids FROM bm25_postings WHERE term_id = ?", (DOCUMENT_MAP_ID,)
    ).fetchone()
    documents = None if row is None else np.frombuffer(row[0], dtype=np.int32)
    if cache is not None:
        cache.document_map = documents
    return documents


_UNREAD = object()  # the document map not read yet (None: the file has none)


class TermCache(dict):
    """Term -> :class:`Postings` (None: not in the collection), kept for one published
    version; only terms are keys. ``held``: the last one-term ranking served from a term's
    head, ``(query, mask, [row id])``: every one of those rows holds the query terms of
    ``mask`` (bit j: term j of the query's sorted terms), so :func:`matched_terms` answers
    them without asking the terms again. A fact about the version, true whichever reader
    ranked; a later ranking replaces it."""

    TERMS = 0  # terms kept (more: all but the asking query's are dropped)

    def __init__(self):
        super().__init__()
        self.held = None
        self.base = self  # the stored postings a view derives its own from (itself here)

    def derive(self, conn: sqlite3.Connection, terms: list[str]) -> dict:
        """``{term: Postings or None}`` of ``terms`` not kept yet."""
        raise NotImplementedError


class PostingsCache(TermCache):
    """The open version's stored postings (:class:`TermCache`), with what its rankings share:
    the accumulator buffers (:func:`_buffers`) and the document map (:func:`document_map`)."""

    def __init__(self):
        super().__init__()
        self.accumulator = None  # (float32 sums, bool mask), zeroed after each use
        self.document_map = _UNREAD

    TERMS = POSTINGS_CACHE_TERMS

    def derive(self, conn, terms):
        return _fetch(conn, terms)


def tie_ranks(conn: sqlite3.Connection) -> np.ndarray | None:
    """``ranks[row id]`` = position of the chunk in content-hash order."""
    row = conn.execute(
        "SELECT chunk_ids FROM bm25_postings WHERE term_id = ?", (TIE_ORDER_ID,)
    ).fetchone()
    if row is None:
        return None
    order = np.frombuffer(row[0], dtype=np.int32)
    ranks = np.zeros(int(order.max()) + 1 if order.size else 0, dtype=np.int64)
    ranks[order] = np.arange(order.size)
    return ranks


class Postings:
    """One term's postings as read from the file: chunk row ids (ascending) and weights, plus
    what the ranking derives from them in memory on first use: the order statistic of the
    top-k cut (:meth:`kth`), the ids as numpy's index type (:meth:`rows`) and the term's best
    chunks in rank order (:meth:`head`). Unpacks as ``ids, weights``."""

    __slots__ = ("ids", "weights", "last", "_top", "_rows", "_head", "_set", "_bits", "_bound",
                 "tf")
    # How many of a term's largest weights are kept (sorted) for :meth:`kth`, and at least how
    # many of its chunks :meth:`head` keeps in rank order.
    TOP_KEPT = 128

    def __init__(self, ids: np.ndarray, weights: np.ndarray):
        self.ids = ids
        self.weights = weights
        self.last = int(ids[-1]) if ids.size else -1  # the highest row id (ids ascend)
        self._top = None
        self._rows = None
        self._head = None
        self._set = None
        self._bits = None
        self._bound = None
        self.tf = None  # term frequencies (float64), derived by views.VersionStats.tf

    def __iter__(self):
        return iter((self.ids, self.weights))

    def rows(self) -> np.ndarray:
        """``ids`` as numpy's index type, derived on first use: an int32 index is converted on
        every scatter into the accumulator, a fifth of its cost for a long posting list."""
        rows = self._rows
        if rows is None:
            rows = self._rows = self.ids.astype(np.intp)
        return rows

    def kth(self, k: int) -> np.float32:
        """The ``k``-th largest weight, or 0 when the term has fewer postings (or ``k`` is
        past the weights kept)."""
        top = self._top
        if top is None:
            w = self.weights
            n = min(w.size, self.TOP_KEPT)
            top = np.sort(np.partition(w, w.size - n)[w.size - n:])[::-1] if n else w[:0]
            self._top = top
        return top[k - 1] if 0 < k <= top.size else np.float32(0)

    def bound(self, k: int) -> float:
        """:meth:`kth` as a Python float (a float32 widens exactly), kept for the last ``k``
        asked: a search asks every term for one depth, and Python floats compare without
        numpy's scalar overhead (cisi's 26-term queries: about 7 us of 54 in ranking)."""
        bound = self._bound
        if bound is None or bound[0] != k:
            bound = self._bound = (k, float(self.kth(k)))
        return bound[1]

    # Up to this many postings a term answers :meth:`holds` from a set of its ids (about
    # 4 kB kept per term; a few microseconds a search less than the searchsorted path).
    SET_MAX = 64
    # Longer lists answer from a bitmap of the row ids up to their last (one bit per row id,
    # made on first use) when it takes fewer bytes than the term's arrays (16 per posting):
    # the same answers, read in Python, with no numpy call per term.
    BITS_RATIO = 128

    def holds(self, rows: list[int], wanted: list) -> list[bool]:
        """Whether each of ``rows`` (chunk row ids) has this term. ``wanted`` is a list the
        caller shares between terms: the rows as an int32 array, made on first need."""
        ids = self.ids
        if ids.size <= self.SET_MAX:
            members = self._set
            if members is None:
                members = self._set = frozenset(ids.tolist())
            return [r in members for r in rows]
        bits = self._bits
        if bits is None and ids.size * self.BITS_RATIO > self.last:
            held = np.zeros(self.last + 1, dtype=bool)
            held[ids] = True
            bits = self._bits = np.packbits(held, bitorder="little").tobytes()
        if bits is not None:  # one byte read per row: no numpy call
            size = len(bits) << 3
            return [r < size and bits[r >> 3] >> (r & 7) & 1 == 1 for r in rows]
        if not wanted:
            wanted.append(np.array(rows, dtype=np.int32))  # row ids are below int32's limit
        want = wanted[0]  # an id past the last posting finds the last one, and differs
        return (ids.take(ids.searchsorted(want), mode="clip") == want).tolist()

    def head(self, ranks: np.ndarray):
        """``(row ids, scores)`` (arrays) of this term's chunks in rank order (weight
        descending, then tie rank), at least its ``TOP_KEPT`` best (every chunk tied with the
        last is kept): the whole ranking of a one-term query down to that depth, derived once.
        ``ranks`` is the collection's tie order (one per open collection, as this cache is)."""
        head = self._head
        if head is None:
            ids, weights = self.ids, self.weights
            if ids.size > self.TOP_KEPT:
                keep = (weights >= self.kth(self.TOP_KEPT)).nonzero()[0]
                ids, weights = ids[keep], weights[keep]
            order = np.lexsort((ranks[ids], -weights))
            head = self._head = (ids[order], weights[order])
        return head


def _fetch(conn: sqlite3.Connection, terms: list[str]) -> dict:
    """``{term: Postings or None}`` read from the postings."""
    found = dict.fromkeys(terms)
    marks = ",".join("?" * len(terms))
    for term, ids, weights in conn.execute(
        "SELECT v.term, p.chunk_ids, p.weights FROM bm25_vocab v JOIN bm25_postings p "
        f"ON p.term_id = v.term_id WHERE v.term IN ({marks})",
        terms,
    ):
        found[term] = Postings(np.frombuffer(ids, dtype=np.int32),
                               np.frombuffer(weights, dtype=np.float32))
    return found


def _query_postings(conn, query: str, cache: "TermCache | None"):
    """The query's terms that occur, as ``(postings, repeats)`` in sorted term order (the
    order their weights are summed in: every scorer here adds them in this order)."""
    terms, counts = query_terms(query)
    if not terms:
        return [], []
    postings, repeats = _present(conn, terms, counts, cache)
    return postings, repeats or [1] * len(postings)


def query_terms(query: str) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
    """The query's distinct terms in sorted order (the order their weights are summed in),
    and how often the query repeats each one (None when no term is repeated). A word the query
    repeats counts as often as it is repeated (as in Lucene and bm25s): in a long,
    natural-language query the repeated words carry the topic."""
    terms, counts, _words = _plan(query)
    return terms, counts


@lru_cache(maxsize=1024)  # beside query_words: the ranking's and matched_terms' view of it
def _plan(query: str):
    """``(terms, counts, words)``: the query's distinct terms (sorted), how often each is
    repeated (None: none is), and each distinct word in query order with the index of its
    term among ``terms`` (what :func:`matched_terms` reports)."""
    words = query_words(query)  # tokenize(query), each token beside its word
    stems = [t for _, t in words]
    terms = sorted(set(stems))
    index = {t: j for j, t in enumerate(terms)}
    if len(terms) == len(words):  # every term once, so every word once: in query order
        return tuple(terms), None, tuple(zip([w for w, _ in words], map(index.__getitem__, stems)))
    repeats = Counter(stems)
    counts = tuple(repeats[t] for t in terms)
    return tuple(terms), counts, tuple((w, index[t]) for w, t in dict(words).items())


_ABSENT = object()  # not in the postings cache (None there: not in the collection)


def _lookup(conn, terms: tuple, cache: "TermCache | None") -> list:
    """``Postings`` (or None: not in the collection) of each of ``terms``, in order, through
    the open collection's postings cache (see :func:`postings_of`)."""
    if cache is not None:
        get = cache.get
        found = [get(t, _ABSENT) for t in terms]
        if _ABSENT not in found:
            return found
    resolved = postings_of(conn, list(terms), cache)
    return [resolved[t] for t in terms]


def _present(conn, terms: tuple, counts: tuple | None, cache: "TermCache | None"):
    """``(postings, repeats)`` of the ``terms`` the collection holds, in the order given;
    ``repeats`` is None when ``counts`` is (every term once)."""
    found = _lookup(conn, terms, cache)
    if counts is None:
        return [p for p in found if p is not None], None
    kept = [(p, n) for p, n in zip(found, counts) if p is not None]
    return [p for p, _ in kept], [n for _, n in kept]


def score(conn: sqlite3.Connection, query: str, cache: "TermCache | None" = None,
          hidden: np.ndarray | None = None, total: int | None = None):
    """Return ``(chunk row ids, scores)`` of every chunk matching any query term.

    ``cache`` may be a reader's ``views.ReaderView`` (its chunks, its statistics). ``hidden``
    (sorted chunk row ids a reader may not see) and ``total`` (chunks in the collection)
    are the legacy re-weighting of :func:`without_hidden`, for files without a document map.
    """
    postings, repeats = _query_postings(conn, query, cache)
    if not postings:
        return np.empty(0, np.int64), np.empty(0, np.float32)
    if hidden is not None and hidden.size and total:
        postings = without_hidden(postings, hidden, total, document_map(conn, cache))
    if len(postings) == 1:
        ids, weights = postings[0]
        n = repeats[0]
        return ids.astype(np.int64), weights * np.float32(n) if n != 1 else weights.copy()
    top = max(int(ids[-1]) for ids, _ in postings if ids.size) + 1
    acc = np.zeros(top, dtype=np.float32)
    for (ids, weights), n in zip(postings, repeats):
        acc[ids] += weights if n == 1 else weights * np.float32(n)
    hit = (acc > 0).nonzero()[0]  # weights are positive; a boolean scan is the fast one
    return hit, acc[hit]


# Below this many postings per accumulator slot a query is scored sparsely (touched slots
# only); above it, a scan of the whole accumulator is cheaper than sorting the touched ids.
# Under SPARSE_MIN_SLOTS slots the scan is a few microseconds, always cheaper than the
# sparse path's extra numpy calls.
SPARSE_FRACTION = 1 / 32
SPARSE_MIN_SLOTS = 65_536
# From this many postings a term is added with ``np.add.at`` (one pass; about 1.8x faster
# on long lists) rather than ``acc[rows] += w`` (gather, add, scatter: cheaper on short ones).
ADD_AT_MIN = 1_000
# From this many terms, with at most this many postings in all, a query's weights are added
# in one call over their concatenation rather than a numpy call per term: long,
# natural-language queries (cisi's 26 terms: 16 us instead of 22).
ADD_ONCE_MIN_TERMS = 6
ADD_ONCE_MAX_POSTINGS = 65_536
# A scatter too large for the sparse path still looks only at the postings of the terms a
# chunk must hold to reach the cut (:func:`_essential`) when they are below this fraction of
# the slots, rather than scanning every slot.
ESSENTIAL_FRACTION = 1 / 32


def top_candidates(conn: sqlite3.Connection, query: str, depth: int, cache: "TermCache | None" = None):
    """``(chunk row ids, scores)`` of the chunks that can be in the top ``depth``: every chunk
    whose score reaches the ``depth``-th best, so ties there are all kept, and scores exactly
    as :func:`score` computes them. For a search with nothing hidden (no IDF to redo).

    The cut is a lower bound on the ``depth``-th best score: a chunk's score is a sum of
    positive weights, so it is at least its weight for any one term, and each term has
    ``depth`` chunks at or above that term's ``depth``-th largest weight
    (:meth:`Postings.kth`). See adr/0025-bm25-topk.md for the measurements.
    """
    postings, repeats = _query_postings(conn, query, cache)
    if not postings:
        return np.empty(0, np.int64), np.empty(0, np.float32)
    return _candidates(postings, repeats, depth, cache)


def _cut_bound(postings, repeats, depth) -> np.float32:
    """The largest of the terms' ``depth``-th weights, each times its repeats in the query
    (:func:`top_candidates`' cut), as float32."""
    if repeats is None:
        return np.float32(max([p.bound(depth) for p in postings]))
    # The float64 product of a float32 and a small count is exact, and rounding is
    # monotonic: the largest product rounded once is the largest float32 product.
    return np.float32(max([p.bound(depth) * n for p, n in zip(postings, repeats)]))


def _scaled(postings, repeats, j):
    """Term ``j``'s weights times its repeats in the query (float32, as score() adds them)."""
    n = repeats[j] if repeats is not None else 1
    return postings[j].weights if n == 1 else postings[j].weights * np.float32(n)


def _candidates(postings, repeats, depth, cache):
    floor = _cut_bound(postings, repeats, depth)
    if len(postings) == 1:
        ids, weights = postings[0]
        scores = weights * np.float32(repeats[0]) if repeats and repeats[0] != 1 else weights
        if floor > 0:
            keep = (scores >= floor).nonzero()[0]
            return ids[keep].astype(np.int64), scores[keep]
        return ids.astype(np.int64), scores.copy()
    top = max([p.last for p in postings]) + 1
    acc, mask = _buffers(cache, top)
    acc = acc[:top]
    try:
        return _accumulate_and_cut(postings, repeats, floor, acc, mask[:top], top)
    except BaseException:
        acc.fill(0)  # the buffer is shared by the collection's later queries
        raise


def top_rows(conn: sqlite3.Connection, query: str, depth: int, cache: "TermCache | None",
             ranks: np.ndarray) -> tuple[list[int], list[float]]:
    """The top ``depth`` as ``([chunk row id], [score])`` in rank order: score descending,
    then ``ranks`` (the collection's tie order, :func:`tie_ranks`). For a search with nothing
    hidden; the same chunks, scores and order as ranking :func:`score`'s output.

    A one-term query (the term once) is a prefix of the term's own ranking, derived once per
    cached term (:meth:`Postings.head`); others are cut by :func:`top_candidates`'s bound and
    ordered. See adr/0039-bm25-per-query-overhead.md."""
    terms, counts, _words = _plan(query)
    if not terms:
        return [], []
    found = _lookup(conn, terms, cache)
    postings = [p for p in found if p is not None]
    if not postings:
        return [], []
    if len(postings) == 1 and counts is None and depth <= Postings.TOP_KEPT:
        ids, scores = postings[0].head(ranks)
        ids = ids[:depth].tolist()
        if cache is not None:  # every chunk of the term's head holds the term
            cache.held = (query, 1 << found.index(postings[0]), ids)
        return ids, scores[:depth].tolist()
    repeats = None if counts is None else [n for p, n in zip(found, counts) if p is not None]
    ids, scores = _candidates(postings, repeats, depth, cache)
    return in_rank_order(ids, scores, depth, ranks)


SORT_ALL = 256


def in_rank_order(ids: np.ndarray, scores: np.ndarray, depth: int, ranks: np.ndarray):
    """The top ``depth`` of ``(ids, scores)`` as lists: score descending, then tie rank.
    Up to ``SORT_ALL`` candidates one ``lexsort`` of them all is cheaper than a partition
    first (four more numpy calls)."""
    if ids.size > depth and ids.size > SORT_ALL:
        kth = np.partition(scores, ids.size - depth)[ids.size - depth]
        sel = scores >= kth
        ids, scores = ids[sel], scores[sel]
    order = np.lexsort((ranks[ids], -scores))[:depth]
    return ids[order].tolist(), scores[order].tolist()


def _accumulate_and_cut(postings, repeats, floor, acc, mask, top):
    touched = sum([p.ids.size for p in postings])
    sparse = top >= SPARSE_MIN_SLOTS and touched < top * SPARSE_FRACTION
    # The same sums, in the same order, as score(): the accumulator is zero, so the first
    # term's weights are stored (0 + w is w), and the others added in sorted term order.
    # The first two may swap (float addition is commutative): the longer list is stored.
    order = list(range(len(postings)))
    if postings[1].ids.size > postings[0].ids.size:
        order[0], order[1] = 1, 0
    if len(postings) >= ADD_ONCE_MIN_TERMS and touched <= ADD_ONCE_MAX_POSTINGS:
        # Many short lists: one unbuffered add over them all, in the same order (add.at adds
        # each slot's weights in the order given, so every sum is the loop's, bit for bit).
        np.add.at(acc, np.concatenate([postings[j].rows() for j in order]),
                  np.concatenate([_scaled(postings, repeats, j) for j in order]))
        order = ()
    for i, j in enumerate(order):
        weights = _scaled(postings, repeats, j)
        rows = postings[j].rows()
        if not i:
            acc[rows] = weights
        elif rows.size >= ADD_AT_MIN:
            np.add.at(acc, rows, weights)
        else:
            acc[rows] += weights
    if not sparse and top >= SPARSE_MIN_SLOTS and floor > 0:
        essential = _essential(postings, repeats, floor)
        if sum(postings[j].ids.size for j in essential) < top * ESSENTIAL_FRACTION:
            # Every chunk reaching the cut holds an essential term: look only at theirs.
            every = np.concatenate([postings[j].rows() for j in essential])
            hit = _distinct(every[acc[every] >= floor])
            scores = acc[hit]
            acc.fill(0)
            return hit.astype(np.int64), scores
    if sparse:
        every = np.concatenate([p.rows() for p in postings])
        reached = every[acc[every] >= floor] if floor > 0 else every
        hit = _distinct(reached)
        scores = acc[hit]
        acc[every] = 0
        return hit.astype(np.int64), scores
    if floor > 0:
        np.greater_equal(acc, floor, out=mask)
    else:
        np.greater(acc, 0, out=mask)
    hit = mask.nonzero()[0]  # the method: np.flatnonzero's wrapper is 2x its cost here
    scores = acc[hit]
    acc.fill(0)
    return hit, scores


# Relative slack on the bound of _essential for float32 rounding: a float32 sum of n
# weights is within about n * 2**-24 of the exact sum, far inside this for any query.
_SLACK = 1e-4


def _essential(postings, repeats, floor) -> list[int]:
    """The indices (ascending) of the terms a chunk must hold to reach ``floor`` (MaxScore):
    the terms of smallest maximum weight are left out while their maxima together stay
    under ``floor``, so a chunk holding none of the others scores under it."""
    if len(postings) > 1_000:  # past what _SLACK covers: no term is left out
        return list(range(len(postings)))
    maxima = [float(p.kth(1)) * (repeats[j] if repeats is not None else 1)
              for j, p in enumerate(postings)]
    ranked = sorted(range(len(postings)), key=maxima.__getitem__)
    rest, left_out = 0.0, 0
    for j in ranked:
        rest += maxima[j]
        if rest * (1 + _SLACK) >= floor:
            break
        left_out += 1
    return sorted(ranked[left_out:])


def _distinct(ids: np.ndarray) -> np.ndarray:
    """``np.unique(ids)`` by a sort: numpy's hashing ``unique`` (2.x) is several times slower
    on the int32 row ids a query yields."""
    ids = np.sort(ids)
    if ids.size > 1:
        ids = ids[np.concatenate(([True], ids[1:] != ids[:-1]))]
    return ids


def _buffers(cache: "TermCache | None", size: int):
    """A zeroed float accumulator and a boolean mask of at least ``size`` slots, kept on the
    open version's :class:`PostingsCache` (callers hold the collection's lock; one for its
    views too) and left zeroed after each use."""
    if cache is not None:
        cache = cache.base  # one per open collection, its views included
    found = cache.accumulator if cache is not None else None
    if found is None or found[0].size < size:
        found = (np.zeros(size, dtype=np.float32), np.zeros(size, dtype=bool))
        if cache is not None:
            cache.accumulator = found
    return found


# -- which query words a chunk holds (matched_terms, lexical_match) -------------------


@lru_cache(maxsize=1024)  # a search asks three times (ranking, matched_terms, term_rows)
def query_words(query: str) -> tuple[tuple[str, str], ...]:
    """``(word, term)`` for each indexed token of ``query``, in query order: the terms
    :func:`tokenize` gives, each beside the lower-cased word it came from (a CJK run gives
    its bigrams, each its own word). Stop words have no term and are left out."""
    low = query.lower()
    tokens = _words(low)
    if low.isascii():  # no CJK run: the words left after the stop words, stemmed in one call
        words = [t for t in tokens if t not in STOP_WORDS]
        return tuple(zip(words, _stemmer.stemWords(words)))
    out = []
    for token in tokens:
        if _CJK_CHAR.match(token):
            out += [(b, b) for b in cjk_bigrams(token)]
        elif token not in STOP_WORDS:
            out.append((token, _stemmer.stemWord(token)))
    return tuple(out)


def postings_of(conn: sqlite3.Connection, terms: list[str], cache: "TermCache | None") -> dict:
    """``{term: Postings or None}``, through the open collection's postings cache (kept to
    ``POSTINGS_CACHE_TERMS``)."""
    if cache is None:
        return _fetch(conn, terms)
    missing = [t for t in terms if t not in cache]
    if missing:
        found = cache.derive(conn, missing)
        if len(cache) > cache.TERMS:
            kept = {t: cache[t] for t in terms if t in cache}
            cache.clear()
            cache.update(kept)
        cache.update(found)
    return {t: cache[t] for t in terms}


def matched_terms(conn: sqlite3.Connection, query: str, row_ids, cache: "TermCache | None" = None):
    """For each chunk row id, the words of ``query`` (lower-cased, as typed, each once, in
    query order) whose term the chunk's indexed text holds: what BM25 matches there, for a
    hit of any mode.

    Each term answers for every row at once (:meth:`Postings.holds`): from a set of its row
    ids when its list is short, else by one ``searchsorted`` of the rows in its ascending ids
    (logarithmic in the postings)."""
    terms, _counts, words = _plan(query)
    rows = row_ids.tolist() if isinstance(row_ids, np.ndarray) else list(row_ids)
    if not terms or not rows:
        return [[] for _ in rows]
    held = cache.held if cache is not None else None
    if held is not None and held[0] == query:  # rows of the search's own ranking (held)
        kept = held[2]
        if rows == kept[:len(rows)] or set(rows).issubset(kept):
            mask = held[1]
            found = [w for w, j in words if mask >> j & 1]
            return [found[:] for _ in rows]
    found = _lookup(conn, terms, cache)
    wanted = []  # the rows as int32 (the postings' own type: nothing is copied), made once
    held = [p.holds(rows, wanted) if p is not None else None for p in found]
    out = [[] for _ in rows]
    for w, j in words:  # each word, in query order, appended to the rows holding its term
        if held[j] is not None:
            for words_of_row in compress(out, held[j]):
                words_of_row.append(w)
    return out


def _match_plan(query: str) -> tuple[tuple[str, ...], tuple[tuple[str, int], ...]]:
    """The query's distinct terms (sorted) and each distinct word, in query order, with the
    index of its term among them."""
    terms, _counts, words = _plan(query)
    return terms, words


def clear_query_caches() -> None:
    """Forget every query's tokens (:func:`query_words` and the plan derived from them): what
    a benchmark does to time a query as if it were new, as bm25s keeps none."""
    query_words.cache_clear()
    _plan.cache_clear()


# Older callers clear these by name: each clears every query cache.
query_terms.cache_clear = _match_plan.cache_clear = clear_query_caches


def term_rows(conn: sqlite3.Connection, query: str, cache: "TermCache | None" = None) -> list[np.ndarray]:
    """The chunk row ids holding each of ``query``'s terms (empty list: no term is indexed)."""
    terms = sorted({t for _, t in query_words(query)})
    if not terms:
        return []
    return [found.ids for found in postings_of(conn, terms, cache).values() if found is not None]
