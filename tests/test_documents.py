"""fetch_document: one document read whole, on the JSON API, MCP and its HTML page, with its
source's state and the reader's access lists applied (a hidden document is a missing one)."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from datasette.app import Datasette
from mcp import Client

from groundkit_datasette.indexing.ingest import ingest

from .conftest import snapshot, write_corpus
from .test_mcp import Served, drop_volatile, json_call, mcp_body

LONG = "# Guide\n\n" + "".join(
    f"## Part {i}\n\n" + " ".join(f"word{i}x{j}" for j in range(60)) + "\n\n" for i in range(4))


@pytest.fixture
def built(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    (corpus / "guide.md").write_text(LONG, encoding="utf-8")
    (corpus / "notes" / "wind.txt.acl.json").write_text(json.dumps({"users": ["alice"]}))
    index_dir = tmp_path / "index"
    # Small chunks with overlap: a part spans several chunks that share characters.
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none",
           chunk_size=200, chunk_overlap=40)
    return {"corpus": corpus, "index_dir": index_dir}


@pytest.fixture
def ds(built):
    return Datasette(files=[], immutables=[str(built["index_dir"] / "energy.sqlite3")],
                     metadata={"plugins": {"groundkit": {"base_dir": str(built["corpus"])}}},
                     secret="documents")


async def _document_id(ds, source):
    _s, body = await json_call(ds.client, "search", {"collection": "energy", "query": "word1x3 turbines",
                                                    "source": source})
    return body["hits"][0]["document_id"]


async def _fetch(client, document_id):
    return await json_call(client, "fetch_document", {"collection": "energy",
                                                      "document_id": document_id})


async def test_a_document_is_its_chunks_in_order_with_headings_as_contents(ds, built):
    document_id = await _document_id(ds, "guide.md")
    status, body = await _fetch(ds.client, document_id)
    assert status == 200
    assert body["source"] == "guide.md" and body["title"] == "Guide"
    chunks = body["chunks"]
    assert [c["chunk_index"] for c in chunks] == list(range(len(chunks))) and len(chunks) > 4
    # Each chunk continues where the previous ended: the overlap is marked, not repeated.
    assert any(c["shown_from"] > 0 for c in chunks)
    for prev, c in zip(chunks, chunks[1:]):
        assert c["start_offset"] + c["shown_from"] == max(prev["end_offset"], c["start_offset"])
    text = "".join(c["content"][c["shown_from"]:] for c in chunks)
    for i in range(4):
        assert text.count(f"word{i}x59") == 1
    headings = [h["heading"] for h in body["headings"]]
    assert headings == ["Guide"] + [f"Guide > Part {i}" for i in range(4)]
    starts = {h["chunk_id"]: h for h in body["headings"]}
    for c in chunks:
        if c["chunk_id"] in starts:
            assert c["heading"] == starts[c["chunk_id"]]["heading"]
    assert body["verification"]["status"] == "unchanged"


async def test_the_source_state_is_unchanged_changed_or_missing_and_reading_writes_nothing(ds, built):
    document_id = await _document_id(ds, "guide.md")
    before = snapshot(built["index_dir"])
    guide = built["corpus"] / "guide.md"
    guide.write_text(LONG + "An added line.\n", encoding="utf-8")
    _s, body = await _fetch(ds.client, document_id)
    assert body["verification"] == {"status": "changed",
                                    "reason": "the source file changed since it was ingested"}
    guide.unlink()
    _s, body = await _fetch(ds.client, document_id)
    assert body["verification"]["status"] == "missing"
    assert str(built["corpus"]) not in json.dumps(body)
    assert body["chunks"]  # the indexed text is still shown
    assert snapshot(built["index_dir"]) == before


async def test_a_hidden_document_answers_like_a_missing_one(ds, built):
    alice = {"ds_actor": ds.sign({"a": {"id": "alice"}}, "actor")}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=ds.app()),
                                 base_url="http://localhost", cookies=alice) as client:
        _s, hits = await json_call(client, "search", {"collection": "energy", "query": "turbines",
                                                      "source": "notes/wind.txt"})
        wind = hits["hits"][0]["document_id"]
        status, body = await _fetch(client, wind)
        assert status == 200 and body["source"] == "notes/wind.txt"
    hidden_status, hidden = await _fetch(ds.client, wind)
    missing_status, missing = await _fetch(ds.client, "d_" + "0" * 20)
    assert hidden_status == missing_status == 404
    assert drop_volatile(hidden) == drop_volatile(missing)
    assert hidden["error"] == "document_not_found"
    page = await ds.client.get(f"/energy/-/groundkit/documents/{wind}")
    assert page.status_code == 404 and "turbines" not in page.text.lower()
    bad_status, bad = await _fetch(ds.client, "../etc")
    assert bad_status == 422 and "../etc" not in json.dumps(bad)


async def test_mcp_answers_fetch_document_like_the_json_api(ds, built):
    document_id = await _document_id(ds, "guide.md")
    server = Served(ds.app())
    calls = [{"collection": "energy", "document_id": document_id},
             {"collection": "energy", "document_id": "d_" + "0" * 20},
             {"collection": "energy", "document_id": "nope"}]
    try:
        async with Client(server.url + "/-/groundkit/mcp", mode="legacy",
                          read_timeout_seconds=60) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["fetch_document"].input_schema["properties"]["document_id"]["pattern"]
            answers = [mcp_body(await client.call_tool("fetch_document", c)) for c in calls]
        async with httpx.AsyncClient(base_url=server.url) as json_client:
            expected = [await json_call(json_client, "fetch_document", c) for c in calls]
    finally:
        server.stop()
    assert [a[0] for a in answers] == [200, 404, 422]
    for (status, body), (json_status, json_body) in zip(answers, expected):
        assert status == json_status and drop_volatile(body) == drop_volatile(json_body)


async def test_the_page_shows_contents_anchors_and_the_cited_chunk(ds, built):
    search = await ds.client.get("/energy/-/groundkit/search?q=word2x5")
    link = re.search(r'<a class="gk-document" href="([^"]+)"', search.text).group(1)
    link = link.replace("&amp;", "&")
    path, _, anchor = link.partition("#")
    cited = re.search(r"chunk=(c_[0-9a-f]{24})", path).group(1)
    assert anchor == cited
    r = await ds.client.get(path)
    assert r.status_code == 200
    ids = set(re.findall(r'<div class="gk-doc-chunk[^"]*" id="(c_[0-9a-f]{24})"', r.text))
    toc = re.findall(r'<li class="gk-depth-(\d)"><a href="#(c_[0-9a-f]{24})"[^>]*>([^<]+)</a>', r.text)
    assert [t[2] for t in toc] == ["Guide", "Part 0", "Part 1", "Part 2", "Part 3"]
    assert [t[0] for t in toc] == ["0", "1", "1", "1", "1"]
    assert {t[1] for t in toc} <= ids and cited in ids
    marked = re.findall(r'<div class="gk-doc-chunk gk-doc-cited" id="(c_[0-9a-f]{24})"', r.text)
    assert marked == [cited]
    assert 'class="gk-badge gk-badge-unchanged"' in r.text
    assert "/energy/documents/d_" in r.text and "/energy/chunks?document_id=d_" in r.text
    # A chunk id that is not this document's is ignored, not echoed.
    other = await ds.client.get(path.split("?")[0] + "?chunk=<b>x</b>")
    assert other.status_code == 200 and "gk-doc-cited" not in other.text and "<b>x" not in other.text
    # The chunk page links back to the document.
    chunk_page = await ds.client.get(f"/energy/-/groundkit/chunks/{cited}")
    assert f'?chunk={cited}#{cited}">Read the whole document</a>' in chunk_page.text
