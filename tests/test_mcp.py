"""MCP over stdio (a real ``groundkit mcp`` subprocess) and streamable HTTP (a real uvicorn
server): the same tools, schemas, results and errors as the JSON API, and nothing written."""

import json
import logging
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import httpx2
import pytest
import uvicorn
from datasette.app import Datasette
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict

from groundkit_datasette import registry as gk_registry
from groundkit_datasette.hookspecs import hookimpl
from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.surfaces.mcp_schema import input_schema, output_schema
from groundkit_datasette.surfaces.mcp_server import ERROR_META_KEY, STATUS_META_KEY
from groundkit_datasette.retrieval.models import MAX_QUERY_CHARS, MAX_TOP_K
from groundkit_datasette.surfaces.tools import Tool, all_tools

from .conftest import snapshot, write_corpus

SECRET = "groundkit-test-secret"
METADATA = {"databases": {"private": {"allow": {"id": "root"}}}}
VOLATILE = ("timings_ms", "request_id")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Two real BM25 collections: ``energy`` (public) and ``private`` (actor root only)."""
    root = tmp_path_factory.mktemp("mcp")
    corpus = write_corpus(root / "corpus")
    index_dir = root / "index"
    for name in ("energy", "private"):
        ingest([corpus], collection=name, index_dir=index_dir, embedder="none")
    metadata_file = root / "metadata.yml"
    metadata_file.write_text(
        "databases:\n  private:\n    allow:\n      id: root\n", encoding="utf-8"
    )
    return {"corpus": corpus, "index_dir": index_dir, "metadata_file": metadata_file,
            "before": snapshot(index_dir)}


def drop_volatile(value):
    if isinstance(value, dict):
        return {k: drop_volatile(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [drop_volatile(v) for v in value]
    return value


def json_ds(built, **extra) -> Datasette:
    """The JSON API configured like ``groundkit mcp --index-dir --base-dir --metadata``."""
    config = {"index_dir": str(built["index_dir"]), "base_dir": str(built["corpus"])}
    return Datasette(files=[], metadata={**METADATA, "plugins": {"groundkit": config}}, **extra)


async def json_call(client, tool_name, arguments):
    """Call one tool through the JSON API (``client`` is ``ds.client`` or an httpx client)."""
    tool = {t.name: t for t in all_tools()}[tool_name]
    arguments = dict(arguments)
    params = {"collection": arguments.pop("collection", None)}
    for p in tool.path_params:
        params[p] = arguments.pop(p)
    # Percent-encoded, or the client would resolve "../x" before sending it.
    path = tool.path(**{k: quote(str(v), safe="") for k, v in params.items()})
    if tool.method == "POST":
        r = await client.post(path, content=json.dumps(arguments),
                              headers={"content-type": "application/json"})
    else:
        assert not arguments
        r = await client.get(path)
    return r.status_code, r.json()


def mcp_body(result):
    """(status, body) of an MCP tool result, in the JSON API's terms.

    An error result carries its body as text and in ``_meta``, never as
    ``structuredContent``: that would have to match the tool's ``outputSchema``.
    """
    if result.is_error:
        assert result.structured_content is None
        body = result.meta[ERROR_META_KEY]
        assert json.loads(result.content[0].text) == body
        return result.meta[STATUS_META_KEY], body
    return 200, result.structured_content


SUCCESS_CALLS = [
    ("list_collections", {}),
    ("index_status", {"collection": "energy"}),
    ("search", {"collection": "energy", "query": "How do batteries store energy?", "top_k": 3}),
    ("search", {"collection": "energy", "query": "turbines", "source": "notes/*"}),
    ("verify_quote", {"collection": "energy", "quotes": [
        "Batteries store surplus energy for the night.",
        {"text": "offshore farms  see STEADIER winds", "source": "notes/"},
        "Geothermal wells reach deep reservoirs of hot brine.",
    ]}),
]

ERROR_CALLS = [
    # (tool, arguments, JSON status, error kind)
    ("search", {"collection": "nope", "query": "x"}, 404, "collection_not_found"),
    ("search", {"collection": "../x", "query": "x"}, 400, "invalid_collection_name"),
    ("index_status", {"collection": "../x"}, 400, "invalid_collection_name"),
    ("search", {"collection": "energy", "query": "x", "top_k": MAX_TOP_K + 1}, 422, "malformed_request"),
    ("search", {"collection": "energy", "query": ""}, 422, "malformed_request"),
    ("search", {"collection": "energy", "query": "x", "secret_field": 1}, 422, "malformed_request"),
    ("fetch_chunk", {"collection": "energy", "chunk_id": "c_000000000000000000000000"}, 404,
     "chunk_not_found"),
    ("fetch_chunk", {"collection": "energy", "chunk_id": "not-a-chunk"}, 422, "malformed_request"),
    ("verify_quote", {"collection": "energy", "quotes": ["x"] * 21}, 422, "malformed_request"),
    ("verify_quote", {"collection": "energy", "quotes": []}, 422, "malformed_request"),
    # Permissions as for the JSON API: anonymous callers cannot see ``private``.
    ("index_status", {"collection": "private"}, 404, "collection_not_found"),
]


async def check_tools_listed(client, expected_tools):
    listed = {t.name: t for t in (await client.list_tools()).tools}
    assert set(listed) == {t.name for t in expected_tools}
    for tool in expected_tools:
        mcp_tool = listed[tool.name]
        assert mcp_tool.description == tool.summary
        assert mcp_tool.input_schema == input_schema(tool)
        assert mcp_tool.input_schema["additionalProperties"] is False
        assert mcp_tool.output_schema == output_schema(tool)
        required = mcp_tool.input_schema.get("required", [])
        props = mcp_tool.input_schema.get("properties", {})
        # An agent sees only the schema: every argument says what it is for.
        undescribed = [p for p, s in props.items() if not s.get("description", "").strip()]
        assert not undescribed, (tool.name, undescribed)
        if tool.scope == "collection":
            assert "collection" in required and props["collection"]["type"] == "string"
        else:
            assert "collection" not in props
        a = mcp_tool.annotations
        assert (a.read_only_hint, a.destructive_hint, a.idempotent_hint, a.open_world_hint) == (
            True, False, True, False)
    search = listed["search"].input_schema
    assert search["properties"]["query"]["maxLength"] == MAX_QUERY_CHARS
    assert search["properties"]["top_k"]["maximum"] == MAX_TOP_K
    assert set(search["required"]) == {"query", "collection"}
    assert listed["fetch_chunk"].input_schema["properties"]["chunk_id"]["pattern"]
    return listed


async def check_parity(client, json_client, *, private_visible=False):
    """Every success and error call answers over MCP what the JSON API answers."""
    for name, arguments in SUCCESS_CALLS:
        result = await client.call_tool(name, arguments)
        status, body = await json_call(json_client, name, arguments)
        assert status == 200 and not result.is_error, (name, body)
        assert drop_volatile(result.structured_content) == drop_volatile(body)
        assert result.content[0].type == "text" and result.content[0].text

    collections = (await client.call_tool("list_collections", {})).structured_content
    assert collections == {"collections": ["energy", "private"] if private_visible else ["energy"]}

    hits = (await client.call_tool("search", {"collection": "energy", "query": "batteries"}))
    first = hits.structured_content["hits"][0]
    assert first["source"] == "solar.md"
    text = hits.content[0].text
    assert f"solar.md:{first['line_start']}-{first['line_end']}" in text and first["chunk_id"] in text

    arguments = {"collection": "energy", "chunk_id": first["chunk_id"]}
    result = await client.call_tool("fetch_chunk", arguments)
    status, body = await json_call(json_client, "fetch_chunk", arguments)
    assert status == 200 and body["verification"]["status"] == "verified"
    assert drop_volatile(result.structured_content) == drop_volatile(body)

    for name, arguments, expected_status, kind in ERROR_CALLS:
        if private_visible and arguments.get("collection") == "private":
            continue
        result = await client.call_tool(name, arguments)
        status, body = await json_call(json_client, name, arguments)
        assert (status, body["error"]) == (expected_status, kind), (name, arguments, body)
        assert result.is_error, (name, arguments)
        mcp_status, mcp_error = mcp_body(result)
        assert mcp_status == status
        assert drop_volatile(mcp_error) == drop_volatile(body)
        assert set(mcp_error) == {"ok", "error", "detail", "request_id"}
        assert json.loads(result.content[0].text) == mcp_error

    with pytest.raises(MCPError, match="unknown tool"):
        await client.call_tool("no_such_tool", {})

    # Only MCP can omit the collection: refused through the same validation wording.
    result = await client.call_tool("search", {"query": "x"})
    status, body = mcp_body(result)
    assert result.is_error and status == 422
    assert body["error"] == "malformed_request"
    assert "collection" in body["detail"]


# -- stdio ----------------------------------------------------------------------


def cli_args(built, *extra):
    return ["-m", "groundkit_datasette.cli", "-v", "mcp", "--index-dir", str(built["index_dir"]),
            "--base-dir", str(built["corpus"]), "--metadata", str(built["metadata_file"]), *extra]


def stdio(built, errlog, *extra):
    """The SDK's stdio client transport, spawning ``groundkit mcp`` as a real subprocess."""
    params = StdioServerParameters(command=sys.executable, args=cli_args(built, *extra))
    return stdio_client(params, errlog=errlog)


