"""Proof by fuzzing, and the request limits on both HTTP surfaces.

Hypothesis sends random bodies, paths and headers, each carrying distinctive random tokens,
to the JSON API (search, status, chunks, collections) and to the MCP endpoint: no answer is
a 500, none carries a traceback, none repeats a token, and every refusal has the one error
shape."""

import asyncio
import json
from urllib.parse import quote

import pytest
from datasette.app import Datasette
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.retrieval.models import MAX_QUERY_CHARS, MAX_TOP_K, MAX_VECTOR_DIMS

ERROR_KEYS = {"ok", "error", "detail", "request_id"}
MCP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
FIELDS = ["query", "top_k", "mode", "rerank", "source", "document_id", "vector", "chunk_id",
          "collection", "user", "groups"]


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    from .conftest import write_corpus

    root = tmp_path_factory.mktemp("fuzz")
    corpus = write_corpus(root / "corpus")
    ingest([corpus], collection="energy", index_dir=root / "index", embedder="none")
    return Datasette(files=[], immutables=[str(root / "index" / "energy.sqlite3")],
                     metadata={"plugins": {"groundkit": {"base_dir": str(corpus)}}})


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


# Tokens no legitimate answer could contain by chance.
tokens = st.text(alphabet="bcdfghjkmnpqrstvwxz23456789", min_size=8, max_size=12).map(
    lambda s: f"zq{s}qz")


@st.composite
def tokened(draw, strategy):
    """A value built by ``strategy`` from tokens, and every token used in it."""
    used = []

    def remember(t):
        used.append(t)
        return t

    value = draw(strategy(tokens.map(remember)))
    return value, used


def json_values(tok):
    leaves = st.one_of(
        st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
        st.floats(allow_nan=True, allow_infinity=True), tok,
        st.tuples(st.text(max_size=20), tok).map(lambda p: p[0] + p[1]),
    )
    keys = st.one_of(st.sampled_from(FIELDS), tok)
    return st.recursive(
        leaves,
        lambda children: st.one_of(st.lists(children, max_size=6),
                                   st.dictionaries(keys, children, max_size=6)),
        max_leaves=20,
    )


def bodies(tok):
    search_like = st.fixed_dictionaries(
        {"query": st.one_of(tok, st.text(max_size=50))},
        optional={"top_k": st.one_of(st.integers(-5, 100), tok), "mode": st.one_of(
            st.sampled_from(["bm25", "dense", "hybrid"]), tok),
            "source": tok, "document_id": tok, "rerank": st.booleans(),
            "vector": st.lists(st.floats(), max_size=8), "extra": tok},
    ).map(json.dumps)
    raw = st.tuples(st.binary(max_size=40), tok).map(lambda p: p[0] + p[1].encode())
    return st.one_of(search_like, json_values(tok).map(json.dumps), raw, st.just(""))


def paths(tok):
    """``(path, the method its route takes)``."""
    segment = st.one_of(
        st.just("energy"), st.just("energy"), tok,
        tok.map(lambda t: quote("../" + t, safe="")), tok.map(lambda t: quote(t + "é東", safe="")),
    )
    chunk = st.one_of(tok, st.just("c_000000000000000000000000"), tok.map(lambda t: "c_" + t))
    return st.one_of(
        st.just(("/-/groundkit/collections.json", "GET")),
        segment.map(lambda c: (f"/{c}/-/groundkit/status.json", "GET")),
        segment.map(lambda c: (f"/{c}/-/groundkit/search.json", "POST")),
        segment.map(lambda c: (f"/{c}/-/groundkit/search.json", "POST")),
        st.tuples(segment, chunk).map(lambda p: (f"/{p[0]}/-/groundkit/chunks/{p[1]}.json", "GET")),
    )


def headers(tok):
    common = st.fixed_dictionaries({}, optional={
        "content-type": st.one_of(st.just("application/json"), st.just("application/json"), st.sampled_from(
            ["application/json; charset=utf-8", "text/plain"]), tok),
        "authorization": tok.map(lambda t: "Bearer " + t),
        "x-groundkit-fuzz": tok,
        "accept": st.one_of(st.just("application/json"), tok),
    })
    rare = st.one_of(
        st.just({}), st.just({}), st.just({}), st.just({}),
        st.just({"origin": "http://localhost:8001", "host": "localhost:8001"}),
        tok.map(lambda t: {"origin": f"https://{t}.example"}),
        tok.map(lambda t: {"host": f"{t}.example"}),
        st.just({"content-length": "not-a-number"}),
    )
    return st.tuples(common, rare).map(lambda p: {**p[0], **p[1]})


