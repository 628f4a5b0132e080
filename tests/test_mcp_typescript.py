"""A client from another implementation: the official TypeScript SDK (``tests/js``, run by Node)
against ``groundkit mcp`` over stdio and a ``datasette`` server over streamable HTTP.

That client checks every ``structuredContent`` against the tool's ``outputSchema``, so an error
result carrying the error body there makes it throw instead of showing the error. The Python
SDK client tolerates it, which is why this test exists. Node and npm are required: the test
installs the pinned SDK itself (``npm ci``) when ``tests/js/node_modules`` is absent, and fails,
never skips, when Node is missing.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from groundkit_datasette.surfaces.datasette_mcp_bridge import PREFIX
from groundkit_datasette.surfaces.mcp_schema import input_schema, output_schema
from groundkit_datasette.surfaces.mcp_server import ERROR_META_KEY, STATUS_META_KEY
from groundkit_datasette.surfaces.tools import all_tools

from .conftest import snapshot
from .test_mcp import built, cli_args, drop_volatile, json_call, json_ds  # noqa: F401  (built: fixture)

JS_DIR = Path(__file__).parent / "js"
SDK_PACKAGE = JS_DIR / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json"
INSTALL_HINT = "install Node.js 18+ and npm (Debian: apt-get install nodejs npm)"
REQUEST_ID = re.compile(r"^[0-9a-f]{32}$")


@pytest.fixture(scope="module")
def node():
    """The ``node`` executable, with tests/js's locked dependencies installed."""
    node = shutil.which("node")
    if node is None:
        pytest.fail(f"tests/test_mcp_typescript.py runs the TypeScript MCP client: {INSTALL_HINT}")
    if not SDK_PACKAGE.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail(f"tests/js needs `npm ci` and npm is missing: {INSTALL_HINT}")
        proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=JS_DIR,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            pytest.fail(f"`npm ci` in tests/js failed (it needs the npm registry):\n{proc.stderr[-3000:]}")
    locked = json.loads((JS_DIR / "package-lock.json").read_text())
    installed = json.loads(SDK_PACKAGE.read_text())["version"]
    assert installed == locked["packages"]["node_modules/@modelcontextprotocol/sdk"]["version"]
    assert installed.startswith("1."), installed
    return node


def run_client(node, tmp_path, transport: dict, calls: list) -> dict:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"transport": transport, "calls": calls}), encoding="utf-8")
    proc = subprocess.run([node, str(JS_DIR / "mcp_client.mjs"), str(plan)], capture_output=True,
                          text=True, timeout=300, cwd=JS_DIR)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert "fatal" not in out and proc.returncode == 0, (out.get("fatal"), proc.stderr[-3000:])
    return out


async def first_chunk_id(built):
    ds = json_ds(built)
    await ds.invoke_startup()
    status, body = await json_call(ds.client, "search", {"collection": "energy", "query": "batteries"})
    assert status == 200
    return ds, body["hits"][0]["chunk_id"]


def plan(chunk_id, prefix=""):
    """(calls, expectations): every tool once successfully, then each kind of error.

    ``prefix`` names the tools as datasette-mcp's ``/-/mcp`` lists them (``groundkit_``).
    """
    ok = [
        ("list_collections", {}),
        ("index_status", {"collection": "energy"}),
        ("search", {"collection": "energy", "query": "How do batteries store energy?", "top_k": 3}),
        ("fetch_chunk", {"collection": "energy", "chunk_id": chunk_id}),
    ]
    errors = [
        # (tool, arguments, status, kind)
        ("search", {"collection": "nope", "query": "x"}, 404, "collection_not_found"),
        ("index_status", {"collection": "../x"}, 400, "invalid_collection_name"),
        ("search", {"collection": "energy", "query": "x", "top_k": 51}, 422, "malformed_request"),
        ("search", {"collection": "energy", "query": "x", "SENTINEL_FIELD": "SENTINEL_VALUE"}, 422,
         "malformed_request"),
        ("search", {"query": "x"}, 422, "malformed_request"),
        ("search", {"collection": "energy", "query": "x", "mode": "dense"}, 400, "dense_unavailable"),
        ("search", {"collection": "energy", "query": "x", "rerank": True}, 501, "rerank_not_configured"),
        ("fetch_chunk", {"collection": "energy", "chunk_id": "c_000000000000000000000000"}, 404,
         "chunk_not_found"),
        ("fetch_chunk", {"collection": "energy", "chunk_id": "not-a-chunk"}, 422, "malformed_request"),
        ("index_status", {"collection": "private"}, 404, "collection_not_found"),
    ]
    calls = [{"name": prefix + n, "arguments": a} for n, a in ok]
    calls += [{"name": prefix + n, "arguments": a} for n, a, _s, _k in errors]
    if not prefix:  # an unknown name on datasette-mcp's server is that server's own answer
        calls.append({"name": "no_such_tool", "arguments": {}})
    return calls, ok, errors


