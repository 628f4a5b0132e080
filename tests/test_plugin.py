import json
import logging
import re
from collections import Counter
import sys
from pathlib import Path

import pytest
from datasette.app import Datasette

from groundkit_datasette import registry as gk_registry
from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.datasette_plugin import HEALTH_ROUTE, MCP_ROUTE, OPENAPI_ROUTE
from groundkit_datasette.surfaces.datasette_compat import DATASETTE_1
from groundkit_datasette.surfaces.tools import Tool, all_tools

from .conftest import snapshot

sys.path.insert(0, str(Path(__file__).parent / "plugins"))
import word_count  # noqa: E402  (a test plugin adding a tool through our hook)


@pytest.fixture
def collection(corpus, index_dir):
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    return index_dir / "energy.sqlite3"


def make_ds(collection_path, corpus, **plugin_config):
    config = {"base_dir": str(corpus), **plugin_config}
    return Datasette(
        files=[], immutables=[str(collection_path)], metadata={"plugins": {"groundkit": config}}
    )


@pytest.fixture
def ds(collection, corpus):
    return make_ds(collection, corpus)


async def post_json(ds, path, body, **kwargs):
    return await ds.client.post(
        path, content=json.dumps(body), headers={"content-type": "application/json"}, **kwargs
    )


async def test_collections_status_search_and_fetch_over_json(ds):
    r = await ds.client.get("/-/groundkit/collections.json")
    assert r.status_code == 200 and r.json() == {"collections": ["energy"]}
    assert r.headers["x-request-id"]

    r = await ds.client.get("/energy/-/groundkit/status.json")
    status = r.json()
    assert r.status_code == 200 and status["documents"] == 4 and status["dense_available"] is False

    r = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "batteries", "top_k": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["mode"] == "bm25" and body["hits"][0]["source"] == "solar.md"
    chunk_id = body["hits"][0]["chunk_id"]

    r = await ds.client.get(f"/energy/-/groundkit/chunks/{chunk_id}.json")
    assert r.status_code == 200
    assert r.json()["verification"]["status"] == "verified"
    assert r.json()["chunk"]["content"] == body["hits"][0]["content"]


