"""The BM25 ranking's shortcuts (adr/0039-bm25-per-query-overhead.md) against the plain
computation, on one real collection built by ingest: a one-term query served from the term's
cached head, the candidate paths of a longer query, ``matched_terms`` from a set of a short
list's ids, a bitmap of a dense one or a ``searchsorted`` of a long, sparse one, and a reader
with hidden documents.

The corpus is made for the edges: a term in every chunk (longer than the head and the set
limit), chunks of equal length (ties at every cut), a word in one chunk only, CJK text,
stop words and repeated words in the queries.
"""

import json

import numpy as np
import pytest

from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.indexing.schema import connect_readonly
from groundkit_datasette.retrieval import bm25, rankers
from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.retrieval.models import SearchRequest
from groundkit_datasette.retrieval.permissions import Reader, ScopedCollection

from .test_bm25_topk import _reference

QUERIES = [
    "harbour",                      # every chunk: past the head and the set limit
    "ferry",                        # a third of the chunks, many tied
    "uniq7",                        # one posting
    "harbour harbour ferry",        # a repeated word counts twice
    "ferry ferry",                  # one term, repeated: not the head path
    "the harbour of ferries",       # stop words and a stemmed plural
    "the and of",                   # only stop words
    "zzunknown harbour",            # a word the collection lacks
    "東京大学",                      # CJK bigrams
    "東京 harbour ferry tide",
    "tide gull ferry harbour uniq3 uniq250",
    "Harbour FERRY",                # case
    "ferries harbour ferry",        # two words, one stem: both reported
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("rank-paths")
    src = root / "src"
    (src / "hr").mkdir(parents=True)
    (src / "hr" / ".groundkit-acl.json").write_text(json.dumps({"groups": ["hr"]}))
    for i in range(330):
        words = ["harbour", f"uniq{i}"]
        if i % 3 == 0:
            words.append("ferry")
        if i % 7 == 0:
            words += ["tide", "tide"]
        if i % 11 == 0:
            words.append("gull")
        if i % 13 == 0:
            words.append("東京大学の研究")
        folder = src / "hr" if i % 10 == 0 else src
        (folder / f"d{i:03d}.txt").write_text(" ".join(words) + ".\n")
    ingest([src], collection="paths", index_dir=root / "index", embedder="none")
    return root / "index"


def _postings(col, term):
    row = col.query("SELECT p.chunk_ids FROM bm25_vocab v JOIN bm25_postings p "
                    "ON p.term_id = v.term_id WHERE v.term = ?", (term,))
    return set(np.frombuffer(row[0][0], dtype=np.int32).tolist()) if row else set()


def test_every_path_ranks_as_the_reference_scorer(corpus):
    """Same chunks, float32 scores and tie order at depths around the head's size (128), one
    open collection answering every query twice (the head and the sets are kept)."""
    with Collection.open("paths", index_dir=corpus) as col:
        assert col.query("SELECT count(*) FROM chunks")[0][0] == 330
        for _ in range(2):
            for query in QUERIES:
                for depth in (1, 10, 11, 127, 128, 129, 400):
                    assert rankers.bm25_ranked(col, query, depth, None) == \
                        _reference(col, query, depth), (query, depth)
        # The one-term queries were served from the term's head.
        assert col.postings_cache["harbour"]._head is not None
        assert col.postings_cache["uniq7"]._head is not None


def test_matched_terms_equals_membership_in_the_postings(corpus):
    """Every row id (and ids outside the postings), given as a list and as an array, for
    terms answered from a set (short lists) and by searchsorted (a list over 64)."""
    with Collection.open("paths", index_dir=corpus) as col:
        top = col.query("SELECT max(id) FROM chunks")[0][0]
        rows = list(range(0, top + 3))
        assert len(_postings(col, "harbour")) > bm25.Postings.SET_MAX
        for query in QUERIES:
            words = dict(bm25.query_words(query))
            holders = {w: _postings(col, t) for w, t in words.items()}
            want = [[w for w in words if r in holders[w]] for r in rows]
            assert col.matched_terms(query, rows) == want, query
            assert col.matched_terms(query, np.array(rows[::-1])) == want[::-1], query
            assert bm25.matched_terms(connect_readonly(col.path), query, rows) == want  # no cache
            twice = rows[:40] + rows[:40]  # a row given twice: equal, separate lists
            got = col.matched_terms(query, twice)
            assert got == want[:40] * 2, query
            assert all(a is not b for a, b in zip(got[:40], got[40:]))
        hits = col.search(query="the harbour harbour ferry 東京", mode="bm25", top_k=10).hits
        assert {tuple(h.matched_terms) for h in hits} <= {
            ("harbour", "ferry", "東京"), ("harbour", "ferry"), ("harbour", "東京"), ("harbour",)}


def test_a_reader_with_hidden_documents_ranks_as_the_plain_computation(corpus):
    """The hidden path scores on the reader's view (bm25.score over views.ReaderView) and
    then shares the ordering step with the fast path: its hits equal every visible chunk's
    score sorted by (-score, tie rank)."""
    with Collection.open("paths", index_dir=corpus) as col:
        view = ScopedCollection(col, Reader(None, frozenset()))
        hidden = {r[0] for r in col.query(
            "SELECT c.id FROM chunks c JOIN documents d USING (document_id) "
            "WHERE d.source LIKE 'hr/%'")}
        assert hidden
        reader = col.bm25_view(col.reader_view(view.access().hidden_documents))
        assert set(reader.hidden_rows.tolist()) == hidden
        ranks = col.tie_ranks()
        chunk_of = dict(col.query("SELECT id, chunk_id FROM chunks"))
        for query in QUERIES:
            ids, scores = col.bm25_scores(query, reader)
            plain = sorted(((-s, int(ranks[i]), int(i)) for i, s in zip(ids.tolist(), scores.tolist())
                            if i not in hidden))
            want = [(chunk_of[i], -s) for s, _r, i in plain[:10]]
            hits = view.search(SearchRequest(query=query, mode="bm25", top_k=10)).hits
            assert [(h.chunk_id, h.score) for h in hits] == want, query


def _membership(col, query, rows):
    """matched_terms as the plain computation: each distinct word (query order) whose term's
    stored postings hold the row."""
    words = dict(bm25.query_words(query))
    holders = {w: _postings(col, t) for w, t in words.items()}
    return [[w for w in words if r in holders[w]] for r in rows]


def test_matched_terms_of_a_one_term_ranking_come_from_its_head(corpus):
    """A one-term search's ranking leaves its rows (PostingsCache.held) for the same search's
    matched_terms: the same answer as asking the postings, for the rows as ranked, a later
    page, a reordered subset, rows outside the ranking (asked again), and another query's
    rows (never answered from this query's entry)."""
    one_term = ["harbour", "ferry", "uniq7", "the harbour of", "zzunknown harbour",
                "Harbour", "東京"]
    with Collection.open("paths", index_dir=corpus) as col:
        cache = col.postings_cache
        outside = [r[0] for r in col.query("SELECT id FROM chunks ORDER BY id")]
        for query in one_term:
            for depth in (1, 10, 128):
                ids, _ = rankers.bm25_top_rows(col, query, depth, None)
                assert ids and cache.held[0] == query, query
                for rows in (ids, ids[3:], ids[::-1][:5], ids + outside[:40],
                             outside[-5:]):
                    assert col.matched_terms(query, rows) == \
                        _membership(col, query, rows), (query, depth)
                other = "tide gull"
                assert col.matched_terms(other, ids) == \
                    _membership(col, other, ids)
        # The whole search: each hit's matched_terms and lexical_match (any chunk holding a
        # query word, on this page or not) as the postings say.
        for query in one_term:
            response = col.search(query=query, mode="bm25", top_k=10, offset=2)
            rows = [r[0] for r in (col.query("SELECT id FROM chunks WHERE chunk_id = ?",
                                             (h.chunk_id,))[0] for h in response.hits)]
            assert [h.matched_terms for h in response.hits] == _membership(col, query, rows)
            assert response.lexical_match is any(_postings(col, t) for _, t in bm25.query_words(query))


def _words_reference(query):
    """query_words as the general loop computes it: every token of the writer's pattern,
    lower-cased, CJK runs as bigrams, stop words left out, each word stemmed alone."""
    from groundkit_datasette.indexing import tokenizer

    out = []
    for token in tokenizer.TOKEN.findall(query.lower()):
        if tokenizer.CJK_CHAR.match(token):
            out += [(b, b) for b in tokenizer.cjk_bigrams(token)]
        elif token not in tokenizer.STOP_WORDS:
            out.append((token, tokenizer.STEMMER.stemWord(token)))
    return tuple(out)


TOKEN_QUERIES = QUERIES + [
    "Running runners RAN easily", "don't stop-words: the, a, an!", "x_y z9 3.14 a1b2",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9", "\u212aelvin", "Stra\u00dfe", "", "   ", "the",
    "cells cell CELLS cellular", "東京 and tokyo", "ﬁle ligature", "İstanbul",
]


def test_query_words_ascii_path_equals_the_general_tokenizer():
    """The ASCII path (one stemWords call) gives the general loop's words and terms for
    ASCII queries, and non-ASCII ones (accents, a Kelvin sign that lower-cases to ASCII,
    CJK) still take the loop; the terms are what ingest's tokenize indexes."""
    bm25.clear_query_caches()
    for query in TOKEN_QUERIES:
        assert bm25.query_words(query) == _words_reference(query), query
        assert [t for _, t in bm25.query_words(query)] == bm25.tokenize(query), query


def test_the_query_plan_matches_its_definitions():
    """query_terms (sorted distinct terms, repeat counts) and _match_plan (distinct words in
    query order, each with its term's index) from the one cached plan, and
    clear_query_caches (and the older per-function names) forget them all."""
    from collections import Counter

    for query in TOKEN_QUERIES:
        tokens = [t for _, t in _words_reference(query)]
        terms = tuple(sorted(set(tokens)))
        counts = None if len(terms) == len(tokens) else tuple(Counter(tokens)[t] for t in terms)
        assert bm25.query_terms(query) == (terms, counts), query
        plan_terms, words = bm25._match_plan(query)
        assert plan_terms == terms
        assert words == tuple((w, terms.index(t)) for w, t in dict(_words_reference(query)).items())
    for clear in (bm25.clear_query_caches, bm25.query_terms.cache_clear,
                  bm25._match_plan.cache_clear):
        bm25.query_terms("harbour ferry")
        clear()
        assert bm25.query_words.cache_info().currsize == 0
        assert bm25._plan.cache_info().currsize == 0


@pytest.mark.parametrize("size, last, path", [
    (40, 5_000, "set"), (300, 5_000, "bitmap"), (300, 100_000, "searchsorted"),
    (1, 0, "set"), (65, 64, "bitmap"),
])
def test_each_way_of_answering_holds_is_membership(size, last, path):
    """Each of the three ways ``Postings.holds`` answers (chosen by the list's length and
    density) against a set of the ids, for row ids inside, between, before and past them."""
    rng = np.random.default_rng(size * 7 + last)
    ids = np.sort(rng.choice(np.arange(last + 1), size=size, replace=False)).astype(np.int32)
    ids[-1] = last
    ids = np.unique(ids)
    postings = bm25.Postings(ids, np.ones(ids.size, np.float32))
    members = set(ids.tolist())
    rows = sorted(set(rng.integers(0, last + 50, 300).tolist()) | set(ids[:25].tolist())
                  | {0, last, last + 1, last + 8, last + 9, (last | 7) + 1})
    want = [r in members for r in rows]
    assert any(want) and not all(want)
    assert postings.holds(rows, []) == want
    assert postings.holds(rows[::-1], []) == want[::-1]  # from what the first call derived
    made = {"set": postings._set is not None, "bitmap": postings._bits is not None}
    assert made == {"set": path == "set", "bitmap": path == "bitmap"}