@st.composite
def requests(draw):
    ((path, method), body, hdrs), used = draw(tokened(
        lambda tok: st.tuples(paths(tok), bodies(tok), headers(tok))))
    method = draw(st.sampled_from([method] * 6 + ["GET", "POST", "PUT"]))
    return method, path, body, hdrs, used


def check_answer(status, text, response_headers, used):
    assert status != 500 and status not in (502, 504), (status, text[:300])
    assert "Traceback" not in text and "File \"" not in text
    for token in used:
        assert token not in text, (token, text[:300])
        assert token not in str(response_headers), token
    if status >= 400:
        body = json.loads(text)
        assert set(body) == ERROR_KEYS and body["ok"] is False, text[:300]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(request=requests())
def test_fuzz_json_api(ds, loop, request):
    method, path, body, hdrs, used = request
    if hdrs.get("content-length") is not None and method == "GET":
        hdrs = {k: v for k, v in hdrs.items() if k != "content-length"}
    r = loop.run_until_complete(ds.client.request(
        method, path, content=body if method != "GET" else None, headers=hdrs))
    event(f"status {r.status_code}")
    check_answer(r.status_code, r.text, r.headers, used)


def mcp_messages(tok):
    value = json_values(tok)
    arguments = st.dictionaries(st.one_of(st.sampled_from(FIELDS), tok), value, max_size=5)
    call = st.fixed_dictionaries({
        "jsonrpc": st.just("2.0"), "id": st.integers(1, 1000), "method": st.just("tools/call"),
        "params": st.fixed_dictionaries({
            "name": st.one_of(st.sampled_from(["search", "index_status", "fetch_chunk",
                                               "list_collections"]), tok),
            "arguments": st.one_of(arguments, value)}),
    })
    other = st.fixed_dictionaries({
        "jsonrpc": st.one_of(st.just("2.0"), tok), "id": st.integers(1, 1000),
        "method": st.one_of(tok, st.sampled_from(["tools/list", "initialize", "ping"])),
        "params": value,
    })
    return st.one_of(call, other, value).map(json.dumps)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(message=tokened(mcp_messages))
def test_fuzz_mcp_endpoint(ds, loop, message):
    body, used = message
    r = loop.run_until_complete(ds.client.post("/-/groundkit/mcp", content=body, headers=MCP_HEADERS))
    event(f"status {r.status_code}")
    assert r.status_code in (200, 202, 400, 404, 406, 413, 415, 422), (r.status_code, r.text[:300])
    if r.status_code == 400 and "jsonrpc" in r.json():  # a malformed message: a JSON-RPC error
        check_answer(200, r.text, r.headers, used)
        assert_json_rpc_refusal(r.json())
        return
    check_answer(r.status_code if r.status_code != 202 else 200, r.text, r.headers, used)


def assert_json_rpc_refusal(body):
    """What groundkit answers a message that is not one well-formed JSON-RPC request."""
    assert set(body) == {"jsonrpc", "id", "error"} and body["error"]["code"] in (-32700, -32600), body
    assert set(body["error"]["data"]) == {"request_id"}


# -- the limits, on both surfaces --------------------------------------------------------


async def json_search(ds, body: str):
    r = await ds.client.post("/energy/-/groundkit/search.json", content=body,
                             headers={"content-type": "application/json"})
    return r.status_code, r.json()


async def mcp_search(ds, body: str):
    """The same search arguments as an MCP tool call (``body`` is the JSON API body)."""
    arguments = json.loads(body)
    arguments["collection"] = "energy"
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": "search", "arguments": arguments}}
    r = await ds.client.post("/-/groundkit/mcp", content=json.dumps(message), headers=MCP_HEADERS)
    result = r.json()["result"]
    if result.get("isError"):  # the error body travels as text and in _meta (docs/mcp.md)
        assert "structuredContent" not in result
        return result["_meta"]["groundkit/status"], result["_meta"]["groundkit/error"]
    return 200, result["structuredContent"]