@pytest.mark.parametrize(
    "method,path,body,status,kind",
    [
        ("GET", "/nope/-/groundkit/status.json", None, 404, "collection_not_found"),
        ("GET", "/..%2Fenergy/-/groundkit/status.json", None, 400, "invalid_collection_name"),
        ("GET", "/a.b/-/groundkit/status.json", None, 400, "invalid_collection_name"),
        ("GET", "/energy/-/groundkit/chunks/c_000000000000000000000000.json", None, 404,
         "chunk_not_found"),
        ("GET", "/energy/-/groundkit/chunks/not-a-chunk.json", None, 422, "malformed_request"),
        ("POST", "/energy/-/groundkit/search.json", "not json", 422, "malformed_request"),
        ("POST", "/energy/-/groundkit/search.json", "[1, 2]", 422, "malformed_request"),
        ("POST", "/energy/-/groundkit/search.json", {"query": "x", "secret_field": 1}, 422,
         "malformed_request"),
        ("POST", "/energy/-/groundkit/search.json", {"query": "x", "top_k": 51}, 422,
         "malformed_request"),
        ("POST", "/energy/-/groundkit/search.json", {"query": "x", "mode": "dense"}, 400,
         "dense_unavailable"),
        ("POST", "/energy/-/groundkit/search.json", {"query": "x", "rerank": True}, 501,
         "rerank_not_configured"),
        ("POST", "/energy/-/groundkit/status.json", {}, 405, "method_not_allowed"),
        ("POST", "/-/groundkit/collections.json", {}, 405, "method_not_allowed"),
        # Bad bodies: every one a 4xx, none a 500, nothing echoed.
        ("POST", "/energy/-/groundkit/search.json", "[" * 100_000, 422, "malformed_request"),
        ("POST", "/energy/-/groundkit/search.json", '{"query": ' * 20_000, 422,
         "malformed_request"),
        ("POST", "/energy/-/groundkit/search.json", b'{"query": "secret_field \xff\xfe"}', 422,
         "malformed_request"),
        ("POST", "/energy/-/groundkit/search.json", '{"query": "secret_field \\ud800"}', 422,
         "malformed_request"),
        ("POST", "/energy/-/groundkit/search.json", '"secret_field"', 422, "malformed_request"),
        # A vector BM25 would ignore is refused, not dropped.
        ("POST", "/energy/-/groundkit/search.json",
         {"query": "x", "mode": "bm25", "vector": [0.1, 0.2]}, 422, "malformed_request"),
        ("POST", "/energy/-/groundkit/search.json", {"query": "x", "vector": [0.1, 0.2]}, 400,
         "dense_unavailable"),
        # GET takes the same model from the query string.
        ("GET", "/energy/-/groundkit/search.json?query=x&secret_field=1", None, 422,
         "malformed_request"),
        ("GET", "/energy/-/groundkit/search.json?query=x&top_k=2&top_k=3", None, 422,
         "malformed_request"),
        ("GET", "/energy/-/groundkit/search.json?query=x&top_k=secret_field", None, 422,
         "malformed_request"),
        ("GET", "/energy/-/groundkit/search.json?query=x&rerank=secret_field", None, 422,
         "malformed_request"),
        ("GET", "/energy/-/groundkit/search.json?query=%FF%FE", None, 422, "malformed_request"),
        ("GET", "/energy/-/groundkit/search.json?query=x&mode=bm25&vector=1&vector=2", None, 422,
         "malformed_request"),
        ("GET", "/energy/-/groundkit/search.json", None, 422, "malformed_request"),
        ("GET", "/energy/-/groundkit/status.json?secret_field=1", None, 422, "malformed_request"),
        ("GET", "/-/groundkit/collections.json?secret_field=1", None, 422, "malformed_request"),
        ("GET", "/energy/-/groundkit/chunks/c_000000000000000000000000.json?chunk_id=x", None,
         422, "malformed_request"),
    ],
)
async def test_errors_have_one_shape_and_the_right_status(ds, method, path, body, status, kind):
    if method == "GET":
        r = await ds.client.get(path)
    else:
        content = body if isinstance(body, (str, bytes)) else json.dumps(body)
        r = await ds.client.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    data = r.json()
    assert set(data) == {"ok", "error", "detail", "request_id"}
    assert data["ok"] is False and data["error"] == kind
    assert data["request_id"] == r.headers["x-request-id"]
    assert "secret_field" not in r.text and "Traceback" not in r.text
    assert "/tmp" not in r.text


