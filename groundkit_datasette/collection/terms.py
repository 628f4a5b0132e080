"""The BM25 index as ingest writes it: the tokenizer (the same for documents and queries),
term ids, and postings with every (term, chunk) weight precomputed (adr/0003).

Scoring a query over these postings is ``retrieval/bm25.py``.
"""

import re
import sqlite3
from collections import Counter
from array import array

import numpy as np
import Stemmer

K1 = 1.5
B = 0.5  # chunks are length-capped; see adr/0018-bm25-over-chunks.md

# Han (ideographs, their extensions and compatibility forms), Hiragana, Katakana (with the
# half-width forms) and Hangul (syllables and jamo): scripts written without spaces.
_CJK = ("\u1100-\u11ff\u3005-\u3007\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
        "\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f")
# A token is a run of CJK characters or a run of other word characters (``\w`` minus CJK).
_TOKEN = re.compile(f"[{_CJK}]+|[^\\W{_CJK}]+")
_CJK_CHAR = re.compile(f"[{_CJK}]")
# What the stored terms were tokenized with (the manifest's ``tokenizer``): words, stemmed, and
# runs of CJK characters as overlapping character bigrams (adr/0022-cjk-search.md).
TOKENIZER = "words+cjk-bigrams-1"
# A reserved postings row: every chunk row id in content-hash order, the BM25 tie-breaker.
TIE_ORDER_ID = -1
# A reserved postings row: ``documents[row id]`` = the document ordinal of each chunk row
# (-1 for a gap), so a reader's IDF can be recounted in documents. Older files lack it.
DOCUMENT_MAP_ID = -2
# What the stored weights were computed with; ingest records it in the manifest and
# rebuilds the postings of a collection whose record differs.
IDF_UNIT = "document"

