"""Hits that say how well they match (issue 15): each hit's ``matched_terms``, a response's
``lexical_match`` (the "espresso" case: a word in no file, which dense and hybrid still answer
with every chunk), and the ``min_score`` floor, alike on the JSON API, MCP and the HTML page."""

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
from groundkit_datasette.retrieval.bm25 import query_words, tokenize

from .test_mcp import Served, drop_volatile, json_call, mcp_body

sys.path.insert(0, str(Path(__file__).parent / "plugins"))
import mcp_test_models  # noqa: E402  (the test-hash embedder: dense search with no model)

DOCS = {
    "tea.md": "# Tea\n\nGreen tea leaves are steamed, then rolled. Brew the tea at 80 degrees.\n",
    "batteries.md": "# Batteries\n\nBatteries store surplus energy for the night.\n",
    "wind.txt": "Wind turbines turn in steady offshore winds.\n",
    "hydro.txt": "Dams hold water and release it through turbines when power is dear.\n",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("match")
    corpus = root / "corpus"
    corpus.mkdir()
    for name, text in DOCS.items():
        (corpus / name).write_text(text, encoding="utf-8")
    index_dir = root / "index"
    mcp_test_models.register_all(gk_registry.pm)
    try:
        ingest([corpus], collection="drinks", index_dir=index_dir, embedder="test-hash")
        yield {"corpus": corpus, "index_dir": index_dir}
    finally:
        mcp_test_models.unregister_all(gk_registry.pm)


@pytest.fixture
def ds(built):
    return Datasette(files=[], immutables=[str(built["index_dir"] / "drinks.sqlite3")],
                     metadata={"plugins": {"groundkit": {"base_dir": str(built["corpus"])}}})


async def _search(ds, **arguments):
    status, body = await json_call(ds.client, "search", {"collection": "drinks", **arguments})
    assert status == 200, body
    return body


def test_query_words_are_the_tokenizers_terms_beside_the_words_typed():
    """One rule: the words matched_terms reports stand for exactly the terms BM25 searched."""
    for query in ["How do Batteries store the energy?", "東京都の tea-time, 80 degrees",
                  "the and of", "naïve café au lait"]:
        assert [t for _, t in query_words(query)] == tokenize(query)
    assert query_words("Storing BATTERIES") == (("storing", "store"), ("batteries", "batteri"))


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
async def test_every_hit_says_which_query_words_it_holds(ds, mode):
    body = await _search(ds, query="Storing batteries and brewing tea", mode=mode, top_k=10)
    by_source = {h["source"]: h["matched_terms"] for h in body["hits"]}
    assert by_source["batteries.md"] == ["storing", "batteries"]  # same stem as "store"
    assert by_source["tea.md"] == ["brewing", "tea"]  # "brewing" and "brew" share a stem
    if mode != "bm25":  # dense and hybrid fill top_k: the others hold no query word
        assert by_source["wind.txt"] == [] and by_source["hydro.txt"] == []
    assert body["lexical_match"] is True and body["note"] is None


@pytest.mark.parametrize("mode", ["dense", "hybrid"])
async def test_a_word_in_no_file_is_flagged_however_many_hits_come_back(ds, mode):
    """The issue's "espresso": dense returns every chunk at some score; the response says none
    of them holds the word."""
    body = await _search(ds, query="espresso", mode=mode)
    assert len(body["hits"]) == len(DOCS)
    assert all(h["matched_terms"] == [] for h in body["hits"])
    assert body["lexical_match"] is False
    assert "only semantically near" in body["note"]


async def test_bm25_finds_nothing_for_it_and_says_so(ds):
    body = await _search(ds, query="espresso", mode="bm25")
    assert body["hits"] == [] and body["lexical_match"] is False and body["note"]
    # A query of stop words only has no word to match either.
    assert (await _search(ds, query="the and of", mode="dense"))["lexical_match"] is False


async def test_lexical_match_counts_only_chunks_the_search_may_return(ds):
    """A filter (like a reader's permissions, the same Allowed set) hides a match elsewhere."""
    assert (await _search(ds, query="tea", mode="dense"))["lexical_match"] is True
    body = await _search(ds, query="tea", mode="dense", source="batteries.md")
    assert [h["source"] for h in body["hits"]] == ["batteries.md"]
    assert body["lexical_match"] is False


async def test_min_score_is_a_floor_on_the_modes_own_score(ds):
    full = await _search(ds, query="turbines tea", mode="bm25")
    scores = [h["score"] for h in full["hits"]]
    assert len(scores) == 3
    floor = (scores[0] + scores[-1]) / 2
    cut = await _search(ds, query="turbines tea", mode="bm25", min_score=floor)
    assert [h["chunk_id"] for h in cut["hits"]] == [
        h["chunk_id"] for h in full["hits"] if h["score"] >= floor]
    assert 0 < len(cut["hits"]) < 3

    dense = await _search(ds, query="espresso", mode="dense")
    cosines = sorted(h["score"] for h in dense["hits"])
    floor = (cosines[0] + cosines[-1]) / 2
    cut = await _search(ds, query="espresso", mode="dense", min_score=floor)
    assert sorted(h["score"] for h in cut["hits"]) == [c for c in cosines if c >= floor]
    assert (await _search(ds, query="espresso", mode="dense", min_score=1.5))["hits"] == []


async def test_hybrid_floor_keeps_keyword_hits_and_dense_hits_above_the_cosine(ds):
    lexical = {h["chunk_id"] for h in (await _search(ds, query="turbines", mode="bm25"))["hits"]}
    # No cosine reaches 1.5: what stays is what BM25 matched, in fused order.
    body = await _search(ds, query="turbines", mode="hybrid", min_score=1.5)
    assert {h["chunk_id"] for h in body["hits"]} == lexical
    assert all("bm25" in h["components"] for h in body["hits"])
    # A floor under every cosine keeps every hit.
    everything = await _search(ds, query="turbines", mode="hybrid")
    low = await _search(ds, query="turbines", mode="hybrid", min_score=-1)
    assert [h["chunk_id"] for h in low["hits"]] == [h["chunk_id"] for h in everything["hits"]]
    # The espresso case with a floor: nothing left.
    assert (await _search(ds, query="espresso", mode="hybrid", min_score=1.5))["hits"] == []


@pytest.mark.parametrize("value", ["high", "nan", "inf"])
async def test_a_floor_that_is_not_a_finite_number_is_refused(ds, value):
    r = await ds.client.get(f"/drinks/-/groundkit/search.json?query=tea&min_score={value}")
    assert r.status_code == 422
    assert r.json()["error"] == "malformed_request" and "min_score" in r.json()["detail"]


async def test_the_page_shows_matched_words_and_flags_a_query_no_file_holds(ds):
    r = await ds.client.get("/drinks/-/groundkit/search?q=batteries+tea&mode=hybrid")
    assert r.status_code == 200
    assert "Matched: <mark>batteries</mark>" in r.text and "Matched: <mark>tea</mark>" in r.text
    assert "gk-no-lexical" not in r.text
    r = await ds.client.get("/drinks/-/groundkit/search?q=espresso&mode=dense")
    assert r.status_code == 200
    assert '<p class="gk-no-lexical message-warning">No chunk you can read contains' in r.text
    items = re.findall(r'<li class="gk-hit( gk-hit-weak)?">', r.text)
    assert len(items) == len(DOCS) and all(items)  # every hit shown as weak
    assert r.text.count("No query word in this chunk.") == len(DOCS)


async def test_the_page_passes_the_floor_on_and_escapes_the_query(ds):
    r = await ds.client.get("/drinks/-/groundkit/search?q=turbines&mode=hybrid&min_score=1.5")
    assert r.status_code == 200
    assert 'name="min_score" value="1.5"' in r.text
    assert len(re.findall(r'<li class="gk-hit', r.text)) == 2
    r = await ds.client.get("/drinks/-/groundkit/search?q=%3Cscript%3Etea&mode=bm25")
    assert r.status_code == 200
    assert "<script>tea" not in r.text and "Matched: <mark>tea</mark>" in r.text


async def test_mcp_answers_the_new_fields_like_the_json_api(ds):
    server = Served(ds.app())
    calls = [
        {"collection": "drinks", "query": "espresso", "mode": "dense"},
        {"collection": "drinks", "query": "turbines tea", "mode": "hybrid", "min_score": 1.5},
        {"collection": "drinks", "query": "Storing batteries", "mode": "bm25", "min_score": 0.1},
        {"collection": "drinks", "query": "tea", "min_score": "high"},
    ]
    try:
        async with Client(server.url + "/-/groundkit/mcp", mode="legacy",
                          read_timeout_seconds=60) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            props = tools["search"].input_schema["properties"]
            assert "min_score" in props and "cosine" in props["min_score"]["description"]
            output = tools["search"].output_schema
            assert "lexical_match" in output["properties"]
            results = [await client.call_tool("search", c) for c in calls]
        async with httpx.AsyncClient(base_url=server.url) as json_client:
            expected = [await json_call(json_client, "search", c) for c in calls]
    finally:
        server.stop()
    for result, (json_status, json_body) in zip(results, expected):
        status, body = mcp_body(result)
        assert status == json_status
        assert drop_volatile(body) == drop_volatile(json_body)
    assert expected[0][1]["lexical_match"] is False
    assert "Note: No chunk you can read" in results[0].content[0].text
    assert "matched: no query word" in results[0].content[0].text
    assert "matched: storing, batteries" in results[2].content[0].text
    assert expected[3][0] == 422
