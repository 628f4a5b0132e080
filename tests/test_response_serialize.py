"""The one serializer of the JSON API and MCP (surfaces/serialize.py): the JSON API's body
parses to exactly MCP's structured result and to what the JSON API sent before
(``json.dumps`` of ``model_dump(mode="json")``), on real searches of real collections, the
fast path's models and the validated ones alike; a republished collection serves its own
rows."""

import json

import pytest

from groundkit_datasette.indexing.ingest import ingest
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


# -- the surfaces' plain path (adr/0038): no model built for the JSON API or MCP -----------

import copy  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import httpx  # noqa: E402
from datasette.app import Datasette  # noqa: E402
from mcp import Client  # noqa: E402

from groundkit_datasette import registry as gk_registry  # noqa: E402
from groundkit_datasette.retrieval.models import PlainResponse, SearchRequest  # noqa: E402

from .test_mcp import Served, json_call, mcp_body  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent / "plugins"))
import mcp_test_models  # noqa: E402  (the test-hash embedder: dense search with no model)
import title_mode  # noqa: E402  (a plugin's search mode: the validated path)


def _ordered(value):
    """Dicts as ``(key, value)`` lists, all the way down: equal only with the same keys in
    the same order (a client reading the text sees the fields in that order)."""
    if isinstance(value, dict):
        return [(k, _ordered(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_ordered(v) for v in value]
    return value


def _steady(response: dict) -> dict:
    """A response with its timings' values left out (they differ from search to search;
    their names and order stay)."""
    return {**response, "timings_ms": list(response["timings_ms"])}


class LengthReranker:
    """A stand-in for a cross-encoder (no model can be downloaded here): longer text first."""

    model_name = "length"

    def score(self, query, texts):
        return [float(len(t)) for t in texts]


@pytest.fixture
def mixed(tmp_path):
    """The bird corpus in a collection with vectors (the test-hash embedder)."""
    corpus, index_dir = build_birds(tmp_path, {"guide.md": "# Falcons\n\nThe peregrine stoops."})
    mcp_test_models.register_all(gk_registry.pm)
    try:
        ingest([corpus], collection="mixed", index_dir=index_dir, embedder="test-hash")
        yield corpus, index_dir
    finally:
        mcp_test_models.unregister_all(gk_registry.pm)


PLAIN_SCENARIOS = [
    ("birds", dict(query="kestrel falcon", mode="bm25", top_k=5)),
    ("birds", dict(query="kestrel kestrel meadow", mode="bm25", group_by_document=True)),
    ("birds", dict(query="falcon migration", mode="bm25", top_k=3, offset=3)),
    ("birds", dict(query="faucon crécerelle 隼", mode="bm25")),
    ("birds", dict(query="zzunknown", mode="bm25")),
    ("birds", dict(query="kestrel", mode="bm25", min_score=0.5)),
    ("mixed", dict(query="kestrel falcon", mode="hybrid", top_k=4, group_by_document=True)),
    ("mixed", dict(query="peregrine", mode="dense", top_k=3, offset=1)),
    ("mixed", dict(query="kestrel meadow", mode="hybrid", min_score=0.2)),
    ("mixed", dict(query="zzunknown", mode="hybrid", top_k=2)),
    ("mixed", dict(query="kestrel falcon", mode="bm25", rerank=True, top_k=4)),
    ("mixed", dict(query="falcon", mode="hybrid", rerank=True, top_k=3, offset=2)),
]


@pytest.mark.parametrize("name,fields", PLAIN_SCENARIOS,
                         ids=[f"{n}-{f['mode']}{'-rerank' if f.get('rerank') else ''}-{f['query']}"
                              for n, f in PLAIN_SCENARIOS])
def test_the_plain_payload_is_what_the_models_dump(tmp_path, mixed, name, fields):
    """What the JSON API and MCP send (a PlainResponse, built without models) is value for
    value, key for key and in the same order what the Python API's model dumps, every
    default filled in (a reranker's component has a null rank); it validates into the model
    unchanged; its JSON text parses back to it; and building its model leaves it as it is."""
    corpus, index_dir = mixed
    if name == "birds":
        ingest([corpus], collection="birds", index_dir=index_dir, embedder="none")
    with Collection.open(name, index_dir=index_dir, base_dir=corpus,
                         reranker=LengthReranker()) as col:
        request = SearchRequest(**fields)
        plain = gk_search.search_plain(col, request)
        want = gk_search.run_search(col, request).model_dump(mode="json")
    assert type(plain) is PlainResponse
    payload = plain.payload
    assert _ordered(_steady(payload)) == _ordered(_steady(want))
    assert _ordered(SearchResponse.model_validate(payload).model_dump(mode="json")) == \
        _ordered(payload)
    assert _ordered(json.loads(serialize.body(plain))) == _ordered(payload)
    assert serialize.payload(plain) is payload
    kept = copy.deepcopy(payload)
    model = plain.model()
    assert isinstance(model, SearchResponse) and plain.model() is model
    assert _ordered(model.model_dump(mode="json")) == _ordered(payload) == _ordered(kept)
    if fields.get("rerank") and payload["hits"]:
        assert payload["hits"][0]["components"]["rerank"] == {
            "rank": None, "score": payload["hits"][0]["score"]}
    for hit in model.hits:
        assert all(isinstance(c, ComponentScore) for c in hit.components.values())


def test_a_plugins_mode_is_validated_on_the_plain_path_too(built):
    """A plugin's mode (untrusted scores) is validated into the model, and its payload is
    that model's dump."""
    corpus, index_dir = built
    gk_registry.pm.register(title_mode, name="title_mode_serialize")
    try:
        with Collection.open("birds", index_dir=index_dir, base_dir=corpus) as col:
            request = SearchRequest(query="field guide unicode", mode="title")
            plain = gk_search.search_plain(col, request)
            want = gk_search.run_search(col, request).model_dump(mode="json")
    finally:
        gk_registry.pm.unregister(name="title_mode_serialize")
    assert plain.payload["hits"] and plain.payload["mode"] == "title"
    assert _ordered(plain.payload) == _ordered(plain.model().model_dump(mode="json"))
    assert _ordered(_steady(plain.payload)) == _ordered(_steady(want))
    assert plain.payload["hits"][0]["components"]["title"]["rank"] == 1


async def test_json_api_mcp_and_python_api_answer_the_same_value(mixed):
    """One search on every surface: the JSON API's body (its text, in order), MCP's
    structuredContent over a real session, and the Python API's model_dump(mode="json")."""
    corpus, index_dir = mixed
    ds = Datasette(files=[], immutables=[str(index_dir / "mixed.sqlite3")],
                   metadata={"plugins": {"groundkit": {"base_dir": str(corpus),
                                                       "embedder": "test-hash"}}})
    calls = [dict(query="kestrel falcon", mode="bm25", top_k=4),
             dict(query="kestrel meadow", mode="hybrid", group_by_document=True, top_k=5),
             dict(query="peregrine", mode="dense", top_k=2, offset=1),
             dict(query="zzunknown", mode="bm25")]
    server = Served(ds.app())  # the mixed fixture keeps the test-hash embedder registered
    try:
        async with httpx.AsyncClient(base_url=server.url) as json_client:
            texts = []
            for call in calls:
                r = await json_client.post("/mixed/-/groundkit/search.json", json=call)
                assert r.status_code == 200
                texts.append(r.content)
            status, _ = await json_call(json_client, "search", {"collection": "mixed", **calls[0]})
            assert status == 200
        async with Client(server.url + "/-/groundkit/mcp", mode="legacy",
                          read_timeout_seconds=60) as client:
            answers = [mcp_body(await client.call_tool("search", {"collection": "mixed", **c}))
                       for c in calls]
        with Collection.open("mixed", index_dir=index_dir, base_dir=corpus,
                             embedder=mcp_test_models.HashEmbedder()) as col:
            python = [col.search(**c).model_dump(mode="json") for c in calls]
    finally:
        server.stop()
    for text, (status, mcp), want in zip(texts, answers, python):
        body = json.loads(text)
        assert status == 200
        assert _ordered(_steady(body)) == _ordered(_steady(want))
        assert _ordered(_steady(mcp)) == _ordered(_steady(want))
    assert json.loads(texts[1])["groups"] and json.loads(texts[3])["lexical_match"] is False