MARK = "zqlimitmarkqz"
LIMIT_CASES = [
    # (JSON body, expected status)
    (json.dumps({"query": MARK * (MAX_QUERY_CHARS // len(MARK) + 1)}), 422),
    (json.dumps({"query": "w" * MAX_QUERY_CHARS}), 200),
    (json.dumps({"query": MARK, "top_k": MAX_TOP_K + 1}), 422),
    (json.dumps({"query": MARK, "top_k": MAX_TOP_K}), 200),
    (json.dumps({"query": MARK, "top_k": 0}), 422),
    (json.dumps({"query": MARK, "vector": [0.5] * (MAX_VECTOR_DIMS + 1)}), 422),
    ('{"query": "%s", "vector": [0.5, NaN]}' % MARK, 422),
    ('{"query": "%s", "vector": [Infinity]}' % MARK, 422),
    ('{"query": "%s", "vector": [-Infinity, 1]}' % MARK, 422),
    ('{"query": "%s", "vector": [1e999]}' % MARK, 422),
    (json.dumps({"query": MARK, "vector": [MARK]}), 422),
    (json.dumps({"query": MARK, MARK: 1}), 422),
    (json.dumps({"query": MARK, "mode": MARK}), 422),
    (json.dumps({"query": MARK, "top_k": MARK}), 422),
]


@pytest.mark.parametrize("body,status", LIMIT_CASES)
async def test_limits_are_the_same_on_both_surfaces_and_echo_nothing(ds, body, status):
    for surface in (json_search, mcp_search):
        got, answer = await surface(ds, body)
        assert got == status, (surface.__name__, answer)
        if status != 200:
            assert set(answer) == ERROR_KEYS and answer["error"] == "malformed_request"
            assert MARK not in json.dumps(answer), surface.__name__


async def test_a_full_length_vector_passes_validation(ds):
    body = json.dumps({"query": "x", "mode": "dense", "vector": [0.25] * MAX_VECTOR_DIMS})
    for surface in (json_search, mcp_search):
        status, answer = await surface(ds, body)
        assert status != 422, answer  # this collection has no vectors: a 400, not a validation error
        assert answer["error"] == "dense_unavailable"


async def test_mcp_body_limit_by_header_and_by_bytes(ds):
    big = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "search", "arguments": {"collection": "energy", "query": MARK * 30000}}})
    assert len(big) > 256 * 1024
    r = await ds.client.post("/-/groundkit/mcp", content=big, headers=MCP_HEADERS)
    assert r.status_code == 413 and set(r.json()) == ERROR_KEYS
    assert r.json()["error"] == "payload_too_large" and MARK not in r.text

    async def stream():  # no Content-Length: counted as the bytes arrive
        for _ in range(300):
            yield b" " * 1024

    r = await ds.client.post("/-/groundkit/mcp", content=stream(), headers=MCP_HEADERS)
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
    # Just under the limit is read and answered as MCP.
    padded = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {
        "_meta": {"pad": " " * (250 * 1024)}}})
    r = await ds.client.post("/-/groundkit/mcp", content=padded, headers=MCP_HEADERS)
    assert r.status_code == 200 and r.json()["result"]["tools"]


async def test_mcp_refusals_use_the_error_shape_and_echo_nothing(ds):
    for body in (MARK, "[" + MARK, json.dumps({"jsonrpc": "2.0", "id": MARK}),
                 json.dumps({"jsonrpc": "2.0", "method": 5, "id": 1, MARK: MARK})):
        r = await ds.client.post("/-/groundkit/mcp", content=body, headers=MCP_HEADERS)
        assert r.status_code == 400, r.text
        assert_json_rpc_refusal(r.json())
        assert MARK not in r.text
    r = await ds.client.post("/-/groundkit/mcp", content=json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": MARK}), headers=MCP_HEADERS)
    assert r.json()["error"]["message"] == "Method not found" and MARK not in r.text
    r = await ds.client.post("/-/groundkit/mcp", content=json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}), headers={**MCP_HEADERS, "accept": "text/html"})
    assert r.status_code == 406 and set(r.json()) == ERROR_KEYS
