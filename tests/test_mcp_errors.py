"""Every status of the error table (docs/api.md, ``service._ERRORS``) as an MCP tool error, on
both transports, with a real client session: the right ``error`` kind and status, the JSON
API's answer for the same call, and nothing from upstream services or bugs in the answer.

The 409s and 502s come from real collections served in a state they really get into: built
with another embedder model, vectors lost, a newer schema version; a model service that
fails (a local HTTP rerank endpoint answering 500, an embedder plugin whose queries fail).
"""

import json
import sqlite3
import shutil
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from datasette.app import Datasette
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from groundkit_datasette import registry as gk_registry
from groundkit_datasette.indexing.ingest import ingest

from .conftest import snapshot, write_corpus
from .test_mcp import Served, drop_volatile, json_call, mcp_body

PLUGINS_DIR = Path(__file__).parent / "plugins"
sys.path.insert(0, str(PLUGINS_DIR))
import mcp_test_models  # noqa: E402  (a test plugin: embedders and a tool with a bug)

LEAKS = ("SENTINEL", "sk-test", "quota", "Traceback", "RuntimeError", "127.0.0.1")

# (server configuration, tool, arguments, status, error kind)
CASES = [
    ("plain", "search", {"collection": "../x", "query": "x"}, 400, "invalid_collection_name"),
    ("plain", "search", {"collection": "vecs", "query": "x", "vector": [0.5, 0.5, 0.5]}, 400,
     "invalid_request"),
    ("plain", "search", {"collection": "energy", "query": "x", "mode": "dense"}, 400, "dense_unavailable"),
    ("plain", "index_status", {"collection": "nope"}, 404, "collection_not_found"),
    ("plain", "fetch_chunk", {"collection": "energy", "chunk_id": "c_" + "0" * 24}, 404, "chunk_not_found"),
    ("plain", "search", {"collection": "drifted", "query": "wind", "mode": "dense"}, 409,
     "embedder_mismatch"),
    ("plain", "search", {"collection": "lost", "query": "wind", "mode": "dense"}, 409, "index_inconsistent"),
    ("plain", "index_status", {"collection": "future"}, 409, "schema_mismatch"),
    ("plain", "search", {"collection": "energy", "query": "x", "top_k": 0}, 422, "malformed_request"),
    ("plain", "search", {"collection": "energy", "query": "x", "rerank": True}, 501, "rerank_not_configured"),
    ("plain", "search", {"collection": "flaky", "query": "wind", "mode": "dense"}, 502, "embedder_error"),
    ("plain", "explode", {}, 500, "internal_error"),
    ("reranked", "search", {"collection": "energy", "query": "wind", "rerank": True}, 502, "reranker_error"),
]
# Reached on these collections, so the errors above are theirs and not of a broken fixture.
SUCCESSES = [
    ("plain", "search", {"collection": "vecs", "query": "wind", "mode": "dense"}),
    ("plain", "index_status", {"collection": "drifted"}),
    ("plain", "search", {"collection": "lost", "query": "wind", "mode": "bm25"}),
    ("plain", "search", {"collection": "flaky", "query": "wind", "mode": "bm25"}),
    ("reranked", "search", {"collection": "energy", "query": "wind"}),
]