async def test_body_limits_by_header_and_by_bytes(ds):
    big = json.dumps({"query": "x" * (300 * 1024)})
    r = await ds.client.post("/energy/-/groundkit/search.json", content=big,
                             headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"

    async def stream():  # no Content-Length: counted as the bytes arrive
        for _ in range(300):
            yield b" " * 1024

    r = await ds.client.post("/energy/-/groundkit/search.json", content=stream(),
                             headers={"content-type": "application/json"})
    assert r.status_code == 413


async def test_internal_errors_never_leak_their_cause(ds, collection, corpus):
    class Boom:
        @staticmethod
        @gk_registry.hookspecs.hookimpl
        def register_tools(register):
            async def explode(ctx, collection, request):
                try:
                    raise ValueError("SENTINEL-7f3a /etc/shadow")
                except ValueError as inner:
                    raise RuntimeError("boom SENTINEL-7f3a") from inner

            register(Tool(name="explode", summary="Always fails.", request_model=word_count.WordCountRequest,
                          response_model=word_count.WordCountResponse, handler=explode,
                          scope="collection", method="POST",
                          json_route="/{collection}/-/groundkit/explode.json"))

    gk_registry.pm.register(Boom, name="boom")
    try:
        fresh = make_ds(collection, corpus)
        r = await post_json(fresh, "/energy/-/groundkit/explode.json", {"word": "x"})
    finally:
        gk_registry.pm.unregister(name="boom")
    assert r.status_code == 500
    assert r.json()["error"] == "internal_error" and r.json()["detail"] == "internal error"
    assert "SENTINEL" not in r.text and "boom" not in r.text and "shadow" not in r.text


def registered_patterns(ds):
    """Every route our plugin module registers, from each of its register_routes hookimpls
    (other installed plugins, such as datasette-mcp's ``/-/mcp``, are not ours)."""
    import groundkit_datasette.datasette_plugin as gk_plugin
    from datasette.plugins import pm as ds_pm

    patterns = []
    for impl in ds_pm.hook.register_routes.get_hookimpls():
        if impl.plugin is not gk_plugin:
            continue
        plugin_routes = impl.function(datasette=ds)
        patterns += [p if isinstance(p, str) else p.pattern for p, _ in plugin_routes or []]
    return patterns


def expected_patterns(tools):
    out = []
    for t in tools:
        out.append(Tool.route_regex(t.json_route))
        if t.html_route:
            out.append(Tool.route_regex(t.html_route))
        out += [asset.regex() for asset in t.page_assets]  # files a page shows (adr/0027)
    return out + ["^" + route + "$" for route in (MCP_ROUTE, OPENAPI_ROUTE, HEALTH_ROUTE)]


async def test_routes_served_equal_the_tool_table(ds):
    tools = all_tools()
    assert [t.name for t in tools] == ["list_collections", "index_status", "search", "fetch_chunk",
                                       "fetch_document", "verify_quote"]
    assert route_mismatch(ds) == ([], [])
    # And the running app answers every one of them.
    r = await ds.client.get("/energy/-/groundkit/status.json")
    chunk = (await post_json(ds, "/energy/-/groundkit/search.json", {"query": "wind"})).json()
    chunk_id = chunk["hits"][0]["chunk_id"]
    document_id = chunk["hits"][0]["document_id"]
    for tool in tools:
        params = {"collection": "energy", "chunk_id": chunk_id, "document_id": document_id}
        json_path = tool.path(**params)
        if tool.method == "POST":
            body = {"quotes": [{"text": "wind"}]} if tool.name == "verify_quote" else {"query": "wind"}
            r = await post_json(ds, json_path, body)
        else:
            r = await ds.client.get(json_path)
        assert r.status_code == 200, (tool.name, r.text)
        html = await ds.client.get(tool.path_for_html(**params))
        assert html.status_code == 200 and "<html" in html.text.lower()


def route_mismatch(ds):
    """(routes our plugin serves that the table does not declare, declared routes it does not serve)."""
    served, declared = Counter(registered_patterns(ds)), Counter(expected_patterns(all_tools()))
    return sorted((served - declared).elements()), sorted((declared - served).elements())


async def test_a_route_outside_the_table_fails_the_parity_check(ds, monkeypatch):
    """The check reads what the plugin really registers: a route added beside the table, or a
    table route dropped, is reported."""
    import groundkit_datasette.datasette_plugin as gk_plugin

    real = gk_plugin.routes_for
    sneaky = "^/-/groundkit/sneaky.json$"
    monkeypatch.setattr(gk_plugin, "routes_for", lambda tools: real(tools) + [(sneaky, None)])
    assert route_mismatch(ds) == ([sneaky], [])
    first = real(all_tools())[0][0]
    monkeypatch.setattr(gk_plugin, "routes_for", lambda tools: real(tools)[1:])
    assert route_mismatch(ds) == ([], [first])


async def test_plugin_tools_land_in_the_table_and_the_json_api(collection, corpus):
    gk_registry.pm.register(word_count, name="word_count")
    try:
        names = [t.name for t in all_tools()]
        assert "word_count" in names
        ds = make_ds(collection, corpus)
        assert Tool.route_regex(word_count.TOOL.json_route) in registered_patterns(ds)
        r = await post_json(ds, "/energy/-/groundkit/word-count.json", {"word": "turbines"})
        assert r.status_code == 200 and r.json()["chunks"] == 2
    finally:
        gk_registry.pm.unregister(name="word_count")
    assert "word_count" not in [t.name for t in all_tools()]


def test_the_table_refuses_a_tool_that_is_not_read_only():
    with pytest.raises(ValueError, match="read-only"):
        Tool(name="delete_all", summary="x", request_model=word_count.WordCountRequest,
             response_model=word_count.WordCountResponse, handler=None, scope="instance",
             json_route="/-/groundkit/delete.json", read_only=False)


async def test_csrf_json_posts_work_with_and_without_cookies_but_forms_are_still_protected(ds):
    r = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "wind"})
    assert r.status_code == 200
    r = await ds.client.post("/energy/-/groundkit/search.json", content=json.dumps({"query": "wind"}),
                             headers={"content-type": "application/json"},
                             cookies={"ds_actor": "x", "ds_csrftoken": "abc"})
    assert r.status_code == 200
    # Datasette's CSRF protection still applies to form posts: 0.65 refuses one without its
    # token, 1.0 a browser's cross-site one (by Sec-Fetch-Site).
    r = await ds.client.post("/energy/-/groundkit/search.json", data={"query": "wind"},
                             cookies={"ds_csrftoken": "abc"},
                             headers={"sec-fetch-site": "cross-site"} if DATASETTE_1 else {})
    assert r.status_code == 403


