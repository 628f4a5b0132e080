"""The plain BM25 page (search.py's ``_bm25_page``) against the general path it stands in for.

A BM25 search with nothing filtered, hidden, reranked or floored skips the ranking context;
its response must be the general path's, field for field (timings aside), for every query
shape the rank paths test covers, at every page, grouped or not, and through each surface's
entry point. The general path is reached by making the page decline."""

import pytest

from groundkit_datasette.retrieval import search as S
from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.retrieval.models import SearchRequest
from groundkit_datasette.retrieval.permissions import Reader, ScopedCollection
from groundkit_datasette.surfaces import serialize

from .test_bm25_rank_paths import QUERIES, corpus  # noqa: F401  (the fixture)


@pytest.fixture(scope="module")
def collection(corpus):  # noqa: F811
    return Collection.from_path(corpus / "paths.sqlite3")


def _general(monkeypatch):
    monkeypatch.setattr(S, "_bm25_page", lambda *args: None)


def _without_timings(fields):
    assert set(fields["timings_ms"]) == {"bm25_ms", "total_ms"}
    return {k: v for k, v in fields.items() if k != "timings_ms"}


def _pair(collection, request, monkeypatch):
    fast, fast_builtin = S._search(collection, request, None)
    with monkeypatch.context() as m:
        _general(m)
        general, general_builtin = S._search(collection, request, None)
    assert fast_builtin and general_builtin
    return _without_timings(fast), _without_timings(general)


@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("top_k,offset,group", [(10, 0, False), (3, 0, True), (5, 5, False),
                                                 (20, 40, True), (1, 0, False)])
def test_the_page_is_the_general_paths_answer(collection, monkeypatch, query, top_k, offset, group):
    request = SearchRequest(query=query, mode="bm25", top_k=top_k, offset=offset,
                            group_by_document=group)
    fast, general = _pair(collection, request, monkeypatch)
    assert fast == general
    assert list(fast) == list(general)  # the same field order: the JSON body's
    for a, b in zip(fast["hits"], general["hits"]):
        assert list(a) == list(b)


def test_the_page_is_taken_and_declines_where_it_must(collection, monkeypatch):
    taken = []
    real = S._bm25_page

    def spy(*args):
        out = real(*args)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(S, "_bm25_page", spy)
    S._search(collection, SearchRequest(query="ferry", mode="bm25", top_k=10), None)
    assert taken == [True]
    # Filtered, floored, or deeper than the rows read along with the ranking: not taken.
    S._search(collection, SearchRequest(query="ferry", mode="bm25", top_k=10, source="hr/"), None)
    S._search(collection, SearchRequest(query="ferry", mode="bm25", top_k=10, min_score=0.1), None)
    assert taken == [True]
    S._search(collection, SearchRequest(query="ferry", mode="bm25", top_k=50, offset=40), None)
    assert taken == [True, False]


def test_a_reader_with_hidden_documents_takes_the_general_path(collection, monkeypatch):
    taken = []
    monkeypatch.setattr(S, "_bm25_page", lambda *a: taken.append(1))
    scoped = ScopedCollection(collection, Reader(None, frozenset()))
    response = scoped.search(SearchRequest(query="harbour", mode="bm25", top_k=10))
    assert not taken
    assert response.hits and all(not h.source.startswith("hr/") for h in response.hits)


def test_each_surface_answers_the_same_through_the_page(collection, monkeypatch):
    request = SearchRequest(query="tide gull ferry harbour uniq3 uniq250", mode="bm25", top_k=7)
    fast = S.search_plain(collection, request)
    model = S.run_search(collection, request)
    with monkeypatch.context() as m:
        _general(m)
        general = S.search_plain(collection, request)
        general_model = S.run_search(collection, request)
    assert _without_timings(serialize.payload(fast)) == _without_timings(serialize.payload(general))
    dumped, general_dumped = model.model_dump(mode="json"), general_model.model_dump(mode="json")
    assert _without_timings(dumped) == _without_timings(general_dumped)
    assert _without_timings(dumped) == _without_timings(serialize.payload(fast))


def _copy(corpus, tmp_path):  # noqa: F811
    import shutil

    for f in (corpus).iterdir():
        if f.name.startswith("paths.sqlite3"):
            shutil.copy(f, tmp_path / f.name)
    return tmp_path / "paths.sqlite3"


def test_a_collection_without_a_stored_tie_order_is_answered_by_the_general_path(
        corpus, tmp_path, monkeypatch):  # noqa: F811
    import sqlite3

    from groundkit_datasette.retrieval import bm25

    path = _copy(corpus, tmp_path)
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM bm25_postings WHERE term_id = ?", (bm25.TIE_ORDER_ID,))
    col = Collection.from_path(path)
    taken = []
    real = S._bm25_page
    monkeypatch.setattr(S, "_bm25_page", lambda *a: taken.append(real(*a)) or taken[-1])
    fields, _ = S._search(col, SearchRequest(query="ferry", mode="bm25", top_k=10), None)
    assert taken == [None]
    assert len(fields["hits"]) == 10


@pytest.mark.parametrize("page", [True, False])
def test_a_missing_chunk_row_is_reported_as_an_inconsistent_index(corpus, tmp_path, monkeypatch,
                                                                   page):  # noqa: F811
    import sqlite3

    from groundkit_datasette.errors import IndexInconsistent

    path = _copy(corpus, tmp_path)
    first = S._search(Collection.from_path(path), SearchRequest(query="ferry", mode="bm25",
                                                                top_k=3), None)[0]
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute("DELETE FROM chunks WHERE chunk_id = ?", (first["hits"][1]["chunk_id"],))
    if not page:
        _general(monkeypatch)
    with pytest.raises(IndexInconsistent):
        S._search(Collection.from_path(path), SearchRequest(query="ferry", mode="bm25", top_k=3),
                  None)
