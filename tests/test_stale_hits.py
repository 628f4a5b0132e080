"""Stale hits say so: a hit whose source file changed since ingest carries ``source_changed``,
and a drifted but re-anchored fetch_chunk returns the current text beside the indexed one
(real ingest, real files changed on disk, a real Datasette app)."""

import json
import os
import sqlite3

import pytest
from datasette.app import Datasette

from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.indexing.ingest import ingest

from .conftest import write_corpus


@pytest.fixture
def built(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    index_dir = tmp_path / "index"
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    return corpus, index_dir


def flags(built, query):
    corpus, index_dir = built
    with Collection.open("energy", index_dir=index_dir, base_dir=corpus) as col:
        return {h.source: h.source_changed for h in col.search(query=query, mode="bm25").hits}


def test_hits_say_whether_their_source_changed_since_ingest(built):
    corpus, _ = built
    assert flags(built, "turbines") == {"notes/wind.txt": False, "notes/hydro.html": False}
    wind = corpus / "notes" / "wind.txt"
    wind.write_text(wind.read_text() + "Turbines again.\n")
    assert flags(built, "turbines") == {"notes/wind.txt": True, "notes/hydro.html": False}
    (corpus / "notes" / "hydro.html").unlink()
    assert flags(built, "turbines")["notes/hydro.html"] is True


def test_a_touched_file_is_flagged_until_the_next_ingest_records_it(built):
    corpus, index_dir = built
    solar = corpus / "solar.md"
    st = solar.stat()
    os.utime(solar, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert flags(built, "batteries") == {"solar.md": True}
    report = ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    assert report.unchanged == 4 and report.written == 0  # same bytes: nothing re-chunked
    assert flags(built, "batteries") == {"solar.md": False}


def test_a_collection_without_the_record_says_null_and_the_next_ingest_fills_it(built):
    corpus, index_dir = built
    path = index_dir / "energy.sqlite3"
    conn = sqlite3.connect(path)
    with conn:  # what a collection written before the columns looks like
        conn.execute("ALTER TABLE documents DROP COLUMN source_size")
        conn.execute("ALTER TABLE documents DROP COLUMN source_mtime_ns")
    conn.close()
    assert flags(built, "batteries") == {"solar.md": None}
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    assert flags(built, "batteries") == {"solar.md": False}


def make_ds(built):
    corpus, index_dir = built
    return Datasette(files=[], metadata={"plugins": {"groundkit": {
        "index_dir": str(index_dir), "base_dir": str(corpus)}}})


async def test_the_search_page_marks_a_changed_source(built):
    corpus, _ = built
    ds = make_ds(built)
    page = await ds.client.get("/energy/-/groundkit/search?q=batteries&mode=bm25")
    assert page.status_code == 200 and "gk-stale" not in page.text
    solar = corpus / "solar.md"
    solar.write_text(solar.read_text() + "\nMore.\n")
    page = await ds.client.get("/energy/-/groundkit/search?q=batteries&mode=bm25")
    assert "gk-stale" in page.text and "changed since it was indexed" in page.text
    body = (await ds.client.get("/energy/-/groundkit/search.json?query=batteries&mode=bm25")).json()
    assert body["hits"][0]["source_changed"] is True


async def test_a_re_anchored_chunk_returns_the_current_text_and_labels_the_indexed_one(built):
    corpus, _ = built
    ds = make_ds(built)
    hit = (await ds.client.get("/energy/-/groundkit/search.json?query=offshore")).json()["hits"][0]
    wind = corpus / "notes" / "wind.txt"
    wind.write_text("A line added at the top.\n" + wind.read_text())
    r = await ds.client.get(f"/energy/-/groundkit/chunks/{hit['chunk_id']}.json")
    body = r.json()
    v, chunk = body["verification"], body["chunk"]
    assert v["status"] == "drifted" and v["indexed_text"] == "moved_in_source"
    text = wind.read_text()
    a, b = v["relocated"]["start_offset"], v["relocated"]["end_offset"]
    assert v["source_text"] == text[a:b] == chunk["content"]
    assert v["context_before"] == text[max(0, a - 400):a] and "added at the top" in v["context_before"]
    assert chunk["start_offset"] == hit["start_offset"]  # the indexed citation, as indexed
    page = await ds.client.get(f"/energy/-/groundkit/chunks/{hit['chunk_id']}")
    assert "gk-current-text" in page.text and "gk-indexed-text" in page.text

    wind.write_text("Nothing of the old text is left.\n")
    v = (await ds.client.get(f"/energy/-/groundkit/chunks/{hit['chunk_id']}.json")).json()[
        "verification"]
    assert (v["status"], v["indexed_text"], v["source_text"]) == ("drifted", "not_in_source", None)


async def test_a_verified_chunk_says_its_indexed_text_matches(built):
    ds = make_ds(built)
    hit = (await ds.client.get("/energy/-/groundkit/search.json?query=offshore")).json()["hits"][0]
    body = (await ds.client.get(f"/energy/-/groundkit/chunks/{hit['chunk_id']}.json")).json()
    assert body["verification"]["indexed_text"] == "matches_source"
    assert json.dumps(body).count("source_changed") == 0  # a chunk answer is verified instead
