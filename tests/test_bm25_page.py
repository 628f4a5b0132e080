"""A plain BM25 page (nothing filtered, hidden, reranked or floored) through the one search
path (adr/0054: the plain page's own path is gone), for every query shape the rank paths test
covers, at every page, grouped or not, and through each surface's entry point: the JSON
payload equals the model's dump, field for field and in field order."""

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


def _without_timings(fields):
    assert set(fields["timings_ms"]) == {"bm25_ms", "total_ms"}
    return {k: v for k, v in fields.items() if k != "timings_ms"}


@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("top_k,offset,group", [(10, 0, False), (3, 0, True), (5, 5, False),
                                                 (20, 40, True), (1, 0, False)])
def test_the_payload_is_the_models_dump(collection, query, top_k, offset, group):
    request = SearchRequest(query=query, mode="bm25", top_k=top_k, offset=offset,
                            group_by_document=group)
    fields, builtin = S._search(collection, request, None)
    assert builtin
    plain = _without_timings(serialize.payload(S.plain_response(fields, True)))
    dumped = _without_timings(S.run_search(collection, request).model_dump(mode="json"))
    assert plain == dumped
    assert list(plain) == list(dumped)  # the same field order: the JSON body's
    for a, b in zip(plain["hits"], dumped["hits"]):
        assert list(a) == list(b)
    for rank, hit in enumerate(plain["hits"], offset + 1):  # BM25's own rank and score
        assert hit["components"] == {"bm25": {"rank": rank, "score": hit["score"]}}


def test_a_reader_with_hidden_documents_sees_none_of_them(collection):
    scoped = ScopedCollection(collection, Reader(None, frozenset()))
    response = scoped.search(SearchRequest(query="harbour", mode="bm25", top_k=10))
    assert response.hits and all(not h.source.startswith("hr/") for h in response.hits)


def test_each_surface_answers_the_same(collection):
    request = SearchRequest(query="tide gull ferry harbour uniq3 uniq250", mode="bm25", top_k=7)
    plain = S.search_plain(collection, request)
    model = S.run_search(collection, request)
    dumped = model.model_dump(mode="json")
    assert _without_timings(dumped) == _without_timings(serialize.payload(plain))
    assert _without_timings(plain.model().model_dump(mode="json")) == _without_timings(dumped)


def _copy(corpus, tmp_path):  # noqa: F811
    import shutil

    for f in (corpus).iterdir():
        if f.name.startswith("paths.sqlite3"):
            shutil.copy(f, tmp_path / f.name)
    return tmp_path / "paths.sqlite3"


def test_a_collection_without_a_stored_tie_order_is_answered(corpus, tmp_path):  # noqa: F811
    import sqlite3

    from groundkit_datasette.retrieval import bm25

    path = _copy(corpus, tmp_path)
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM bm25_postings WHERE term_id = ?", (bm25.TIE_ORDER_ID,))
    col = Collection.from_path(path)
    fields, _ = S._search(col, SearchRequest(query="ferry", mode="bm25", top_k=10), None)
    assert len(fields["hits"]) == 10


def test_a_missing_chunk_row_is_reported_as_an_inconsistent_index(corpus, tmp_path):  # noqa: F811
    import sqlite3

    from groundkit_datasette.errors import IndexInconsistent

    path = _copy(corpus, tmp_path)
    first = S._search(Collection.from_path(path), SearchRequest(query="ferry", mode="bm25",
                                                                top_k=3), None)[0]
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute("DELETE FROM chunks WHERE chunk_id = ?", (first["hits"][1]["chunk_id"],))
    with pytest.raises(IndexInconsistent):
        S._search(Collection.from_path(path), SearchRequest(query="ferry", mode="bm25", top_k=3),
                  None)