# English function words: dropped from documents and queries alike.
STOP_WORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for
    from further had has have having he her here hers herself him himself his how i if in
    into is it its itself just me more most my myself no nor not now of off on once only or
    other our ours ourselves out over own same she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up
    very was we were what when where which while who whom why will with would you your
    yours yourself yourselves s t don
    """.split()
)

_stemmer = Stemmer.Stemmer("english")


def cjk_bigrams(run: str) -> list[str]:
    """Overlapping character bigrams of a CJK run; a lone character stands for itself."""
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def cjk_terms(text: str) -> list[str]:
    """The bigrams of the CJK runs in ``text`` (what Datasette's CJK search indexes)."""
    return [b for token in _TOKEN.findall(text) if _CJK_CHAR.match(token)
            for b in cjk_bigrams(token)]


def has_cjk(text: str) -> bool:
    return _CJK_CHAR.search(text) is not None


def tokenize(text: str) -> list[str]:
    """Lower-case word tokens, stop words removed, Snowball-stemmed; CJK runs as bigrams.

    Any string is a valid query: there is no query syntax to inject into.
    """
    out: list[str] = []
    for token in _TOKEN.findall(text.lower()):
        if _CJK_CHAR.match(token):
            out += cjk_bigrams(token)
        elif token not in STOP_WORDS:
            out.append(_stemmer.stemWord(token))
    return out


class TermTable:
    """Term ids for one ingest run; new terms are appended to ``bm25_vocab``."""

    # Distinct lower-cased words remembered between chunks; past this the memo starts over.
    WORD_MEMO_LIMIT = 1_000_000

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        self.ids = dict(conn.execute("SELECT term, term_id FROM bm25_vocab"))
        self.next_id = max(self.ids.values(), default=-1) + 1
        self.new_terms: list[tuple[str, int]] = []
        # token -> its term ids (none for a stop word, a bigram each for a CJK run): each
        # distinct token is stemmed or split once per run.
        self._word_ids: dict[str, tuple[int, ...]] = {}

    def has_cjk_terms(self) -> bool:
        """Whether any stored term holds CJK text (tokenized whole, before bigrams)."""
        return has_cjk("\n".join(self.ids))

    def _word_id(self, word: str) -> tuple[int, ...]:
        if _CJK_CHAR.match(word):
            return tuple(self._term_id(t) for t in cjk_bigrams(word))
        if word in STOP_WORDS:
            return ()
        return (self._term_id(_stemmer.stemWord(word)),)

    def _term_id(self, term: str) -> int:
        tid = self.ids.get(term)
        if tid is None:
            tid = self.ids[term] = self.next_id
            self.next_id += 1
            self.new_terms.append((term, tid))
        return tid

    def encode(self, text: str) -> tuple[int, bytes, bytes]:
        """``(token count, term ids, term frequencies)`` of ``text``, as :func:`tokenize` counts it."""
        memo = self._word_ids
        if len(memo) > self.WORD_MEMO_LIMIT:
            memo.clear()
        counts: dict[int, int] = {}
        length = 0
        for word, n in Counter(_TOKEN.findall(text.lower())).items():
            tids = memo.get(word)
            if tids is None:
                tids = memo[word] = self._word_id(word)
            for tid in tids:
                length += n
                counts[tid] = counts.get(tid, 0) + n
        term_ids = array("i", sorted(counts))
        freqs = array("i", [counts[t] for t in term_ids])
        return length, term_ids.tobytes(), freqs.tobytes()

    def flush(self) -> None:
        if self.new_terms:
            self.conn.executemany(
                "INSERT INTO bm25_vocab(term, term_id) VALUES (?, ?)", self.new_terms
            )
            self.new_terms = []


def settings() -> dict:
    """The scoring settings the stored weights depend on (the manifest's ``bm25`` record)."""
    return {"k1": K1, "b": B, "idf": IDF_UNIT}


def idf_of(n, df):
    """BM25's IDF (the Lucene form, never negative) of a term in ``df`` of ``n`` units.

    The units are documents (see adr/0018-bm25-over-chunks.md): a term that a long
    document repeats in each of its chunks is not thereby more common.
    """
    return np.log1p((n - df + 0.5) / (df + 0.5))


def rebuild_postings(conn: sqlite3.Connection, k1: float = K1, b: float = B) -> None:
    """Recompute every posting weight from ``bm25_chunk_terms`` (vectorised)."""
    rows = conn.execute(
        "SELECT t.id, t.length, t.term_ids, t.term_freqs, c.document_id FROM bm25_chunk_terms t "
        "JOIN chunks c ON c.id = t.id ORDER BY t.id"
    ).fetchall()
    conn.execute("DELETE FROM bm25_postings")
    if not rows:
        conn.execute("DELETE FROM bm25_vocab")
        return
    chunk_ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    lengths = np.fromiter((r[1] for r in rows), dtype=np.float64, count=len(rows))
    term_ids = np.frombuffer(b"".join(r[2] for r in rows), dtype=np.int32)
    freqs = np.frombuffer(b"".join(r[3] for r in rows), dtype=np.int32).astype(np.float64)
    per_chunk = np.fromiter((len(r[2]) // 4 for r in rows), dtype=np.int64, count=len(rows))
    # Documents numbered in chunk row order (a document's chunks are written together).
    ordinal: dict[str, int] = {}
    doc_of_chunk = np.fromiter(
        (ordinal.setdefault(r[4], len(ordinal)) for r in rows), dtype=np.int64, count=len(rows)
    )
    avgdl = max(lengths.mean(), 1e-9)
    vocab_size = int(term_ids.max()) + 1 if term_ids.size else 0
    order = np.argsort(term_ids, kind="stable")
    sorted_terms = term_ids[order]
    owner_doc = np.repeat(doc_of_chunk, per_chunk)[order]
    # Document frequency: (term, document) pairs. Within a term the postings follow row
    # order, so when ordinals rise with row ids a document's postings are adjacent.
    if np.all(np.diff(doc_of_chunk) >= 0):
        first = np.ones(sorted_terms.size, dtype=bool)
        first[1:] = (sorted_terms[1:] != sorted_terms[:-1]) | (owner_doc[1:] != owner_doc[:-1])
        df = np.bincount(sorted_terms[first], minlength=vocab_size)
    else:
        pairs = np.unique(sorted_terms.astype(np.int64) * len(ordinal) + owner_doc)
        df = np.bincount(pairs // len(ordinal), minlength=vocab_size)
    idf = idf_of(len(ordinal), df)
    dl = np.repeat(lengths, per_chunk)
    weights = idf[term_ids] * freqs * (k1 + 1) / (freqs + k1 * (1 - b + b * dl / avgdl))
    owner = np.repeat(chunk_ids, per_chunk)
    owner = owner[order].astype(np.int32)
    weights = weights[order].astype(np.float32)
    present = np.flatnonzero(df)
    bounds = np.searchsorted(sorted_terms, present)
    ends = np.append(bounds[1:], sorted_terms.size)
    conn.executemany(
        "INSERT INTO bm25_postings(term_id, chunk_ids, weights) VALUES (?, ?, ?)",
        (
            (int(t), owner[s:e].tobytes(), weights[s:e].tobytes())
            for t, s, e in zip(present, bounds, ends)
        ),
    )
    tie_order = [r[0] for r in conn.execute("SELECT id FROM chunks ORDER BY content_hash, id")]
    conn.execute(
        "INSERT INTO bm25_postings(term_id, chunk_ids, weights) VALUES (?, ?, x'')",
        (TIE_ORDER_ID, np.asarray(tie_order, dtype=np.int32).tobytes()),
    )
    documents = np.full(int(chunk_ids[-1]) + 1, -1, dtype=np.int32)
    documents[chunk_ids] = doc_of_chunk
    conn.execute(
        "INSERT INTO bm25_postings(term_id, chunk_ids, weights) VALUES (?, ?, x'')",
        (DOCUMENT_MAP_ID, documents.tobytes()),
    )
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS _df(term_id INTEGER PRIMARY KEY, n INTEGER)")
    conn.execute("DELETE FROM _df")
    conn.executemany(
        "INSERT INTO _df VALUES (?, ?)", ((int(t), int(df[t])) for t in present)
    )
    conn.execute("DELETE FROM bm25_vocab WHERE term_id NOT IN (SELECT term_id FROM _df)")
    conn.execute(
        "UPDATE bm25_vocab SET doc_freq = (SELECT n FROM _df WHERE _df.term_id = bm25_vocab.term_id)"
    )
    conn.execute("DROP TABLE _df")