async def check_output(out, ds, ok, errors, prefix=""):
    tools = {prefix + t.name: t for t in all_tools()}
    listed = {t["name"]: t for t in out["tools"]}
    assert set(listed) == set(tools) if not prefix else set(tools) <= set(listed)
    for name, tool in tools.items():
        assert listed[name]["inputSchema"] == input_schema(tool)
        assert listed[name]["outputSchema"] == output_schema(tool)
        assert listed[name]["annotations"]["readOnlyHint"] is True
    if not prefix:
        assert out["server"]["name"] == "groundkit"
    calls = out["calls"]
    assert len(calls) == len(ok) + len(errors) + (0 if prefix else 1)

    for (name, arguments), call in zip(ok, calls):
        assert call["threw"] is False, (name, call.get("error"))
        result = call["result"]
        assert not result.get("isError"), (name, result)
        status, body = await json_call(ds.client, name, arguments)
        assert status == 200
        # The TypeScript client validated this against the outputSchema before handing it over.
        assert drop_volatile(result["structuredContent"]) == drop_volatile(body)
        assert result["content"][0]["type"] == "text" and result["content"][0]["text"]
        if name == "search":
            hit = body["hits"][0]
            assert f"{hit['source']}:{hit['line_start']}-{hit['line_end']}" in result["content"][0]["text"]
        if name == "fetch_chunk":
            assert result["structuredContent"]["verification"]["status"] == "verified"

    for (name, arguments, status, kind), call in zip(errors, calls[len(ok):]):
        # The defect this file covers: the client threw "Structured content does not match
        # the tool's output schema" here instead of returning the error.
        assert call["threw"] is False, (name, arguments, call.get("error"))
        result = call["result"]
        assert result["isError"] is True
        assert "structuredContent" not in result
        body = json.loads(result["content"][0]["text"])
        assert body == result["_meta"][ERROR_META_KEY]
        assert result["_meta"][STATUS_META_KEY] == status
        assert set(body) == {"ok", "error", "detail", "request_id"}
        assert (body["ok"], body["error"]) == (False, kind), (name, arguments, body)
        assert REQUEST_ID.match(body["request_id"])
        json_status, json_body = await json_call(ds.client, name, arguments) if "collection" in arguments \
            else (status, body)
        assert json_status == status and drop_volatile(json_body) == drop_volatile(body)
        assert "SENTINEL" not in json.dumps(result)

    if prefix:
        return
    unknown = calls[-1]
    assert unknown["threw"] is True and unknown["error"]["code"] == -32602
    assert "unknown tool" in unknown["error"]["message"]
    assert "no_such_tool" not in unknown["error"]["message"]


async def test_typescript_client_over_stdio(node, built, tmp_path):
    ds, chunk_id = await first_chunk_id(built)
    calls, ok, errors = plan(chunk_id)
    transport = {"type": "stdio", "command": sys.executable, "args": cli_args(built),
                 "env": dict(os.environ), "cwd": str(tmp_path)}
    out = run_client(node, tmp_path, transport, calls)
    await check_output(out, ds, ok, errors)
    assert snapshot(built["index_dir"]) == built["before"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def datasette_server(built, tmp_path_factory):
    """``datasette serve`` as a user runs it, the plugin loaded from its entry point."""
    root = tmp_path_factory.mktemp("ts-http")
    metadata = root / "metadata.json"
    metadata.write_text(json.dumps({
        "databases": {"private": {"allow": {"id": "root"}}},
        "plugins": {"groundkit": {"base_dir": str(built["corpus"])}},
    }), encoding="utf-8")
    port = free_port()
    log = open(root / "datasette.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "datasette", "serve", "-h", "127.0.0.1", "-p", str(port),
         "-i", str(built["index_dir"] / "energy.sqlite3"), "-i", str(built["index_dir"] / "private.sqlite3"),
         "-m", str(metadata)],
        stdout=log, stderr=subprocess.STDOUT, cwd=root,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # readiness, not a timed assertion: the deadline only stops a hung start
            assert proc.poll() is None, (root / "datasette.log").read_text()
            try:
                if httpx.get(url + "/-/groundkit/collections.json", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (root / "datasette.log").read_text()
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


async def test_typescript_client_over_streamable_http(node, built, datasette_server, tmp_path):
    ds, chunk_id = await first_chunk_id(built)
    calls, ok, errors = plan(chunk_id)
    out = run_client(node, tmp_path, {"type": "http", "url": datasette_server + "/-/groundkit/mcp"}, calls)
    await check_output(out, ds, ok, errors)
    # Every answer names its request; a tool error's body names the same id as its answer.
    assert out["http"] and all(REQUEST_ID.match(r["requestId"] or "") for r in out["http"]), out["http"]
    header_ids = {r["requestId"] for r in out["http"]}
    for call in out["calls"]:
        if call.get("result", {}).get("isError"):
            assert call["result"]["_meta"][ERROR_META_KEY]["request_id"] in header_ids
    # The client's optional GET for a server stream is refused at once (stateless JSON).
    gets = [r for r in out["http"] if r["method"] == "GET"]
    assert all(r["status"] == 405 and r["allow"] == "POST" for r in gets), gets
    assert snapshot(built["index_dir"]) == built["before"]



async def test_typescript_client_inside_datasette_mcp(node, built, datasette_server, tmp_path):
    """Our tools on datasette-mcp's ``/-/mcp`` (installed by the test extra) read the same way."""
    ds, chunk_id = await first_chunk_id(built)
    calls, ok, errors = plan(chunk_id, prefix=PREFIX)
    out = run_client(node, tmp_path, {"type": "http", "url": datasette_server + "/-/mcp"}, calls)
    await check_output(out, ds, ok, errors, prefix=PREFIX)