BROWSER_ON_LOOPBACK = {"origin": "http://localhost:6274", "sec-fetch-site": "same-site",
                       "sec-fetch-mode": "cors"}


async def test_a_browser_mcp_client_on_a_loopback_page_is_answered(ds):
    """The MCP Inspector (a page on http://localhost:6274) posts JSON to the MCP endpoint and
    the JSON API: the boundary's Origin rule decides, not Datasette's CSRF check (1.0 refuses
    any POST that is not same-origin), on both Datasette lines."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    r = await ds.client.post(MCP_ROUTE, content=json.dumps(body), headers={
        **BROWSER_ON_LOOPBACK, "content-type": "application/json",
        "accept": "application/json, text/event-stream"})
    assert r.status_code == 200 and r.json()["result"]["tools"]
    r = await ds.client.post("/energy/-/groundkit/search.json", content=json.dumps({"query": "wind"}),
                             headers={**BROWSER_ON_LOOPBACK, "content-type": "application/json"})
    assert r.status_code == 200 and r.json()["hits"]
    # A page elsewhere is still refused, by the boundary, as JSON.
    r = await ds.client.post(MCP_ROUTE, content=json.dumps(body), headers={
        "origin": "https://evil.example", "sec-fetch-site": "cross-site",
        "content-type": "application/json", "accept": "application/json, text/event-stream"})
    assert r.status_code == 403 and r.json()["error"] == "origin_not_allowed"
    # Datasette's own pages keep its CSRF check.
    r = await ds.client.post("/energy/-/groundkit/search.json", data={"query": "wind"},
                             headers={**BROWSER_ON_LOOPBACK, "sec-fetch-site": "cross-site"},
                             cookies={"ds_csrftoken": "abc"})
    assert r.status_code == 403


async def test_every_operation_is_read_only_through_the_json_api(ds, collection):
    index_dir = collection.parent
    before = snapshot(index_dir)
    names_before = sorted(p.name for p in index_dir.iterdir())
    r = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "sun"})
    chunk_id = r.json()["hits"][0]["chunk_id"]
    for path in ("/-/groundkit/collections.json", "/energy/-/groundkit/status.json",
                 f"/energy/-/groundkit/chunks/{chunk_id}.json", "/missing/-/groundkit/status.json",
                 "/..%2F..%2Fetc/-/groundkit/status.json", "/-/groundkit", "/energy/-/groundkit",
                 f"/energy/-/groundkit/chunks/{chunk_id}", "/energy/-/groundkit/search?q=sun"):
        await ds.client.get(path)
    await post_json(ds, "/energy/-/groundkit/search.json", {"query": "x", "rerank": True})
    await post_json(ds, "/missing/-/groundkit/search.json", {"query": "x"})
    assert snapshot(index_dir) == before
    assert sorted(p.name for p in index_dir.iterdir()) == names_before
    assert not (index_dir / "missing.sqlite3").exists()


async def test_positional_mutable_database_is_still_only_read(collection, corpus):
    before = snapshot(collection.parent)
    ds = Datasette(files=[str(collection)], metadata={"plugins": {"groundkit": {"base_dir": str(corpus)}}})
    r = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "wind"})
    assert r.status_code == 200 and r.json()["hits"]
    assert snapshot(collection.parent) == before


async def test_index_dir_setting_attaches_collections_immutably(collection, corpus):
    ds = Datasette(files=[], metadata={"plugins": {"groundkit": {
        "index_dir": str(collection.parent), "base_dir": str(corpus)}}})
    await ds.invoke_startup()
    assert "energy" in ds.databases and not ds.databases["energy"].is_mutable
    r = await ds.client.get("/-/groundkit/collections.json")
    assert r.json() == {"collections": ["energy"]}


async def test_unknown_plugin_setting_fails_startup(collection):
    ds = Datasette(files=[], metadata={"plugins": {"groundkit": {"index_dri": "."}}})
    with pytest.raises(ValueError, match="index_dri"):
        await ds.invoke_startup()


async def test_a_new_publish_is_served_on_the_next_request(ds, corpus, collection):
    r = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "geothermal"})
    assert r.json()["hits"] == [] and r.json()["generation"] == 1
    (corpus / "geo.md").write_text("# Geothermal\n\nHeat from deep rock warms homes.\n")
    ingest([corpus], collection="energy", index_dir=collection.parent, embedder="none")
    r = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "geothermal"})
    assert r.json()["generation"] == 2 and r.json()["hits"][0]["source"] == "geo.md"


async def test_forbidden_collection_looks_missing(collection, corpus):
    ds = Datasette(files=[], immutables=[str(collection)], metadata={
        "databases": {"energy": {"allow": {"id": "alice"}}},
        "plugins": {"groundkit": {"base_dir": str(corpus)}},
    })
    missing = await ds.client.get("/nope/-/groundkit/status.json")
    forbidden = await ds.client.get("/energy/-/groundkit/status.json")
    assert forbidden.status_code == missing.status_code == 404
    assert forbidden.json()["error"] == missing.json()["error"]
    assert (await ds.client.get("/-/groundkit/collections.json")).json() == {"collections": []}
    cookies = {"ds_actor": ds.sign({"a": {"id": "alice"}}, "actor")}
    allowed = await ds.client.get("/energy/-/groundkit/status.json", cookies=cookies)
    assert allowed.status_code == 200


async def test_access_log_has_one_line_per_call_and_never_the_query(ds, caplog):
    caplog.set_level(logging.DEBUG, logger="groundkit")
    await ds.invoke_startup()
    access = logging.getLogger("groundkit.access")  # it does not propagate: see logs.py
    access.addHandler(caplog.handler)
    try:
        await post_json(ds, "/energy/-/groundkit/search.json", {"query": "zeppelin-secret-topic"})
    finally:
        access.removeHandler(caplog.handler)
    lines = [r for r in caplog.records if r.name == "groundkit.access"]
    assert len(lines) == 1
    message = lines[0].getMessage()
    assert "tool=search" in message and "status=200" in message and "request_id=" in message
    assert all("zeppelin" not in r.getMessage() for r in caplog.records if r.levelno >= logging.INFO)


async def test_call_lines_go_to_stderr_with_a_plain_handler_of_their_own(ds, capfd):
    await ds.invoke_startup()
    access = logging.getLogger("groundkit.access")
    assert access.propagate is False
    # Exactly one of ours (pytest's capture handlers may sit beside it).
    assert [type(h).__name__ for h in access.handlers].count("_StderrHandler") == 1
    capfd.readouterr()
    r = await post_json(ds, "/energy/-/groundkit/search.json",
                        {"query": "batteries solar wind hydro", "mode": "bm25"})
    out, err = capfd.readouterr()
    assert "tool=search" in err and "status=200" in err and "tool=search" not in out
    assert "batteries" not in err
    # The count of what was answered: the hits, also now that a search answers plain values.
    hits = r.json()["hits"]
    assert len(hits) > 1 and f"results={len(hits)}" in err


async def test_an_mcp_http_call_leaves_no_sdk_info_line_but_its_warnings_pass(ds):
    # The SDK logs "Terminating session: None" at INFO after every stateless call; behind
    # the rich root handler the SDK's FastMCP installs, that line cost 1.5-2 ms a call.
    from groundkit_datasette.logs import IN_STATELESS_MCP

    await ds.invoke_startup()
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    sdk = logging.getLogger("mcp.server.streamable_http")
    keep, saved = Keep(level=logging.DEBUG), sdk.level
    sdk.addHandler(keep)
    sdk.setLevel(logging.DEBUG)
    try:
        body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "search", "arguments": {"collection": "energy", "query": "solar", "mode": "bm25"}}}
        r = await ds.client.post("/-/groundkit/mcp", content=json.dumps(body), headers={
            "content-type": "application/json", "accept": "application/json, text/event-stream"})
        assert r.status_code == 200 and r.json()["result"]["structuredContent"]["hits"]
        assert not [x for x in records if x.levelno == logging.INFO]
        # Outside our calls (another server on the same SDK) INFO lines pass; inside, warnings do.
        sdk.info("another server's line")
        token = IN_STATELESS_MCP.set(True)
        try:
            sdk.warning("a real problem")
        finally:
            IN_STATELESS_MCP.reset(token)
        assert [x.getMessage() for x in records[-2:]] == ["another server's line", "a real problem"]
    finally:
        sdk.removeHandler(keep)
        sdk.setLevel(saved)


def test_a_configured_call_logger_is_left_alone():
    from groundkit_datasette.logs import install_call_log

    logger = logging.getLogger("groundkit.access")
    saved = (logger.handlers[:], logger.propagate, logger.level)
    mine = logging.NullHandler()
    logger.handlers[:] = [mine]
    logger.propagate = True
    try:
        install_call_log()
        assert logger.handlers == [mine] and logger.propagate is True
    finally:
        logger.handlers[:], logger.propagate, logger.level = saved


def test_uvicorn_access_log_never_records_query_strings():
    from groundkit_datasette.logs import RedactQueryStrings

    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", "/energy/-/groundkit/search?q=zeppelin+secret", "1.1", 200), None,
    )
    assert RedactQueryStrings().filter(record)
    assert "zeppelin" not in record.getMessage() and "/energy/-/groundkit/search" in record.getMessage()
    other = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, "%s %s %s %s %d",
                              ("c", "GET", "/energy/chunks?_search=x", "1.1", 200), None)
    RedactQueryStrings().filter(other)
    # Datasette's own ?_search= and ?sql= carry query text too (adr/0011).
    assert "_search=x" not in other.getMessage() and "/energy/chunks?[redacted]" in other.getMessage()


async def test_startup_installs_the_access_log_filter(ds):
    from groundkit_datasette.logs import RedactQueryStrings

    await ds.invoke_startup()
    assert any(isinstance(f, RedactQueryStrings) for f in logging.getLogger("uvicorn.access").filters)


# -- GET on the JSON routes ------------------------------------------------------------


async def test_get_search_answers_like_post(ds):
    """A bookmarkable GET beside the POST: the same model, the same answer."""
    posted = await post_json(ds, "/energy/-/groundkit/search.json",
                             {"query": "batteries", "top_k": 2, "mode": "bm25", "source": "solar"})
    got = await ds.client.get(
        "/energy/-/groundkit/search.json?query=batteries&top_k=2&mode=bm25&source=solar")
    assert got.status_code == posted.status_code == 200, got.text
    assert got.json()["hits"] == posted.json()["hits"] and len(got.json()["hits"]) >= 1
    assert got.json()["top_k"] == 2
    r = await ds.client.get("/energy/-/groundkit/search.json?query=batteries&rerank=true")
    assert r.status_code == 501 and r.json()["error"] == "rerank_not_configured"
    r = await ds.client.get("/energy/-/groundkit/search.json?query=x&top_k=zeppelin")
    assert "top_k" in r.json()["detail"] and "zeppelin" not in r.text
    r = await ds.client.get("/energy/-/groundkit/search.json?query=x&top_k=1&top_k=2")
    assert r.json()["detail"] == "top_k: given more than once"


async def test_a_refused_body_is_logged_with_its_request_id_and_never_echoed(ds, caplog):
    await ds.invoke_startup()
    access = logging.getLogger("groundkit.access")
    access.addHandler(caplog.handler)
    try:
        r = await ds.client.post("/energy/-/groundkit/search.json",
                                 content="[" * 100_000 + '"zeppelin-secret"',
                                 headers={"content-type": "application/json"})
    finally:
        access.removeHandler(caplog.handler)
    assert r.status_code == 422 and "zeppelin" not in r.text
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "groundkit.access"]
    assert len(lines) == 1
    assert f"request_id={r.headers['x-request-id']}" in lines[0] and "status=422" in lines[0]
    assert "zeppelin" not in lines[0]


# -- every status of the error table ---------------------------------------------------


@pytest.fixture
def vec_plugins():
    from fixed_vectors import Embedders, GateReranker

    gk_registry.pm.register(Embedders, name="fixed-embedders")
    gk_registry.pm.register(GateReranker, name="gate-reranker")
    yield
    gk_registry.pm.unregister(name="fixed-embedders")
    gk_registry.pm.unregister(name="gate-reranker")


@pytest.fixture
def dense_collection(tmp_path, corpus, vec_plugins):
    index = tmp_path / "dense-index"
    ingest([corpus], collection="energy", index_dir=index, embedder="vec-a")
    return index / "energy.sqlite3"


async def test_409_embedder_mismatch(dense_collection, corpus):
    ds = make_ds(dense_collection, corpus, embedder="vec-b")
    r = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "wind", "mode": "dense"})
    assert r.status_code == 409 and r.json()["error"] == "embedder_mismatch"
    ok = make_ds(dense_collection, corpus, embedder="vec-a")
    r = await post_json(ok, "/energy/-/groundkit/search.json", {"query": "wind", "mode": "dense"})
    assert r.status_code == 200 and r.json()["mode"] == "dense"


async def test_409_index_inconsistent_when_the_vectors_are_lost(dense_collection, corpus):
    import shutil

    shutil.rmtree(dense_collection.parent / "energy.lance")
    ds = make_ds(dense_collection, corpus, embedder="vec-a")
    r = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "wind", "mode": "hybrid"})
    assert r.status_code == 409 and r.json()["error"] == "index_inconsistent"
    assert str(dense_collection.parent) not in r.text


async def test_409_schema_mismatch(collection, corpus, tmp_path):
    import shutil
    import sqlite3

    other = tmp_path / "future"
    other.mkdir()
    future = other / "energy.sqlite3"
    shutil.copy(collection, future)
    conn = sqlite3.connect(future)
    conn.execute("PRAGMA user_version = 99")  # a collection from a newer groundkit
    conn.close()
    ds = make_ds(future, corpus)
    r = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "wind"})
    assert r.status_code == 409 and r.json()["error"] == "schema_mismatch"


async def test_413_with_an_operator_set_body_limit(collection, corpus):
    ds = make_ds(collection, corpus, max_body_bytes=2048)
    r = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "x" * 3000})
    assert r.status_code == 413 and r.json()["detail"] == "request body exceeds 2 KiB"
    r = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "x" * 1000})
    assert r.status_code == 200


async def test_operator_set_top_k_and_query_limits(collection, corpus):
    ds = make_ds(collection, corpus, max_top_k=5, max_query_chars=10)
    r = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "wind", "top_k": 6})
    assert r.status_code == 422 and r.json()["detail"] == "top_k: must be at most 5 on this server"
    r = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "wind power x"})
    assert r.status_code == 422 and "at most 10 characters" in r.json()["detail"]
    r = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "wind", "top_k": 5})
    assert r.status_code == 200
    r = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "wind"})
    assert r.status_code == 200 and r.json()["top_k"] == 5  # the default, lowered to the limit


async def test_400_a_vector_of_the_wrong_width(dense_collection, corpus):
    ds = make_ds(dense_collection, corpus, embedder="vec-a")
    r = await post_json(ds, "/energy/-/groundkit/search.json",
                        {"query": "wind", "mode": "dense", "vector": [0.5] * 3})
    assert r.status_code == 400 and r.json()["error"] == "invalid_request"
    r = await post_json(ds, "/energy/-/groundkit/search.json",
                        {"query": "wind", "mode": "dense", "vector": [0.5] * 8})
    assert r.status_code == 200


async def test_502_when_the_rerank_endpoint_fails(collection, corpus):
    """A real local HTTP server stands in for the remote rerank service (it answers 500)."""
    from .test_outbound import _Server

    upstream = _Server(500)
    try:
        ds = make_ds(collection, corpus, reranker="http", reranker_options={
            "base_url": f"http://127.0.0.1:{upstream.port}", "allow_private": True})
        r = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "wind", "rerank": True})
    finally:
        upstream.close()
    assert r.status_code == 502 and r.json()["error"] == "reranker_error"
    assert r.json()["detail"] == "an upstream model service failed"
    assert str(upstream.port) not in r.text and upstream.hits


async def test_503_past_the_concurrent_search_bound_with_retry_after(collection, corpus,
                                                                     vec_plugins):
    """One search held in flight (a reranker that waits for a signal) fills a bound of one."""
    import asyncio

    from fixed_vectors import GATE

    GATE.entered.clear()
    GATE.release.clear()
    ds = make_ds(collection, corpus, reranker="gate", max_concurrent_searches=1)
    first = asyncio.create_task(post_json(ds, "/energy/-/groundkit/search.json",
                                          {"query": "wind", "rerank": True}))
    try:
        assert await asyncio.to_thread(GATE.entered.wait, 60)
        busy = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "sun"})
        page = await ds.client.get("/energy/-/groundkit/search?q=sun")
        # Other operations are not searches: they still answer.
        status = await ds.client.get("/energy/-/groundkit/status.json")
    finally:
        GATE.release.set()
    assert busy.status_code == 503 and busy.json()["error"] == "server_busy"
    assert busy.headers["retry-after"] == "1"
    assert page.status_code == 503 and page.headers["retry-after"] == "1"
    assert status.status_code == 200
    assert (await first).status_code == 200
    again = await post_json(ds, "/energy/-/groundkit/search.json", {"query": "sun"})
    assert again.status_code == 200


async def test_datasette_failed_query_line_withholds_the_callers_text(ds, capfd):
    # Datasette writes a failed query's SQL, parameters and SQLite message to stderr;
    # the parameters are the caller's search text.
    await ds.invoke_startup()
    capfd.readouterr()
    response = await ds.client.get('/energy/chunks.json?_search=zeppelin"secret&_searchmode=raw')
    assert response.status_code == 400
    out, err = capfd.readouterr()
    assert "a Datasette SQL query failed" in err
    assert "zeppelin" not in err and "secret" not in err and "zeppelin" not in out


async def test_handled_exceptions_never_print_their_locals(ds, capfd):
    # Datasette's default handler prints every exception it handles, 404s included, with
    # rich's show_locals when rich is installed (the test extra installs it).
    import rich  # noqa: F401

    await ds.invoke_startup()
    capfd.readouterr()
    response = await ds.client.get("/energy/no-such-table?q=zeppelin",
                                   headers={"authorization": "Bearer s3cret-token-value"})
    assert response.status_code == 404
    out, err = capfd.readouterr()
    assert "s3cret-token-value" not in out + err and "zeppelin" not in out + err


async def test_pages_link_the_plugins_own_stylesheet_and_script(ds):
    # The static directory moved with the package (datasette_plugin/static); a page whose
    # static files are not found renders without them, silently.
    page = await ds.client.get("/energy/-/groundkit/search?q=sun")
    assert page.status_code == 200
    css = re.search(r'href="([^"]*/groundkit\.css)"', page.text)
    assert css and re.search(r'src="[^"]*/groundkit\.js"', page.text)
    assert (await ds.client.get(css.group(1))).status_code == 200


async def test_the_plugin_leaves_the_process_streams_and_collector_alone(ds):
    # A failed query's text is withheld by the collection's own Database (the test above),
    # not by replacing sys.stderr for everything else the process prints (adr/0059).
    import gc

    stderr, frozen = sys.stderr, gc.get_freeze_count()
    await ds.invoke_startup()
    assert (await ds.client.get("/energy/-/groundkit/search?q=sun")).status_code == 200
    assert (await ds.client.get('/energy/chunks.json?_search=a"b&_searchmode=raw')).status_code == 400
    assert sys.stderr is stderr and gc.get_freeze_count() == frozen
