"""The collection page tells its story: when it was ingested and which files that run left out,
stored by ingest in the collection itself (the manifest's ingest_report)."""

from __future__ import annotations

import json
import sqlite3

from datasette.app import Datasette

from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.indexing.report import MAX_REPORTED_FILES

from .conftest import write_corpus
from .test_mcp import json_call


def _ds(index_dir, corpus, name="energy"):
    return Datasette(files=[], immutables=[str(index_dir / f"{name}.sqlite3")],
                     metadata={"plugins": {"groundkit": {"base_dir": str(corpus)}}})


async def test_skipped_files_and_their_reasons_are_kept_in_the_collection(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    index_dir = tmp_path / "index"
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    ds = _ds(index_dir, corpus)
    _s, status = await json_call(ds.client, "index_status", {"collection": "energy"})
    last = status["last_ingest"]
    assert last["ingested_at"] and last["skipped"] == 1 and last["failed"] == 0
    assert last["skipped_files"] == [{"source": "image.raw", "reason": "binary"}]
    page = await ds.client.get("/energy/-/groundkit")
    assert "Left out at ingest" in page.text and "Last ingested" in page.text
    assert '<td class="gk-source">image.raw</td><td>binary</td>' in page.text

    # The next run that publishes replaces the record: the binary file is gone now.
    (corpus / "image.raw").unlink()
    (corpus / "more.md").write_text("# More\n\nAnother note.\n", encoding="utf-8")
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    _s, status = await json_call(_ds(index_dir, corpus).client, "index_status",
                                 {"collection": "energy"})
    assert status["last_ingest"]["skipped"] == 0 and status["last_ingest"]["skipped_files"] == []
    page = await _ds(index_dir, corpus).client.get("/energy/-/groundkit")
    assert "took in every file it found" in page.text


async def test_with_access_lists_only_the_counts_are_shown(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    (corpus / "notes" / "wind.txt.acl.json").write_text(json.dumps({"users": ["alice"]}))
    (corpus / "secret-plans.raw").write_bytes(bytes(range(256)))
    index_dir = tmp_path / "index"
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    ds = _ds(index_dir, corpus)
    _s, status = await json_call(ds.client, "index_status", {"collection": "energy"})
    assert status["last_ingest"]["skipped"] == 2
    assert status["last_ingest"]["skipped_files"] is None
    page = await ds.client.get("/energy/-/groundkit")
    assert "secret-plans" not in page.text and "File names are not shown" in page.text


async def test_a_collection_from_before_the_record_still_answers(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    index_dir = tmp_path / "index"
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    with sqlite3.connect(index_dir / "energy.sqlite3") as conn:
        conn.execute("DELETE FROM groundkit_manifest WHERE key IN ('ingested_at', 'ingest_report')")
    conn.close()
    ds = _ds(index_dir, corpus)
    status, body = await json_call(ds.client, "index_status", {"collection": "energy"})
    assert status == 200 and body["last_ingest"] is None
    page = await ds.client.get("/energy/-/groundkit")
    assert page.status_code == 200 and "written before groundkit recorded" in page.text


def test_the_record_names_a_bounded_number_of_files(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.md").write_text("# A\n\ntext\n", encoding="utf-8")
    for i in range(MAX_REPORTED_FILES + 5):
        (corpus / f"b{i:03d}.raw").write_bytes(bytes(range(256)))
    ingest([corpus], collection="big", index_dir=tmp_path / "index", embedder="none")
    with sqlite3.connect(tmp_path / "index" / "big.sqlite3") as conn:
        raw = conn.execute("SELECT value FROM groundkit_manifest WHERE key = 'ingest_report'"
                           ).fetchone()[0]
    conn.close()
    report = json.loads(raw)
    assert report["skipped"] == MAX_REPORTED_FILES + 5
    assert len(report["skipped_files"]) == MAX_REPORTED_FILES