class _FailingRerankEndpoint(BaseHTTPRequestHandler):
    """A rerank service that is up but failing: 500 with words that must not reach a caller."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.dumps({"error": mcp_test_models.UPSTREAM_WORDS}).encode()
        self.send_response(500)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def failing_endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FailingRerankEndpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(30)


@pytest.fixture(scope="module")
def built(tmp_path_factory, failing_endpoint):
    root = tmp_path_factory.mktemp("mcp-errors")
    corpus = write_corpus(root / "corpus")
    index_dir = root / "index"
    mcp_test_models.register_all(gk_registry.pm)
    try:
        ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
        ingest([corpus], collection="vecs", index_dir=index_dir, embedder="test-hash")
        # Built with another model of the same embedder than the server has.
        ingest([corpus], collection="drifted", index_dir=index_dir, embedder="test-hash",
               embedder_options={"model": "hash-v2"})
        ingest([corpus], collection="flaky", index_dir=index_dir, embedder="test-query-fails")
        # Its vector table lost (a partial copy, a disk clean-up).
        ingest([corpus], collection="lost", index_dir=index_dir, embedder="test-hash")
        shutil.rmtree(index_dir / "lost.lance")
        # Written by a newer groundkit.
        ingest([corpus], collection="future", index_dir=index_dir, embedder="none")
        with sqlite3.connect(index_dir / "future.sqlite3") as conn:
            conn.execute("PRAGMA user_version = 999")
        conn.close()
        settings = {"index_dir": str(index_dir), "base_dir": str(corpus)}
        configs = {
            "plain": settings,
            "reranked": dict(settings, reranker="http", reranker_options={
                "base_url": failing_endpoint, "allow_private": True}),
        }
        yield {"root": root, "index_dir": index_dir, "configs": configs, "before": snapshot(index_dir)}
    finally:
        mcp_test_models.unregister_all(gk_registry.pm)


def cases(config):
    return [c[1:] for c in CASES if c[0] == config], [c[1:] for c in SUCCESSES if c[0] == config]


async def check_table(client, json_client, config) -> list[tuple[str, str, int]]:
    """Run the table's calls for ``config``; returns (request id, tool, status) of each error."""
    errors, successes = cases(config)
    seen = []
    for name, arguments in successes:
        result = await client.call_tool(name, arguments)
        assert not result.is_error, (name, arguments, result.content[0].text)
    for name, arguments, status, kind in errors:
        result = await client.call_tool(name, arguments)
        assert result.is_error, (name, arguments)
        got_status, body = mcp_body(result)
        assert (got_status, body["error"]) == (status, kind), (name, arguments, body)
        seen.append((body["request_id"], name, status))
        wire = result.model_dump_json(by_alias=True)
        assert not [leak for leak in LEAKS if leak in wire], (name, wire)
        if json_client is not None and name != "explode":
            json_status, json_body = await json_call(json_client, name, arguments)
            assert (json_status, drop_volatile(json_body)) == (status, drop_volatile(body))
    return seen


@pytest.mark.parametrize("config", ["plain", "reranked"])
async def test_every_error_status_over_streamable_http(built, config):
    ds = Datasette(files=[], metadata={"plugins": {"groundkit": built["configs"][config]}})
    server = Served(ds.app())
    try:
        async with Client(server.url + "/-/groundkit/mcp", mode="legacy", read_timeout_seconds=60) as client:
            await check_table(client, ds.client, config)
    finally:
        server.stop()
    assert snapshot(built["index_dir"]) == built["before"]


@pytest.mark.parametrize("config", ["plain", "reranked"])
async def test_every_error_status_over_stdio(built, config, tmp_path):
    metadata = tmp_path / "metadata.json"
    metadata.write_text(json.dumps({"plugins": {"groundkit": built["configs"][config]}}), encoding="utf-8")
    # `groundkit mcp` with the test plugin registered first, as an installed plugin would be.
    launcher = (
        "import sys\n"
        f"sys.path.insert(0, {str(PLUGINS_DIR)!r})\n"
        "import mcp_test_models\n"
        "from groundkit_datasette import registry\n"
        "mcp_test_models.register_all(registry.pm)\n"
        "from groundkit_datasette.cli import cli\n"
        f"cli(['-v', 'mcp', '--metadata', {str(metadata)!r}])\n"
    )
    params = StdioServerParameters(command=sys.executable, args=["-c", launcher])
    with open(tmp_path / "stderr.txt", "w") as errlog:
        async with Client(stdio_client(params, errlog=errlog), mode="legacy", read_timeout_seconds=60) as client:
            seen = await check_table(client, None, config)
    stderr = (tmp_path / "stderr.txt").read_text()
    # Each error's request id is in the server's log, with its tool and status.
    assert len(seen) == len(cases(config)[0])
    lines = stderr.splitlines()
    for request_id, name, status in seen:
        assert any(f"request_id={request_id} " in line and f"surface=mcp-stdio tool={name} status={status} "
                   in line for line in lines), (request_id, name, status)
    assert snapshot(built["index_dir"]) == built["before"]