async def test_stdio_answers_as_the_actor_it_was_launched_as(built, tmp_path):
    # `private` is for the root actor only (metadata.yml); stdio is anonymous by default.
    with open(tmp_path / "stderr.txt", "w") as errlog:
        async with Client(stdio(built, errlog), read_timeout_seconds=60) as client:
            result = await client.call_tool("list_collections", {})
            assert result.structured_content["collections"] == ["energy"]
            result = await client.call_tool("index_status", {"collection": "private"})
            assert result.is_error and mcp_body(result)[0] == 404
        async with Client(stdio(built, errlog, "--as-user", "root"), read_timeout_seconds=60) as client:
            result = await client.call_tool("list_collections", {})
            assert result.structured_content["collections"] == ["energy", "private"]
            result = await client.call_tool("index_status", {"collection": "private"})
            assert not result.is_error


@pytest.mark.parametrize("mode", ["legacy", "auto"])  # initialize handshake, then 2026 discover
async def test_stdio_tools_results_and_errors_match_the_json_api(built, tmp_path, mode):
    ds = json_ds(built)
    await ds.invoke_startup()
    with open(tmp_path / "stderr.txt", "w") as errlog:
        async with Client(stdio(built, errlog), mode=mode, read_timeout_seconds=60) as client:
            await check_tools_listed(client, all_tools())
            await check_parity(client, ds.client)
    assert "surface=mcp-stdio tool=search status=200" in (tmp_path / "stderr.txt").read_text()
    assert snapshot(built["index_dir"]) == built["before"]


