"""Search modes are hook implementations (modes.py): a plugin's mode, registered once,
appears on every surface (JSON API, MCP over HTTP, HTML, OpenAPI, index_status) and is held
to the reader's access lists without calling anything itself."""

import json
import sys
from pathlib import Path

import httpx
import pytest
from datasette.app import Datasette
from mcp import Client

from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.retrieval.models import SearchRequest
from groundkit_datasette.retrieval.modes import BUILTIN_MODES, registered_modes
from groundkit_datasette.registry import pm

from .conftest import write_corpus
from .test_mcp import Served, drop_volatile, json_call, mcp_body

sys.path.insert(0, str(Path(__file__).parent / "plugins"))
import title_mode  # noqa: E402


@pytest.fixture(scope="module")
def with_title_mode():
    pm.register(title_mode, name="title_mode_test")
    yield
    pm.unregister(name="title_mode_test")


@pytest.fixture(scope="module")
def built(tmp_path_factory, with_title_mode):
    root = tmp_path_factory.mktemp("modes")
    corpus = write_corpus(root / "corpus")
    (corpus / "notes" / "wind.txt.acl.json").write_text(json.dumps({"users": ["alice"]}))
    index_dir = root / "index"
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    return {"corpus": corpus, "index_dir": index_dir}


def make_ds(built):
    return Datasette(files=[], immutables=[str(built["index_dir"] / "energy.sqlite3")],
                     metadata={"plugins": {"groundkit": {"base_dir": str(built["corpus"])}}},
                     secret="modes")


def test_the_built_in_modes_are_registered_through_the_same_hook(with_title_mode):
    names = list(registered_modes())
    assert names[:3] == ["bm25", "dense", "hybrid"] and "title" in names
    assert [m.name for m in BUILTIN_MODES] == names[:3]
    assert SearchRequest(query="x", mode="title").mode == "title"
    with pytest.raises(ValueError, match="mode must be one of: bm25, dense, hybrid, title"):
        SearchRequest(query="x", mode="nope")
    enum = SearchRequest.model_json_schema()["properties"]["mode"]["anyOf"][0]["enum"]
    assert enum == names


def test_without_the_plugin_the_mode_is_gone(with_title_mode):
    pm.unregister(name="title_mode_test")
    try:
        assert "title" not in registered_modes()
        with pytest.raises(ValueError, match="mode must be one of"):
            SearchRequest(query="x", mode="title")
    finally:
        pm.register(title_mode, name="title_mode_test")


async def test_the_mode_answers_on_the_json_api_and_in_index_status(built):
    ds = make_ds(built)
    status, body = await json_call(ds.client, "search", {
        "collection": "energy", "query": "hydro", "mode": "title"})
    assert status == 200 and body["mode"] == "title"
    assert {h["source"] for h in body["hits"]} == {"notes/hydro.html"}
    assert all("title" in h["components"] for h in body["hits"])
    status, body = await json_call(ds.client, "index_status", {"collection": "energy"})
    assert status == 200 and body["modes"] == ["bm25", "title"]  # no vectors here


async def test_access_lists_apply_to_a_plugins_mode(built):
    """The mode returns wind.txt's chunks to everyone; the search removes them for anonymous."""
    ds = make_ds(built)
    _status, anonymous = await json_call(ds.client, "search", {
        "collection": "energy", "query": "wind notes", "mode": "title"})
    assert anonymous["hits"] and "notes/wind.txt" not in {h["source"] for h in anonymous["hits"]}
    alice = {"ds_actor": ds.sign({"a": {"id": "alice"}}, "actor")}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=ds.app()),
                                 base_url="http://localhost", cookies=alice) as client:
        _status, body = await json_call(client, "search", {
            "collection": "energy", "query": "wind notes", "mode": "title"})
    assert "notes/wind.txt" in {h["source"] for h in body["hits"]}
    # The request's own filters apply to it as well.
    _status, body = await json_call(ds.client, "search", {
        "collection": "energy", "query": "hydro solar", "mode": "title", "source": "solar.md"})
    assert {h["source"] for h in body["hits"]} == {"solar.md"}


async def test_the_mode_is_on_mcp_with_the_json_apis_answer(built):
    ds = make_ds(built)
    server = Served(ds.app())
    try:
        async with Client(server.url + "/-/groundkit/mcp", mode="legacy",
                          read_timeout_seconds=60) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            mode_schema = tools["search"].input_schema["properties"]["mode"]
            assert "title" in mode_schema["anyOf"][0]["enum"]
            arguments = {"collection": "energy", "query": "hydro", "mode": "title"}
            status, mcp = mcp_body(await client.call_tool("search", arguments))
        async with httpx.AsyncClient(base_url=server.url) as json_client:
            json_status, body = await json_call(json_client, "search", arguments)
    finally:
        server.stop()
    assert status == json_status == 200
    assert drop_volatile(mcp) == drop_volatile(body)


async def test_the_mode_is_offered_on_the_html_page_and_in_openapi(built):
    ds = make_ds(built)
    r = await ds.client.get("/energy/-/groundkit/search?q=hydro&mode=title")
    assert r.status_code == 200
    assert '<option value="title" selected' in r.text and "notes/hydro.html" in r.text
    doc = (await ds.client.get("/-/groundkit/openapi.json")).json()
    text = json.dumps(doc)
    assert '"title"' in text and '"hybrid"' in text
