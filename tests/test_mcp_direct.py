"""An MCP ``tools/call`` over HTTP answered in the request's task (surfaces/mcp_direct.py)
answers exactly what the SDK's stateless transport answers for the same request.

The oracle is the real SDK: every request is sent twice to one real Datasette app, once
with the direct path on and once with it off, and status, headers and body must agree.
"""

import json

import pytest
from datasette.app import Datasette

from groundkit_datasette.surfaces import mcp_direct, mcp_http

from .test_mcp import ERROR_CALLS, METADATA, SUCCESS_CALLS, built, served  # noqa: F401 (fixtures)

HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream",
           "mcp-protocol-version": "2025-06-18"}


def call(tool, arguments, message_id=7, **params):
    body = {"name": tool, **params}
    if arguments is not None:
        body["arguments"] = arguments
    return {"jsonrpc": "2.0", "id": message_id, "method": "tools/call", "params": body}


def with_headers(**changes):
    headers = dict(HEADERS)
    for key, value in changes.items():
        key = key.replace("_", "-")
        if value is None:
            headers.pop(key, None)
        else:
            headers[key] = value
    return headers


# (label, headers, message, whether the direct path answers it)
DIRECT = [
    *[(f"success {i}", HEADERS, call(tool, args), True) for i, (tool, args) in enumerate(SUCCESS_CALLS)],
    *[(f"error {i}", HEADERS, call(tool, args), True) for i, (tool, args, _s, _k) in enumerate(ERROR_CALLS)],
    ("no arguments", HEADERS, call("list_collections", None), True),
    ("string id", HEADERS, call("search", {"collection": "energy", "query": "wind"}, message_id="a-1"), True),
    ("no version header", with_headers(mcp_protocol_version=None), call("list_collections", {}), True),
    *[(f"version {v}", with_headers(mcp_protocol_version=v), call("list_collections", {}), True)
      for v in ("2024-11-05", "2025-03-26", "2025-11-25")],
    ("accept json only", with_headers(accept="application/json"), call("list_collections", {}), True),
    ("accept anything", with_headers(accept="*/*"), call("list_collections", {}), True),
    ("charset", with_headers(content_type="application/json; charset=utf-8"), call("list_collections", {}), True),
    ("session id sent", with_headers(mcp_session_id="abc"), call("list_collections", {}), True),
]
SDK = [
    ("progress token", HEADERS, call("search", {"collection": "energy", "query": "wind"},
                                     _meta={"progressToken": 3}), False),
    ("bad _meta", HEADERS, call("list_collections", {}, _meta={"progressToken": True}), False),
    ("bad _meta type", HEADERS, call("list_collections", {}, _meta=5), False),
    ("a float id", HEADERS, call("list_collections", {}, message_id=1.0), False),
    ("another param", HEADERS, call("list_collections", {}, task={"ttl": 1}), False),
    ("an error member too", HEADERS, {**call("list_collections", {}), "error": {"code": 1, "message": "x"}}, False),
    ("a result member too", HEADERS, {**call("list_collections", {}), "result": {}}, False),
    ("content type after a space", with_headers(content_type=" application/json"), call("list_collections", {}), False),
    ("tools/list", HEADERS, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, False),
    ("initialize", HEADERS, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                             "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                        "clientInfo": {"name": "t", "version": "0"}}}, False),
    ("notification", HEADERS, {"jsonrpc": "2.0", "method": "notifications/initialized"}, False),
    ("unknown tool", HEADERS, call("drop_tables", {}), False),
    ("tool name not a string", HEADERS, call(5, {}), False),
    ("arguments a list", HEADERS, call("list_collections", [1]), False),
    ("params a list", HEADERS, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": [1]}, False),
    ("modern version", with_headers(mcp_protocol_version="2026-07-28"), call("list_collections", {}), False),
    ("unknown version", with_headers(mcp_protocol_version="1999-01-01"), call("list_collections", {}), False),
    ("content type case", with_headers(content_type="Application/JSON"), call("list_collections", {}), False),
    ("accept sse only", with_headers(accept="text/event-stream"), call("list_collections", {}), False),
    ("accept html", with_headers(accept="text/html"), call("list_collections", {}), False),
]


@pytest.fixture
def app(built):  # noqa: F811
    config = {"index_dir": str(built["index_dir"]), "base_dir": str(built["corpus"])}
    return Datasette(files=[], metadata={**METADATA, "plugins": {"groundkit": config}})


@pytest.fixture
def taken(monkeypatch):
    """What the direct path answered for each request (True) or handed to the SDK (False)."""
    seen = []
    real = mcp_direct.answer

    async def recording(*args):
        answered = await real(*args)
        seen.append(answered)
        return answered

    monkeypatch.setattr(mcp_direct, "answer", recording)
    return seen


def normalized(response):
    """(status, headers, body) with the per-request id and timings replaced by placeholders."""
    request_id = response.headers["x-request-id"]
    text = response.text.replace(request_id, "<request id>")
    body = json.loads(text) if text else None
    return response.status_code, normalized_headers(response, request_id), drop_timings(body)


def normalized_headers(response, request_id):
    """The length only as right or wrong: timings make it vary by a digit."""
    length = str(len(response.content))
    return sorted((k, "<request id>" if v == request_id else "<right length>" if (k, v) == ("content-length", length)
                   else v) for k, v in response.headers.items() if k not in ("date", "server"))


def drop_timings(value):
    if isinstance(value, dict):
        return {k: drop_timings(v) for k, v in value.items() if k != "timings_ms"}
    if isinstance(value, list):
        return [drop_timings(v) for v in value]
    if isinstance(value, str) and value.startswith("{"):
        try:  # a tool error's body travels as text too
            return drop_timings(json.loads(value))
        except ValueError:
            return value
    return value


async def post(app, headers, message, cookies=None):
    return await app.client.post("/-/groundkit/mcp", content=json.dumps(message).encode(),
                                 headers=headers, cookies=cookies)


@pytest.mark.parametrize("label,headers,message,direct", DIRECT + SDK, ids=[c[0] for c in DIRECT + SDK])
async def test_the_direct_answer_is_the_sdks(app, taken, monkeypatch, label, headers, message, direct):
    await app.invoke_startup()
    ours = await post(app, headers, message)
    assert taken == [True] if direct else True not in taken  # (a list of params is refused before)
    answered = list(taken)
    monkeypatch.setattr(mcp_http, "DIRECT_CALLS", False)
    sdk = await post(app, headers, message)
    assert taken == answered  # the oracle did not go through the direct path
    assert normalized(ours) == normalized(sdk)
    if direct:
        assert ours.status_code == 200 and ("result" in ours.json() or "error" in ours.json())


async def test_the_direct_answer_carries_the_callers_actor(app, taken, monkeypatch):
    """Datasette's permissions see the HTTP caller on the direct path as on the SDK's."""
    await app.invoke_startup()
    cookies = {"ds_actor": app.sign({"a": {"id": "root"}}, "actor")}
    message = call("index_status", {"collection": "private"})
    ours = await post(app, HEADERS, message, cookies)
    anonymous = await post(app, HEADERS, message)
    assert taken == [True, True]
    assert ours.json()["result"]["structuredContent"]["collection"] == "private"
    assert anonymous.json()["result"]["isError"] is True
    monkeypatch.setattr(mcp_http, "DIRECT_CALLS", False)
    assert normalized(await post(app, HEADERS, message, cookies)) == normalized(ours)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_sdks_own_client_over_http_is_answered_by_the_direct_path(served, taken, mode):  # noqa: F811
    """What a real client sends, not only this file's requests: the mcp SDK's client over
    streamable HTTP (a real uvicorn server). In its handshake mode (what clients of the
    2025 versions send) the call takes the direct path; in "auto" it speaks 2026-07-28,
    which the SDK itself answers in the request's task, and the direct path stays out."""
    from mcp.client import Client

    server, _ds = served
    async with Client(server.url + "/-/groundkit/mcp", mode=mode, read_timeout_seconds=60) as client:
        result = await client.call_tool("search", {"collection": "energy", "query": "wind"})
    assert not result.is_error and result.structured_content["hits"]
    assert taken.count(True) == (1 if mode == "legacy" else 0)