def _read_line(proc, timeout=60.0) -> bytes:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "no reply from the stdio server"
    return proc.stdout.readline()


def test_stdio_stdout_carries_only_json_rpc(built, tmp_path):
    """Stray prints and fd-1 writes inside a tool call go to stderr, with the logs."""
    noisy = (
        "import os, sys\n"
        "import groundkit_datasette.surfaces.service as service\n"
        "real = service.call_tool\n"
        "async def noisy(*args, **kwargs):\n"
        "    print('STRAY PRINT')\n"
        "    sys.stdout.flush()\n"
        "    os.write(1, b'STRAY FD WRITE\\n')\n"
        "    return await real(*args, **kwargs)\n"
        "service.call_tool = noisy\n"
        "from groundkit_datasette.cli import cli\n"
        f"cli({cli_args(built)[2:]!r})\n"
    )
    with open(tmp_path / "err.txt", "wb") as err:
        # Unbuffered, so select() sees every byte readline() has not consumed yet.
        proc = subprocess.Popen([sys.executable, "-c", noisy], bufsize=0, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        def send(message):
            proc.stdin.write((json.dumps(message) + "\n").encode())

        lines = []
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "raw", "version": "0"}}})
        lines.append(_read_line(proc))
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        lines.append(_read_line(proc))
        send({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
              "params": {"name": "search", "arguments": {"collection": "energy", "query": "wind"}}})
        lines.append(_read_line(proc))
        send({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
              "params": {"name": "search", "arguments": {"collection": "../x", "query": "wind"}}})
        lines.append(_read_line(proc))
        rest, _ = proc.communicate(timeout=60)  # closes stdin: the server exits
        lines += rest.splitlines(keepends=True)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    messages = [json.loads(line) for line in lines if line.strip()]
    assert all(m["jsonrpc"] == "2.0" for m in messages)
    assert [m.get("id") for m in messages] == [1, 2, 3, 4]
    assert messages[2]["result"]["structuredContent"]["hits"][0]["source"] == "notes/wind.txt"
    assert messages[3]["result"]["isError"] is True
    stderr = (tmp_path / "err.txt").read_text()
    assert "STRAY PRINT" in stderr and "STRAY FD WRITE" in stderr
    assert "surface=mcp-stdio tool=search status=200" in stderr
    assert snapshot(built["index_dir"]) == built["before"]


