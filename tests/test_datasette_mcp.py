"""Our tools inside the datasette-mcp plugin's ``/-/mcp`` server (a real uvicorn server):
listed as ``groundkit_<name>`` with our schemas, answering what the JSON API answers."""

import json

import httpx
import httpx2
import pytest
from datasette.app import Datasette
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from groundkit_datasette.surfaces.datasette_mcp_bridge import PREFIX
from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.surfaces.mcp_schema import input_schema, output_schema
from groundkit_datasette.surfaces.tools import all_tools

from .conftest import snapshot, write_corpus
from .test_mcp import METADATA, SECRET, Served, drop_volatile, json_call, mcp_body

pytest.importorskip("datasette_mcp")

DATASETTE_MCP_OWN = {"list_databases", "get_database_schema", "execute_sql"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("datasette_mcp")
    corpus = write_corpus(root / "corpus")
    index_dir = root / "index"
    for name in ("energy", "private"):
        ingest([corpus], collection=name, index_dir=index_dir, embedder="none")
    return {"corpus": corpus, "index_dir": index_dir, "before": snapshot(index_dir)}


@pytest.fixture(scope="module")
def served(built):
    ds = Datasette(
        files=[],
        immutables=[str(built["index_dir"] / f"{n}.sqlite3") for n in ("energy", "private")],
        metadata={**METADATA, "plugins": {"groundkit": {"base_dir": str(built["corpus"])}}},
        secret=SECRET,
    )
    server = Served(ds.app())
    yield server, ds
    server.stop()


def mcp_client(server, *, cookies=None, headers=None):
    http_client = httpx2.AsyncClient(cookies=cookies, headers=headers, timeout=60)
    return http_client, Client(
        streamable_http_client(server.url + "/-/mcp", http_client=http_client), mode="legacy"
    )


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_tools_listed_next_to_datasette_mcps_own(served, mode):
    server, _ds = served
    async with Client(server.url + "/-/mcp", mode=mode, read_timeout_seconds=60) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
    ours = {PREFIX + t.name: t for t in all_tools()}
    assert set(listed) == DATASETTE_MCP_OWN | set(ours)
    assert {"groundkit_search", "groundkit_fetch_chunk", "groundkit_index_status",
            "groundkit_list_collections"} <= set(listed)
    for name, tool in ours.items():
        mcp_tool = listed[name]
        assert mcp_tool.description == tool.summary
        assert mcp_tool.input_schema == input_schema(tool)
        assert mcp_tool.output_schema == output_schema(tool)
        a = mcp_tool.annotations
        assert (a.read_only_hint, a.destructive_hint, a.idempotent_hint, a.open_world_hint) == (
            True, False, True, False)


async def test_results_and_errors_match_the_json_api(served, built):
    server, _ds = served
    http_client, client = mcp_client(server)
    async with http_client, client, httpx.AsyncClient(base_url=server.url) as json_client:
        arguments = {"collection": "energy", "query": "How do batteries store energy?", "top_k": 3}
        result = await client.call_tool("groundkit_search", arguments)
        status, body = await json_call(json_client, "search", arguments)
        assert status == 200 and not result.is_error
        assert body["hits"] and body["hits"][0]["source"] == "solar.md"
        assert drop_volatile(result.structured_content) == drop_volatile(body)
        first = body["hits"][0]
        assert f"solar.md:{first['line_start']}-{first['line_end']}" in result.content[0].text

        for name, args in [
            ("list_collections", {}),
            ("index_status", {"collection": "energy"}),
            ("fetch_chunk", {"collection": "energy", "chunk_id": first["chunk_id"]}),
        ]:
            result = await client.call_tool(PREFIX + name, args)
            status, body = await json_call(json_client, name, args)
            assert status == 200 and not result.is_error, (name, result)
            assert drop_volatile(result.structured_content) == drop_volatile(body)

        for name, args, expected in [
            ("search", {"collection": "nope", "query": "x"}, (404, "collection_not_found")),
            ("search", {"collection": "../x", "query": "x"}, (400, "invalid_collection_name")),
            # Anonymous: the private collection does not exist for this caller.
            ("index_status", {"collection": "private"}, (404, "collection_not_found")),
            ("search", {"collection": "energy", "query": "x", "SENTINEL_FIELD": "SENTINEL_VALUE"},
             (422, "malformed_request")),
            ("search", {"collection": "energy", "query": ""}, (422, "malformed_request")),
        ]:
            result = await client.call_tool(PREFIX + name, args)
            status, body = await json_call(json_client, name, args)
            assert (status, body["error"]) == expected, (name, args, body)
            assert result.is_error
            assert mcp_body(result)[0] == status
            assert drop_volatile(mcp_body(result)[1]) == drop_volatile(body)
            assert "SENTINEL" not in result.model_dump_json() and "Error executing" not in (
                result.content[0].text)
    assert snapshot(built["index_dir"]) == built["before"]


async def test_calls_run_as_the_requests_datasette_actor(served):
    server, ds = served
    cookies = {"ds_actor": ds.sign({"a": {"id": "root"}}, "actor")}
    http_client, client = mcp_client(server, cookies=cookies)
    async with http_client, client:
        listed = await client.call_tool("groundkit_list_collections", {})
        result = await client.call_tool("groundkit_search", {"collection": "private", "query": "wind"})
    assert listed.structured_content == {"collections": ["energy", "private"]}
    assert not result.is_error and result.structured_content["collection"] == "private"


async def test_groundkits_access_policy_applies_on_its_path(served):
    """``/-/mcp`` is not a groundkit path, but the instance boundary refuses a rebound Host
    before datasette-mcp sees the request (tests/test_boundary.py probes every route)."""
    server, _ds = served
    async with httpx.AsyncClient(base_url=server.url) as client:
        r = await client.post(
            "/-/mcp", headers={"Host": "evil.example", "content-type": "application/json",
                               "accept": "application/json, text/event-stream"},
            content=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
    assert r.status_code == 403 and r.json()["error"] == "host_not_allowed"
