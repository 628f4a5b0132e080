"""The one serializer of the JSON API and MCP (surfaces/serialize.py): the JSON API's body
parses to exactly MCP's structured result and to what the JSON API sent before
(``json.dumps`` of ``model_dump(mode="json")``), on real searches of real collections, the
fast path's models and the validated ones alike; a republished collection serves its own
rows."""

import json

import pytest

from groundkit_datasette.collection.ingest import ingest
from groundkit_datasette.retrieval import search as gk_search
from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.retrieval.models import ComponentScore, SearchResponse
from groundkit_datasette.surfaces import serialize

from .bird_support import build_birds


@pytest.fixture
def built(tmp_path):
    return build_birds(tmp_path, {
        # Non-ASCII text, quotes, backslashes and control characters: the escaping must match.
        "unicode.md": '# Faucon crécerelle\n\nLe "faucon" \\ kestrel — 隼 falcon\ttab\n'})


def _check(response):
    want = response.model_dump(mode="json")
    assert serialize.payload(response) == want
    text = serialize.body(response)
    assert json.loads(text) == want == json.loads(json.dumps(want))
    # Field order too: a client reading the text sees the fields in the model's order.
    got = json.loads(text)
    assert list(got) == list(want)
    assert [list(h) for h in got.get("hits", [])] == [list(h) for h in want.get("hits", [])]


SCENARIOS = [
    dict(query="kestrel falcon", mode="bm25", top_k=5),
    dict(query="kestrel kestrel meadow", mode="bm25", top_k=10, group_by_document=True),
    dict(query="falcon migration", mode="bm25", top_k=3, offset=3),
    dict(query="faucon crécerelle 隼", mode="bm25"),
    dict(query="stoops speed compared", mode="bm25", top_k=3),
    dict(query="zzunknown", mode="bm25"),  # no hit: lexical_match false and its note
]


@pytest.mark.parametrize("fields", SCENARIOS, ids=[s["query"] for s in SCENARIOS])
def test_the_serializer_writes_what_pydantic_wrote(built, fields):
    corpus, index_dir = built
    with Collection.open("birds", index_dir=index_dir, base_dir=corpus) as col:
        _check(col.search(**fields))
        _check(col.search(**fields))  # rows and citations kept by the open collection
        # The path a plugin's mode takes (validated models) serializes the same way.
        original = gk_search.build_response
        try:
            gk_search.build_response = lambda f, *, trusted: original(f, trusted=False)
            _check(col.search(**fields))
        finally:
            gk_search.build_response = original


def test_components_without_a_rank_and_stale_flags_serialize_alike(built):
    """A reranked hit's component has no rank (null); source_changed is true, false or null."""
    corpus, index_dir = built
    with Collection.open("birds", index_dir=index_dir, base_dir=corpus) as col:
        response = col.search(query="kestrel falcon", mode="bm25", top_k=3)
    hits = [h.model_copy(update=dict(
                components={"bm25": h.components["bm25"], "rerank": ComponentScore(score=0.5)},
                source_changed=flag, score=float(i) + 0.1))
            for i, (h, flag) in enumerate(zip(response.hits, (True, None, False)))]
    _check(response.model_copy(update={"hits": hits}))
    _check(SearchResponse(**dict(response.model_dump(), hits=[h.model_dump() for h in hits])))


def test_a_republished_collection_serializes_its_new_text(built):
    """Kept rows and citations belong to one open collection (one published version): the
    collection opened on a new version never gets the old version's text in its JSON."""
    corpus, index_dir = built
    with Collection.open("birds", index_dir=index_dir, base_dir=corpus) as col:
        old = col.search(query="marker4", mode="bm25")
        old_body = serialize.body(old)
    path = corpus / old.hits[0].source
    path.write_text(path.read_text().replace("marker4", "marker4 osprey"))
    ingest([corpus], collection="birds", index_dir=index_dir, embedder="none")
    with Collection.open("birds", index_dir=index_dir, base_dir=corpus) as col:
        new = col.search(query="marker4", mode="bm25")
        new_body = serialize.body(new)
        _check(new)
    assert b"osprey" in new_body and b"osprey" not in old_body
    assert json.loads(new_body)["hits"][0]["content"] == new.hits[0].content


def test_other_responses_go_through_pydantic(built):
    corpus, index_dir = built
    with Collection.open("birds", index_dir=index_dir, base_dir=corpus) as col:
        status = col.status()
        chunk = col.fetch_chunk(col.search(query="kestrel", mode="bm25").hits[0].chunk_id)
    for response in (status, chunk):
        _check(response)