# -- streamable HTTP ------------------------------------------------------------


class Served:
    """A real uvicorn server on 127.0.0.1 in a background thread."""

    def __init__(self, app):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive()


def http_ds(built):
    return Datasette(
        files=[],
        immutables=[str(built["index_dir"] / "energy.sqlite3"), str(built["index_dir"] / "private.sqlite3")],
        metadata={**METADATA, "plugins": {"groundkit": {"base_dir": str(built["corpus"])}}},
        secret=SECRET,
    )


@pytest.fixture(scope="module")
def served(built):
    ds = http_ds(built)
    server = Served(ds.app())
    yield server, ds
    server.stop()


def root_cookie(ds):
    return {"ds_actor": ds.sign({"a": {"id": "root"}}, "actor")}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_http_tools_results_and_errors_match_the_json_api(served, mode):
    server, _ds = served
    async with httpx.AsyncClient(base_url=server.url) as json_client:
        async with Client(server.url + "/-/groundkit/mcp", mode=mode, read_timeout_seconds=60) as client:
            await check_tools_listed(client, all_tools())
            await check_parity(client, json_client)


async def test_http_tool_calls_run_as_the_requests_datasette_actor(served, built):
    server, ds = served
    cookies = root_cookie(ds)
    async with httpx.AsyncClient(base_url=server.url, cookies=cookies) as json_client, \
            httpx2.AsyncClient(cookies=cookies, timeout=60) as http_client:
        transport = streamable_http_client(server.url + "/-/groundkit/mcp", http_client=http_client)
        async with Client(transport, mode="legacy") as client:
            await check_parity(client, json_client, private_visible=True)
            arguments = {"collection": "private", "query": "batteries"}
            result = await client.call_tool("search", arguments)
            status, body = await json_call(json_client, "search", arguments)
            assert status == 200 and not result.is_error
            assert drop_volatile(result.structured_content) == drop_volatile(body)
    assert snapshot(built["index_dir"]) == built["before"]


class ExplodeRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ExplodeResponse(BaseModel):
    ok: bool


async def _explode(ctx, collection, request):
    try:
        raise ValueError("SENTINEL-123 /etc/secret")
    except ValueError as exc:
        raise RuntimeError("boom") from exc


class ExplodingPlugin:
    TOOL = Tool(name="explode", summary="Always fails.", request_model=ExplodeRequest,
                response_model=ExplodeResponse, handler=_explode, scope="instance",
                json_route="/-/groundkit/explode.json")

    @hookimpl
    def register_tools(self, register):
        register(self.TOOL)


@pytest.fixture
def exploding_server(built):
    plugin = ExplodingPlugin()
    gk_registry.pm.register(plugin, name="mcp-test-explode")
    try:
        ds = http_ds(built)
        server = Served(ds.app())
        try:
            yield server
        finally:
            server.stop()
    finally:
        gk_registry.pm.unregister(name="mcp-test-explode")


