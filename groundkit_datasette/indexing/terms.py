"""Term ids for one ingest run: each chunk's text as (token count, term ids, term frequencies),
the rows of ``bm25_chunk_terms`` that the postings are built from (indexing/postings.py).
"""

import sqlite3
from array import array
from collections import Counter
from itertools import chain

import numpy as np

from .tokenizer import CJK_CHAR, STEMMER, STOP_WORDS, ascii_words, cjk_bigrams, has_cjk, words


class TermTable:
    """Term ids for one ingest run; new terms are appended to ``bm25_vocab``."""

    # Distinct lower-cased words remembered between chunks; past this the memo starts over.
    WORD_MEMO_LIMIT = 1_000_000

    # Past this many stored terms they are looked up as met instead of loaded at start: an
    # incremental run over a large collection meets a few thousand of its 200k terms.
    LOAD_ALL_TERMS = 20_000

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        self.next_id = conn.execute("SELECT coalesce(max(term_id), -1) + 1 FROM bm25_vocab").fetchone()[0]
        # ``ids`` holds every stored term, or (past LOAD_ALL_TERMS) those met so far.
        self._complete = self.next_id <= self.LOAD_ALL_TERMS
        self.ids = dict(conn.execute("SELECT term, term_id FROM bm25_vocab")) if self._complete else {}
        self.new_terms: list[tuple[str, int]] = []
        # token -> its term id (-1 for a stop word; a CJK run: a tuple, a bigram each): each
        # distinct token is stemmed or split once per run.
        self._word_ids: dict[str, int | tuple[int, ...]] = {}
        self._cjk_words: set[str] = set()  # the memo's words that stand for bigrams

    def has_cjk_terms(self) -> bool:
        """Whether any stored term holds CJK text (tokenized whole, before bigrams)."""
        if self._complete:
            return has_cjk("\n".join(self.ids))
        return any(has_cjk(term) for (term,) in self.conn.execute("SELECT term FROM bm25_vocab"))

    def _memo(self) -> dict:
        """The word memo, started over once past its limit."""
        if len(self._word_ids) > self.WORD_MEMO_LIMIT:
            self._word_ids.clear()
            self._cjk_words.clear()
        return self._word_ids

    def _word_id(self, word: str) -> int | tuple[int, ...]:
        if CJK_CHAR.match(word):
            self._cjk_words.add(word)
            return tuple(self._term_id(t) for t in cjk_bigrams(word))
        if word in STOP_WORDS:
            return -1
        return self._term_id(STEMMER.stemWord(word))

    def _term_id(self, term: str) -> int:
        tid = self.ids.get(term)
        if tid is None and not self._complete:
            found = self.conn.execute("SELECT term_id FROM bm25_vocab WHERE term = ?", (term,)).fetchone()
            if found is not None:
                tid = self.ids[term] = found[0]
        if tid is None:
            tid = self.ids[term] = self.next_id
            self.next_id += 1
            self.new_terms.append((term, tid))
        return tid

    def encode(self, text: str) -> tuple[int, bytes, bytes]:
        """``(token count, term ids, term frequencies)`` of ``text``, as :func:`tokenize` counts it."""
        memo = self._memo()
        counts: dict[int, int] = {}
        counted = counts.get
        length = 0
        tally = Counter(words(text.lower()))
        for word, n in tally.items():
            tid = memo.get(word)
            if tid is None:
                tid = memo[word] = self._word_id(word)
            if type(tid) is int:  # one term (most words), or a stop word (-1)
                if tid >= 0:
                    length += n
                    counts[tid] = counted(tid, 0) + n
                continue
            for t in tid:  # a CJK run's bigrams
                length += n
                counts[t] = counted(t, 0) + n
        term_ids = array("i", sorted(counts))
        freqs = array("i", [counts[t] for t in term_ids])
        return length, term_ids.tobytes(), freqs.tobytes()

    def encode_many(self, texts: list[str]) -> list[tuple[int, bytes, bytes]]:
        """:meth:`encode` of each text, the same values and term ids, for a batch at once:
        words are looked up in one pass over the batch and counted with numpy, instead of a
        Python loop over every chunk's distinct words (a third of a BM25-only ingest)."""
        memo = self._memo()
        # An ASCII text's words are bytes (the memo keys them apart from the str of others).
        per_text = [ascii_words(text) if text.isascii() else words(text.lower()) for text in texts]
        flat = list(chain.from_iterable(per_text))
        distinct = dict.fromkeys(flat)
        for word in distinct:  # new words in order of first use, as encode meets them
            if word not in memo:
                memo[word] = self._word_id(word if type(word) is str else word.decode("ascii"))
        if self._cjk_words and not self._cjk_words.isdisjoint(distinct):  # bigram ids: rare
            return [self.encode(text) for text in texts]
        ids = list(map(memo.__getitem__, flat))
        if not ids:
            return [(0, b"", b"") for _ in texts]
        term = np.fromiter(ids, dtype=np.int64, count=len(ids))
        text_of = np.repeat(np.arange(len(texts), dtype=np.int64), [len(ws) for ws in per_text])
        kept = term >= 0  # stop words are -1
        term, text_of = term[kept], text_of[kept]
        lengths = np.bincount(text_of, minlength=len(texts)).tolist()
        keys, freqs = np.unique(text_of * self.next_id + term, return_counts=True)  # sorted: text, term
        terms = (keys % self.next_id).astype(np.int32)
        freqs = freqs.astype(np.int32)
        bounds = np.searchsorted(keys // self.next_id, np.arange(len(texts) + 1)).tolist()
        return [(lengths[i], terms[bounds[i]:bounds[i + 1]].tobytes(), freqs[bounds[i]:bounds[i + 1]].tobytes())
                for i in range(len(texts))]

    def flush(self) -> None:
        if self.new_terms:
            self.conn.executemany(
                "INSERT INTO bm25_vocab(term, term_id) VALUES (?, ?)", self.new_terms
            )
            self.new_terms = []
