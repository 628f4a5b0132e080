"""Paging (``offset``) and grouping (``group_by_document``) of search results, on the JSON API,
MCP and the HTML page: pages are cuts of one ordering, and every surface answers alike."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
import pytest
from datasette.app import Datasette
from mcp import Client

from groundkit_datasette import registry as gk_registry
from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.retrieval.models import MAX_OFFSET

from .test_mcp import Served, drop_volatile, json_call, mcp_body

sys.path.insert(0, str(Path(__file__).parent / "plugins"))
import mcp_test_models  # noqa: E402  (the test-hash embedder: dense search with no model)

SECTIONS = ["Storage", "Cells", "Cycles", "Costs"]


def write_many(root):
    """Forty documents about storage; several have identical text, so their scores tie."""
    root.mkdir(parents=True)
    for i in range(40):
        body = "storage " * (1 + i % 7) + f"filler{i} words here.\n"
        if i % 5 == 0:  # a longer document: one chunk per section
            text = "# Battery book %d\n\n" % i + "".join(
                f"## {s}\n\n{s} of the battery: {'storage ' * (1 + j)}in a home.\n\n"
                for j, s in enumerate(SECTIONS))
        elif i % 3 == 0:
            text = "Identical storage note for the tie rule.\n"
        else:
            text = body
        (root / f"doc{i:02d}.md").write_text(text, encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("paging")
    corpus = write_many(root / "corpus")
    index_dir = root / "index"
    mcp_test_models.register_all(gk_registry.pm)
    try:
        ingest([corpus], collection="many", index_dir=index_dir, embedder="none")
        ingest([corpus], collection="mixed", index_dir=index_dir, embedder="test-hash")
        yield {"corpus": corpus, "index_dir": index_dir}
    finally:
        mcp_test_models.unregister_all(gk_registry.pm)


@pytest.fixture
def ds(built):
    return Datasette(files=[], immutables=[str(built["index_dir"] / f"{n}.sqlite3")
                                           for n in ("many", "mixed")],
                     metadata={"plugins": {"groundkit": {"base_dir": str(built["corpus"])}}})


async def _search(ds, **arguments):
    status, body = await json_call(ds.client, "search", {"collection": "many", **arguments})
    assert status == 200, body
    return body


async def _pages(ds, top_k, **arguments):
    """Every page of one query, following next_offset."""
    pages, offset = [], 0
    while offset is not None:
        body = await _search(ds, top_k=top_k, offset=offset, **arguments)
        pages.append(body)
        offset = body["next_offset"]
    return pages


def _ids(hits):
    return [(h["rank"], h["chunk_id"]) for h in hits]


@pytest.mark.parametrize("collection,mode", [("many", "bm25"), ("mixed", "dense"),
                                             ("mixed", "hybrid")])
async def test_pages_are_cuts_of_one_ordering(ds, collection, mode):
    """Following next_offset walks the same ranking a single deep request returns, ties included."""
    query = {"query": "storage battery home", "mode": mode, "collection": collection}
    whole = await _search(ds, top_k=50, **query)
    assert len(whole["hits"]) > 20
    pages = await _pages(ds, 7, **query)
    walked = [h for p in pages for h in p["hits"]]
    assert _ids(walked[:50]) == _ids(whole["hits"])
    assert [p["offset"] for p in pages] == [7 * i for i in range(len(pages))]
    assert all(p["top_score"] == whole["hits"][0]["score"] for p in pages)
    assert pages[-1]["next_offset"] is None
    assert len({h["chunk_id"] for h in walked}) == len(walked)  # no hit twice
    again = await _pages(ds, 7, **query)
    assert [_ids(p["hits"]) for p in again] == [_ids(p["hits"]) for p in pages]


async def test_bm25_ties_are_broken_the_same_way_on_every_page(ds):
    tied = await _search(ds, query="identical note tie rule", top_k=50, mode="bm25")
    scores = [h["score"] for h in tied["hits"]]
    assert len(scores) != len(set(scores))  # the corpus really has ties
    pages = await _pages(ds, 2, query="identical note tie rule", mode="bm25")
    assert _ids([h for p in pages for h in p["hits"]]) == _ids(tied["hits"])


async def test_a_pages_hits_are_numbered_from_its_offset(ds):
    body = await _search(ds, query="storage", top_k=5, offset=20, mode="bm25")
    assert [h["rank"] for h in body["hits"]] == [21, 22, 23, 24, 25]


@pytest.mark.parametrize("arguments,status,detail", [
    ({"offset": MAX_OFFSET + 1}, 422, "offset"),
    ({"offset": -1}, 422, "offset"),
    ({"offset": "many"}, 422, "offset"),
    ({"offset": 95, "top_k": 10, "mode": "hybrid", "collection": "mixed"}, 400, "hybrid pages"),
])
async def test_offset_is_bounded(ds, arguments, status, detail):
    arguments = {"collection": "many", "query": "storage", **arguments}
    got, body = await json_call(ds.client, "search", arguments)
    assert got == status and detail in body["detail"], body
    assert "95" not in body["detail"] or "offset + top_k" in body["detail"]


async def test_groups_hold_the_pages_hits_by_document(ds):
    plain = await _search(ds, query="battery storage cells cycles", top_k=12, mode="bm25")
    assert plain["groups"] is None
    grouped = await _search(ds, query="battery storage cells cycles", top_k=12, mode="bm25",
                            group_by_document=True)
    assert _ids(grouped["hits"]) == _ids(plain["hits"])  # the option adds, never reorders
    groups = grouped["groups"]
    by_chunk = {h["chunk_id"]: h for h in grouped["hits"]}
    assert sorted(c for g in groups for c in g["chunk_ids"]) == sorted(by_chunk)
    assert [g["best_rank"] for g in groups] == sorted(g["best_rank"] for g in groups)
    assert any(len(g["chunk_ids"]) > 1 for g in groups)
    for g in groups:
        ranks = [by_chunk[c]["rank"] for c in g["chunk_ids"]]
        assert ranks == sorted(ranks) and ranks[0] == g["best_rank"]
        assert {by_chunk[c]["document_id"] for c in g["chunk_ids"]} == {g["document_id"]}


async def test_mcp_answers_the_paging_and_grouping_options_like_the_json_api(ds):
    server = Served(ds.app())
    calls = [
        {"collection": "many", "query": "battery storage", "top_k": 4, "offset": 4,
         "group_by_document": True},
        {"collection": "mixed", "query": "battery storage", "top_k": 3, "offset": 6,
         "mode": "hybrid", "group_by_document": False},
        {"collection": "many", "query": "storage", "offset": MAX_OFFSET + 1},
    ]
    try:
        async with Client(server.url + "/-/groundkit/mcp", mode="legacy",
                          read_timeout_seconds=60) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            props = tools["search"].input_schema["properties"]
            assert props["offset"]["maximum"] == MAX_OFFSET
            assert props["group_by_document"]["type"] == "boolean"
            answers = [mcp_body(await client.call_tool("search", c)) for c in calls]
        async with httpx.AsyncClient(base_url=server.url) as json_client:
            expected = [await json_call(json_client, "search", c) for c in calls]
    finally:
        server.stop()
    for (status, body), (json_status, json_body) in zip(answers, expected):
        assert status == json_status
        assert drop_volatile(body) == drop_volatile(json_body)
    assert answers[0][1]["groups"] and answers[0][1]["offset"] == 4
    assert answers[2][0] == 422


async def test_the_page_links_to_the_next_and_previous_pages(ds):
    r = await ds.client.get("/many/-/groundkit/search?q=storage&top_k=5&mode=bm25")
    assert r.status_code == 200
    nxt = re.search(r'<a href="([^"]+)" rel="next">Next page</a>', r.text).group(1)
    assert "offset=5" in nxt and "top_k=5" in nxt and "q=storage" in nxt
    assert 'rel="prev"' not in r.text
    r2 = await ds.client.get(nxt.replace("&amp;", "&"))
    assert r2.status_code == 200
    assert '<span class="gk-rank">6.</span>' in r2.text and "Hits 6–10" in r2.text
    assert '<span class="gk-rank">1.</span>' not in r2.text
    prev = re.search(r'<a href="([^"]+)" rel="prev">Previous page</a>', r2.text).group(1)
    assert "offset" not in prev
    r = await ds.client.get(f"/many/-/groundkit/search?q=storage&offset={MAX_OFFSET + 1}")
    assert r.status_code == 422 and "offset" in r.text


async def test_the_page_groups_a_documents_hits_when_asked(ds):
    path = "/many/-/groundkit/search?q=battery+storage+cells+cycles&top_k=12&mode=bm25"
    plain = await ds.client.get(path)
    assert "more in this document" not in plain.text
    r = await ds.client.get(path + "&group=1")
    assert r.status_code == 200
    assert re.search(r"<summary>\d+ more in this document</summary>", r.text)
    assert 'id="gk-group" name="group" value="1" checked' in r.text
    # The next page keeps the option.
    assert re.search(r'href="[^"]*group=1[^"]*offset=12[^"]*" rel="next"', r.text)