async def test_internal_errors_never_reach_the_client(exploding_server):
    server = exploding_server
    async with Client(server.url + "/-/groundkit/mcp", mode="legacy") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == {t.name for t in all_tools()} and "explode" in names
        result = await client.call_tool("explode", {})
    async with httpx.AsyncClient(base_url=server.url) as json_client:
        r = await json_client.get("/-/groundkit/explode.json")
    status, body = mcp_body(result)
    assert result.is_error and (status, body["error"]) == (500, "internal_error")
    assert r.status_code == 500 and r.json()["error"] == "internal_error"
    assert drop_volatile(body) == drop_volatile(r.json())
    wire = result.model_dump_json(by_alias=True) + r.text
    for leak in ("SENTINEL", "boom", "Traceback", "/etc/secret", "RuntimeError", "ValueError"):
        assert leak not in wire


async def test_mcp_never_writes_to_the_index_dir(served, built, tmp_path):
    """Successful and failing calls on both transports leave every file as it was."""
    server, _ds = served
    before = snapshot(built["index_dir"])
    assert before == built["before"]
    calls = SUCCESS_CALLS + [(n, a) for n, a, _s, _k in ERROR_CALLS]
    async with Client(server.url + "/-/groundkit/mcp", mode="legacy") as client:
        for name, arguments in calls:
            await client.call_tool(name, arguments)
    with open(tmp_path / "stderr.txt", "w") as errlog:
        async with Client(stdio(built, errlog), mode="legacy", read_timeout_seconds=60) as client:
            for name, arguments in calls:
                await client.call_tool(name, arguments)
    assert snapshot(built["index_dir"]) == before
    assert set(os.listdir(built["index_dir"])) == {Path(p).parts[0] for p in before}


# -- malformed input, request ids, GET ---------------------------------------------

SENTINEL = "SENTINEL-7f3a"
REQUEST_ID = r"^[0-9a-f]{32}$"


def nested(depth: int):
    value = []
    for _ in range(depth):
        value = [value]
    return value


def call_line(message_id, **arguments):
    return {"jsonrpc": "2.0", "id": message_id, "method": "tools/call",
            "params": {"name": "search", "arguments": {"collection": "energy", **arguments}}}


def encoded(message) -> bytes:
    return json.dumps(message).encode()


# (raw message, JSON-RPC code, id the answer names); none of them may go unanswered.
MALFORMED = [
    (b"this is not json " + SENTINEL.encode(), -32700, None),
    (b'{"jsonrpc": "2.0", "id": 5, "method": "tools/list"', -32700, None),  # truncated
    # Invalid UTF-8: a stray byte, and a surrogate encoded as UTF-8 bytes (CESU-8).
    (b'{"jsonrpc": "2.0", "id": 6, "method": "tools/list", "x": "\xff"}', -32700, None),
    (b'{"jsonrpc": "2.0", "id": 7, "method": "tools/list", "x": "\xed\xa0\x80"}', -32700, None),
    # A lone surrogate as a JSON escape: parses in Python, encodes nowhere.
    (encoded(call_line(8, query="x \ud800 " + SENTINEL)), -32700, 8),
    (b"[" * 100_000 + b"]" * 100_000, -32600, None),  # RecursionError depth
    (encoded(call_line(10, query="x", vector=nested(100))), -32600, 10),
    (encoded({"id": 11, "params": {SENTINEL: 1}}), -32600, 11),  # JSON, not JSON-RPC
    (encoded({"jsonrpc": "2.0", "id": SENTINEL, "params": 1}), -32600, None),  # a text id is not repeated
    (encoded([{"jsonrpc": "2.0", "id": 12, "method": "tools/list"}]), -32600, None),  # a batch
    # Ids that are not an integer or text, or out of range: refused, never taken as a notification.
    (b'{"jsonrpc": "2.0", "id": NaN, "method": "tools/list"}', -32600, None),
    (b'{"jsonrpc": "2.0", "id": Infinity, "method": "tools/list"}', -32600, None),
    (b'{"jsonrpc": "2.0", "id": -Infinity, "method": "tools/list"}', -32600, None),
    (b'{"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"}', -32600, None),
    (b'{"jsonrpc": "2.0", "id": 1e400, "method": "tools/list"}', -32600, None),
    (b'{"jsonrpc": "2.0", "id": 2.0, "method": "tools/list"}', -32600, None),
    (b'{"jsonrpc": "2.0", "id": 123456789012345678901234567890, "method": "tools/list"}', -32600, None),
    (b'{"jsonrpc": "2.0", "id": true, "method": "tools/list"}', -32600, None),
    (b'{"jsonrpc": "2.0", "id": null, "method": "tools/list"}', -32600, None),
    (b'{"jsonrpc": "2.0", "id": [1], "method": "tools/list"}', -32600, None),
    (b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "notifications/initialized"}', -32600, None),
]


