"""verify_quote: quotes checked against the current sources on a real collection, through the
JSON API and the HTML page of a real Datasette app (MCP parity: tests/test_mcp.py's calls)."""

import json

import pytest
from datasette.app import Datasette

from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.retrieval.quotes import MAX_DOCUMENTS_SCANNED, MAX_QUOTE_CHARS, MAX_QUOTES, normalise

from .conftest import snapshot, write_corpus
from .test_extract import make_pdf

SECRET_DOC = ("---\ngroundkit_acl:\n  users: [alice]\n---\n# Merger\n\n"
              "The merger with Northwind closes in March.\n")


@pytest.fixture
def built(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    (corpus / "secret.md").write_text(SECRET_DOC, encoding="utf-8")
    (corpus / "report.pdf").write_bytes(make_pdf([["Quarterly figures rose."],
                                                  ["Tidal power is still experimental."]]))
    index_dir = tmp_path / "index"
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    return corpus, index_dir


def make_ds(built):
    corpus, index_dir = built
    return Datasette(files=[], secret="quote-test", metadata={"plugins": {"groundkit": {
        "index_dir": str(index_dir), "base_dir": str(corpus)}}})


async def verify(ds, body, actor=None, status=200):
    cookies = {"ds_actor": ds.sign({"a": actor}, "actor")} if actor else {}
    r = await ds.client.post("/energy/-/groundkit/verify-quote.json", content=json.dumps(body),
                             headers={"content-type": "application/json"}, cookies=cookies)
    assert r.status_code == status, r.text
    return r.json()


def check_offsets(corpus, match):
    """The offsets index the extracted text: for a text file, the file's characters."""
    text = (corpus / match["source"]).read_text(encoding="utf-8")
    assert text[match["start_offset"]:match["end_offset"]] == match["matched_text"]
    assert text[:match["start_offset"]].endswith(match["context_before"])
    assert text[match["end_offset"]:].startswith(match["context_after"])
    assert match["line_start"] == text.count("\n", 0, match["start_offset"]) + 1


async def test_each_level_gives_its_verdict_source_offsets_lines_and_context(built):
    corpus, index_dir = built
    before = snapshot(index_dir), snapshot(corpus)
    ds = make_ds(built)
    body = await verify(ds, {"quotes": [
        "Batteries store surplus energy for the night.",
        "batteries   store\nSURPLUS energy for the  night",
        "Offshore farms see much steadier winds than onshore ones.",
        "Geothermal wells reach deep reservoirs of hot brine.",
    ]})
    exact, normalised, approximate, missing = body["results"]
    assert (exact["verdict"], exact["score"]) == ("verified", 1.0)
    assert exact["match"]["source"] == "solar.md" and exact["match"]["line_start"] == 8
    check_offsets(corpus, exact["match"])

    assert normalised["verdict"] == "verified_normalised"
    # The span covers the original characters, punctuation and all.
    assert normalised["match"]["matched_text"] == "Batteries store surplus energy for the night"
    check_offsets(corpus, normalised["match"])

    assert approximate["verdict"] == "approximate"
    assert 0.9 <= approximate["score"] < 1.0
    assert approximate["match"]["source"] == "notes/wind.txt"
    assert approximate["match"]["matched_text"].startswith("Offshore farms see steadier")
    check_offsets(corpus, approximate["match"])

    assert missing["verdict"] == "not_found" and missing["match"] is None
    assert body["documents_scanned"] >= 2
    assert (snapshot(index_dir), snapshot(corpus)) == before  # a read changes nothing


async def test_the_similarity_floor_is_the_callers(built):
    ds = make_ds(built)
    quote = "Offshore farms see much steadier winds than onshore ones."
    strict = await verify(ds, {"quotes": [quote], "min_similarity": 0.99})
    assert strict["results"][0]["verdict"] == "not_found"
    assert strict["min_similarity"] == 0.99


async def test_pdf_quotes_name_their_pages(built):
    body = await verify(make_ds(built), {"quotes": ["Tidal power is still experimental."]})
    match = body["results"][0]["match"]
    assert body["results"][0]["verdict"] == "verified"
    assert (match["source"], match["page_start"], match["page_end"]) == ("report.pdf", 2, 2)


async def test_an_attribution_limits_the_search_to_that_source_or_chunk(built):
    ds = make_ds(built)
    wrong = await verify(ds, {"quotes": [{"text": "Batteries store surplus energy",
                                          "source": "notes/"}]})
    assert wrong["results"][0]["verdict"] == "not_found"
    assert "attributed source" in wrong["results"][0]["reason"]
    hit = (await ds.client.get("/energy/-/groundkit/search.json?query=batteries")).json()["hits"][0]
    right = await verify(ds, {"quotes": [{"text": "Lithium-ion cells dominate home storage.",
                                          "chunk_id": hit["chunk_id"]}]})
    result = right["results"][0]
    assert result["verdict"] == "verified" and result["match"]["within_chunk"] is True
    assert result["documents_searched"] == 1
    none = await verify(ds, {"quotes": [{"text": "x", "chunk_id": "c_" + "0" * 24}]})
    assert none["results"][0]["reason"] == "the attributed chunk was not found"


async def test_only_documents_the_caller_may_read_are_searched(built):
    ds = make_ds(built)
    quote = "The merger with Northwind closes in March."
    for attribution in ({}, {"source": "secret.md"}):
        anonymous = await verify(ds, {"quotes": [{"text": quote, **attribution}]})
        assert anonymous["results"][0]["verdict"] == "not_found"
        assert anonymous["results"][0]["documents_searched"] == 0
        alice = await verify(ds, {"quotes": [{"text": quote, **attribution}]}, actor={"id": "alice"})
        assert alice["results"][0]["verdict"] == "verified"
        assert alice["results"][0]["match"]["source"] == "secret.md"


async def test_quotes_are_found_in_the_current_source_not_the_index(built):
    corpus, _ = built
    path = corpus / "notes" / "wind.txt"
    path.write_text("A new first line.\n" + path.read_text(encoding="utf-8")
                    .replace("Maintenance at sea", "Upkeep at sea"), encoding="utf-8")
    ds = make_ds(built)
    body = await verify(ds, {"quotes": ["Offshore farms see steadier winds",
                                        {"text": "Maintenance at sea is expensive",
                                         "source": "notes/wind.txt"}]})
    moved, gone = body["results"]
    assert moved["verdict"] == "verified" and moved["match"]["line_start"] == 3
    check_offsets(corpus, moved["match"])
    assert gone["verdict"] != "verified"


async def test_bounds_are_refused_with_a_clear_status_and_no_echo(built, tmp_path):
    ds = make_ds(built)
    too_many = await verify(ds, {"quotes": ["wind"] * (MAX_QUOTES + 1)}, status=422)
    assert too_many["error"] == "malformed_request" and "quotes" in too_many["detail"]
    secret = "S3CRET-" + "y" * MAX_QUOTE_CHARS
    too_long = await verify(ds, {"quotes": [secret]}, status=422)
    assert "S3CRET" not in json.dumps(too_long)
    await verify(ds, {"quotes": ["wind"], "min_similarity": 0.1}, status=422)


async def test_a_source_matching_too_many_documents_is_413(tmp_path):
    corpus = tmp_path / "many"
    corpus.mkdir()
    for i in range(MAX_DOCUMENTS_SCANNED + 1):
        (corpus / f"n{i:03}.txt").write_text(f"note number {i}\n", encoding="utf-8")
    index_dir = tmp_path / "index"
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    ds = make_ds((corpus, index_dir))
    body = await verify(ds, {"quotes": [{"text": "note number 7", "source": "n*"}]}, status=413)
    assert body["error"] == "too_many_documents"
    ok = await verify(ds, {"quotes": [{"text": "note number 7", "source": "n00*"}]})
    assert ok["results"][0]["match"]["source"] == "n007.txt"


async def test_the_html_page_shows_what_the_json_api_answers(built):
    ds = make_ds(built)
    quote = "Offshore farms see steadier winds"
    body = await verify(ds, {"quotes": [{"text": quote, "source": "notes/"}]})
    match = body["results"][0]["match"]
    r = await ds.client.get("/energy/-/groundkit/verify-quote",
                            params={"quote": quote, "source": "notes/"})
    assert r.status_code == 200
    assert "gk-badge-verified" in r.text and match["source"] in r.text
    assert f"characters {match['start_offset']}–{match['end_offset']}" in r.text
    assert f'<mark class="gk-cited">{quote}</mark>' in r.text
    blank = await ds.client.get("/energy/-/groundkit/verify-quote")
    assert blank.status_code == 200 and "gk-badge" not in blank.text
    bad = await ds.client.get("/energy/-/groundkit/verify-quote", params={"quote": ""})
    assert bad.status_code == 422


def test_normalisation_maps_back_to_the_original_characters():
    text = "Ein  “Straße”\n– end…"
    norm, origin = normalise(text)
    assert norm == 'ein "strasse" - end...'
    assert len(origin) == len(norm)
    i = norm.index("strasse")
    assert text[origin[i]:origin[i + len("strasse") - 1] + 1] == "Straße"