def check_refusal(answer: dict, code: int, message_id) -> str:
    """A JSON-RPC error in fixed words: the right code and id, our request id, no input echoed."""
    assert answer["jsonrpc"] == "2.0" and answer["id"] == message_id, answer
    assert answer["error"]["code"] == code, answer
    assert set(answer["error"]["data"]) == {"request_id"}
    assert re.match(REQUEST_ID, answer["error"]["data"]["request_id"])
    assert SENTINEL not in json.dumps(answer) and "Traceback" not in json.dumps(answer)
    return answer["error"]["data"]["request_id"]


def test_stdio_answers_every_malformed_line_and_echoes_nothing(built, tmp_path):
    """Raw writes to a real ``groundkit mcp``: the SDK alone would drop these lines silently
    and leave the client waiting; an unknown method's name must not come back in error.data."""
    with open(tmp_path / "err.txt", "wb") as err:
        proc = subprocess.Popen([sys.executable, *cli_args(built)], bufsize=0, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        def send(raw: bytes):
            proc.stdin.write(raw + b"\n")

        def answer():
            return json.loads(_read_line(proc))

        send(encoded({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                      "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "raw", "version": "0"}}}))
        assert answer()["id"] == 1
        send(encoded({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        request_ids = []
        for raw, code, message_id in MALFORMED:
            send(raw)
            request_ids.append(check_refusal(answer(), code, message_id))
        # Longer than the body limit (max_body_bytes, 256 KiB): refused, and the rest of it skipped.
        send(b'{"jsonrpc": "2.0", "id": 30, "method": "tools/list", "pad": "' + b"a" * (300 * 1024) + b'"}')
        request_ids.append(check_refusal(answer(), -32600, None))
        send(b"   ")  # a blank line is no message: nothing to answer
        send(encoded({"jsonrpc": "2.0", "id": 20, "method": "tools/" + SENTINEL}))
        unknown = _read_line(proc)
        assert json.loads(unknown)["error"]["code"] == -32601 and json.loads(unknown)["id"] == 20
        assert SENTINEL.encode() not in unknown and b'"data"' not in unknown
        # Still serving after all of that.
        send(encoded(call_line(21, query="wind")))
        hits = answer()["result"]["structuredContent"]["hits"]
        assert hits[0]["source"] == "notes/wind.txt"
        rest, _ = proc.communicate(timeout=60)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and rest == b""
    stderr = (tmp_path / "err.txt").read_text()
    lines = stderr.splitlines()
    for request_id in request_ids:
        assert any(f"request_id={request_id} " in line and "surface=mcp-stdio refused" in line
                   for line in lines), request_id
    assert SENTINEL not in stderr and "Traceback" not in stderr


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def access_lines():
    """The ``groundkit.access`` lines (that logger does not propagate to caplog's handler)."""
    handler = _Lines()
    logger = logging.getLogger("groundkit.access")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(level)


MCP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2025-06-18"}


async def test_http_answers_malformed_bodies_with_json_rpc_errors(served, access_lines):
    server, _ds = served
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        for raw, code, message_id in MALFORMED:
            r = await http.post("/-/groundkit/mcp", content=raw, headers=MCP_HEADERS)
            assert r.status_code == 400, (raw[:60], r.status_code, r.text[:200])
            request_id = check_refusal(r.json(), code, message_id)
            assert r.headers["x-request-id"] == request_id
            assert SENTINEL not in r.text
            assert any(line.startswith(f"request_id={request_id} method=POST route=/-/groundkit/mcp "
                                       "surface=mcp-http refused status=400") for line in access_lines), access_lines
        r = await http.post("/-/groundkit/mcp", headers=MCP_HEADERS,
                            content=encoded({"jsonrpc": "2.0", "id": 3, "method": "tools/" + SENTINEL}))
        assert r.json()["error"]["code"] == -32601 and "data" not in r.json()["error"]
        assert SENTINEL not in r.text and re.match(REQUEST_ID, r.headers["x-request-id"])


async def test_every_http_mcp_answer_carries_its_request_id(served):
    """Successes too, and a tool call's error body names the id of the answer that carries it."""
    server, _ds = served
    seen = []
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        async def post(message):
            r = await http.post("/-/groundkit/mcp", content=encoded(message), headers=MCP_HEADERS)
            assert re.match(REQUEST_ID, r.headers.get("x-request-id", "")), (message, r.headers)
            seen.append(r.headers["x-request-id"])
            return r

        r = await post({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                   "clientInfo": {"name": "raw", "version": "0"}}})
        assert r.status_code == 200 and r.json()["result"]["serverInfo"]["name"] == "groundkit"
        assert (await post({"jsonrpc": "2.0", "method": "notifications/initialized"})).status_code == 202
        assert (await post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).status_code == 200
        r = await post(call_line(3, query="wind"))
        assert r.json()["result"]["structuredContent"]["hits"]
        r = await post({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                        "params": {"name": "search", "arguments": {"collection": "nope", "query": "x"}}})
        result = r.json()["result"]
        assert result["isError"] is True and "structuredContent" not in result
        assert result["_meta"][ERROR_META_KEY]["request_id"] == r.headers["x-request-id"]
        assert json.loads(result["content"][0]["text"])["request_id"] == r.headers["x-request-id"]
        # The SDK's own refusal of the content type, re-shaped: the same id in the header, the body and the log.
        r = await http.post("/-/groundkit/mcp", content=encoded({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}),
                            headers=dict(MCP_HEADERS, **{"content-type": "text/plain"}))
        assert r.status_code in (400, 415) and re.match(REQUEST_ID, r.headers["x-request-id"])
        assert r.json()["request_id"] == r.headers["x-request-id"]
    assert len(set(seen)) == len(seen)


@pytest.mark.parametrize("method", ["GET", "DELETE", "PUT"])
async def test_http_mcp_endpoint_refuses_everything_but_post(served, method):
    """Stateless JSON: no server stream for a GET to hold open, no session for a DELETE to end.
    A client's optional GET must be answered at once (405) rather than held."""
    server, _ds = served
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        r = await http.request(method, "/-/groundkit/mcp", headers={"accept": "text/event-stream"})
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["error"] == "method_not_allowed" and body["request_id"] == r.headers["x-request-id"]


async def test_http_mcp_takes_the_operators_body_limit(built):
    """``max_body_bytes`` bounds MCP bodies as it bounds the JSON API's."""
    config = {"index_dir": str(built["index_dir"]), "base_dir": str(built["corpus"]), "max_body_bytes": 2048}
    ds = Datasette(files=[], metadata={"plugins": {"groundkit": config}})
    await ds.invoke_startup()
    small = encoded(call_line(1, query="wind"))
    big = encoded(call_line(2, query="wind " * 1000))
    r = await ds.client.post("/-/groundkit/mcp", content=small, headers=MCP_HEADERS)
    assert r.status_code == 200 and not r.json()["result"].get("isError")
    r = await ds.client.post("/-/groundkit/mcp", content=big, headers=MCP_HEADERS)
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
    assert r.json()["detail"] == "request body exceeds 2 KiB"
    assert r.json()["request_id"] == r.headers["x-request-id"]
