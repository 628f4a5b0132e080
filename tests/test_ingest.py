import fcntl
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from groundkit_datasette.indexing import schema
from groundkit_datasette.indexing.terms import TermTable
from groundkit_datasette.errors import CollectionBusy, InvalidCollectionName, InvalidRequest
from groundkit_datasette.indexing.extract import extract_file
from groundkit_datasette.indexing.ingest import Indexer, ingest

from .conftest import snapshot


def open_immutable(path):
    return schema.connect_readonly(path)


def rows(path, sql, params=()):
    conn = open_immutable(path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def test_ingest_builds_a_stamped_immutable_readable_collection(corpus, index_dir):
    report = ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    assert (report.added, report.updated, report.unchanged, report.removed) == (4, 0, 0, 0)
    assert report.skipped == {"binary": 1}
    path = index_dir / "energy.sqlite3"
    assert sorted(p.name for p in index_dir.iterdir() if not p.name.startswith(".")) == [
        "energy.sqlite3"
    ]
    conn = open_immutable(path)
    assert schema.read_stamp(conn) == (schema.APPLICATION_ID, schema.SCHEMA_VERSION)
    assert schema.is_collection_file(path)
    # Rollback-journal mode: an immutable reader sees every committed row.
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    sources = [r[0] for r in conn.execute("SELECT source FROM documents ORDER BY source")]
    assert sources == ["notes/calc.py", "notes/hydro.html", "notes/wind.txt", "solar.md"]
    n_chunks = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
    assert n_chunks == conn.execute("SELECT sum(chunk_count) FROM documents").fetchone()[0]
    assert n_chunks == report.chunks_written > 0
    fts = conn.execute(
        "SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH 'batteries'"
    ).fetchone()[0]
    assert fts == 1
    assert not any(p.name.endswith(("-wal", "-shm", "-journal")) for p in index_dir.iterdir())


def test_offsets_are_exact_against_the_source(corpus, index_dir):
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none", chunk_size=120,
           chunk_overlap=20)
    conn = open_immutable(index_dir / "energy.sqlite3")
    docs = conn.execute("SELECT document_id, source FROM documents").fetchall()
    checked = 0
    for document_id, source in docs:
        text = extract_file(corpus / source).text
        for start, end, ls, le, content in conn.execute(
            "SELECT start_offset, end_offset, line_start, line_end, content FROM chunks "
            "WHERE document_id = ? ORDER BY chunk_index",
            (document_id,),
        ):
            assert text[start:end] == content
            assert ls == text.count("\n", 0, start) + 1
            assert le == text.count("\n", 0, end - 1) + 1
            checked += 1
    assert checked > 6


def test_markdown_heading_path_is_recorded(corpus, index_dir):
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    headings = {
        r[0]
        for r in rows(index_dir / "energy.sqlite3",
                      "SELECT heading FROM chunks JOIN documents USING (document_id) "
                      "WHERE source = 'solar.md'")
    }
    assert "Solar power > Storage" in headings


def test_reingest_is_incremental(corpus, index_dir):
    path = index_dir / "energy.sqlite3"
    first = ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    before = snapshot(index_dir)
    again = ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    assert (again.added, again.updated, again.unchanged) == (0, 0, 4)
    assert not again.published and again.generation == first.generation
    assert snapshot(index_dir) == before  # nothing rewritten when nothing changed

    (corpus / "notes" / "wind.txt").write_text("Wind farms need planning permission.\n")
    (corpus / "notes" / "calc.py").unlink()
    third = ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    assert (third.added, third.updated, third.unchanged, third.removed) == (0, 1, 2, 1)
    assert third.generation == first.generation + 1
    contents = [r[0] for r in rows(path, "SELECT content FROM chunks")]
    assert "Wind farms need planning permission." in contents
    assert not any("Offshore" in c for c in contents)
    assert rows(path, "SELECT count(*) FROM documents WHERE source = 'notes/calc.py'") == [(0,)]
    # FTS and BM25 postings follow the change.
    assert rows(path, "SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH 'offshore'") == [(0,)]
    assert rows(path, "SELECT count(*) FROM bm25_vocab WHERE term = 'offshor'") == [(0,)]
    assert rows(path, "SELECT count(*) FROM bm25_vocab WHERE term = 'permiss'") == [(1,)]


def fts_is_consistent(path, tmp_path) -> bool:
    """FTS5's integrity check, with rank 1 comparing the index against the chunks table."""
    import shutil
    import sqlite3

    copy = tmp_path / "fts-check.sqlite3"
    shutil.copyfile(path, copy)
    conn = sqlite3.connect(copy)
    try:
        conn.execute("INSERT INTO chunks_fts(chunks_fts, rank) VALUES ('integrity-check', 1)")
        return True
    except sqlite3.DatabaseError:
        return False
    finally:
        conn.close()


def test_full_text_index_matches_the_chunks_across_incremental_runs(corpus, index_dir, tmp_path):
    # Ingest indexes new rows in one statement rather than through the per-row trigger.
    path = index_dir / "energy.sqlite3"
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    assert fts_is_consistent(path, tmp_path)
    (corpus / "notes" / "wind.txt").write_text("Turbines whistle in gales.\n\nAnd hum at dusk.\n")
    (corpus / "notes" / "calc.py").unlink()
    (corpus / "tides.md").write_text("# Tides\n\nLagoons store the tide.\n")
    report = ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    assert (report.added, report.updated, report.removed) == (1, 1, 1)
    assert fts_is_consistent(path, tmp_path)
    assert rows(path, "SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH 'lagoons OR gales'") == [(2,)]
    # The published file keeps the trigger, so rows added by hand are indexed too (and the CJK
    # side table's, adr/0022-cjk-search.md).
    assert rows(path, "SELECT name FROM sqlite_master WHERE type = 'trigger' ORDER BY name") == [
        ("chunks_ad",), ("chunks_ai",), ("chunks_cjk_ad",), ("chunks_cjk_ai",)
    ]


def test_pruning_is_limited_to_the_roots_given(corpus, index_dir):
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    (corpus / "solar.md").unlink()
    report = ingest([corpus / "notes"], collection="energy", index_dir=index_dir,
                    embedder="none", base_dir=corpus)
    assert report.removed == 0  # solar.md is outside the root given this time
    report = ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    assert report.removed == 1


def test_failure_inside_a_document_keeps_its_previous_state(corpus, index_dir, monkeypatch):
    path = index_dir / "energy.sqlite3"
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    old_solar = rows(path, "SELECT chunk_id, content FROM chunks JOIN documents USING (document_id) "
                           "WHERE source = 'solar.md' ORDER BY chunk_index")
    (corpus / "solar.md").write_text("# Solar\n\nfirst part\n\n## Two\n\nsecond part BROKEN\n")
    (corpus / "notes" / "wind.txt").write_text("Wind is changed too.\n")

    original = TermTable.encode_many

    def explode(self, texts):
        if any("BROKEN" in text for text in texts):  # fails after the document's chunk rows were written
            raise RuntimeError("disk on fire")
        return original(self, texts)

    monkeypatch.setattr(TermTable, "encode_many", explode)
    report = ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    assert report.failed == 1 and report.updated == 1
    assert report.failed_files == [("solar.md", "write failed")]
    now_solar = rows(path, "SELECT chunk_id, content FROM chunks JOIN documents USING (document_id) "
                           "WHERE source = 'solar.md' ORDER BY chunk_index")
    assert now_solar == old_solar
    assert rows(path, "SELECT content FROM chunks JOIN documents USING (document_id) "
                      "WHERE source = 'notes/wind.txt'") == [("Wind is changed too.",)]


def test_kill_during_ingest_leaves_the_published_file_whole(tmp_path, index_dir):
    corpus = tmp_path / "big"
    corpus.mkdir()
    (corpus / "seed.md").write_text("# Seed\n\nthe first version\n")
    ingest([corpus], collection="big", index_dir=index_dir, embedder="none")
    path = index_dir / "big.sqlite3"
    before = path.read_bytes()
    for i in range(3000):
        (corpus / f"doc{i:05d}.txt").write_text(
            "\n\n".join(f"Paragraph {j} of document {i} about topic {i % 17}." for j in range(30))
        )
    # The child stops itself part-way through the documents (a fast ingest could otherwise
    # finish before a timed kill), says so, and is killed there.
    script = (
        "import sys, time\n"
        "from groundkit_datasette.indexing.ingest import Indexer\n"
        "written = 0\n"
        "def progress(event):\n"
        "    global written\n"
        "    if event['event'] == 'document':\n"
        "        written += 1\n"
        "        if written == 1000:\n"
        "            print('mid-run', flush=True)\n"
        "            time.sleep(120)\n"
        "Indexer('big', index_dir=sys.argv[2], embedder='none', progress=progress)"
        ".ingest([sys.argv[1]])\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(corpus), str(index_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.strip() == "mid-run", proc.stderr.read()
    assert list(index_dir.glob(".big.sqlite3.ingest-*"))  # the private copy is being written
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert path.read_bytes() == before
    assert rows(path, "SELECT count(*) FROM documents") == [(1,)]
    # The next run cleans up after the dead one and completes.
    report = ingest([corpus], collection="big", index_dir=index_dir, embedder="none")
    assert report.added == 3000
    assert not list(index_dir.glob(".big.sqlite3.ingest-*"))


def test_second_ingest_fails_fast_while_one_is_writing(corpus, index_dir):
    lock = os.open(index_dir / ".energy.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        started = time.monotonic()
        with pytest.raises(CollectionBusy, match="being written by another ingest"):
            ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
        assert time.monotonic() - started < 5
    finally:
        os.close(lock)
    assert not (index_dir / "energy.sqlite3").exists()


@pytest.mark.parametrize(
    "name", ["../escape", "a/b", "/abs", "a\\b", "a\0b", "", ".hidden", "x" * 65, "..", "a b"]
)
def test_invalid_names_are_refused_before_touching_disk(corpus, index_dir, name):
    before = snapshot(index_dir)
    with pytest.raises(InvalidCollectionName):
        ingest([corpus], collection=name, index_dir=index_dir, embedder="none")
    assert snapshot(index_dir) == before
    assert list(index_dir.iterdir()) == []


def test_symlink_leaving_the_base_is_refused_and_reported(tmp_path, corpus, index_dir):
    secret = tmp_path / "secret.txt"
    secret.write_text("the password is hunter2\n")
    (corpus / "leak.txt").symlink_to(secret)
    (corpus / "inside.txt").symlink_to(corpus / "solar.md")
    report = ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    assert ("leak.txt", "symlink outside base directory") in report.skipped_files
    assert rows(index_dir / "energy.sqlite3",
                "SELECT count(*) FROM chunks WHERE content LIKE '%hunter2%'") == [(0,)]
    assert rows(index_dir / "energy.sqlite3",
                "SELECT count(*) FROM documents WHERE source = 'inside.txt'") == [(1,)]


def test_walk_order_excludes_and_special_files(corpus, index_dir):
    os.mkfifo(corpus / "notes" / "pipe.txt")  # reading it would block the run
    (corpus / "notes" / "deep").mkdir()
    (corpus / "notes" / "deep" / "a.txt").write_text("Deep water.\n")
    (corpus / "notes" / "z.txt").write_text("Zinc.\n")
    (corpus / "build").mkdir()
    (corpus / "build" / "out.txt").write_text("Generated.\n")
    (corpus / "solar.md.bak").write_text("Old copy.\n")
    report = ingest([corpus], collection="energy", index_dir=index_dir, embedder="none",
                    exclude=["build", "*.bak"])
    assert ("notes/pipe.txt", "not a regular file") in report.skipped_files
    sources = [r[0] for r in rows(index_dir / "energy.sqlite3",
                                  "SELECT source FROM documents ORDER BY rowid")]
    # A directory's files by name, then its subdirectories; excluded names pruned.
    assert sources == ["solar.md", "notes/calc.py", "notes/hydro.html", "notes/wind.txt",
                       "notes/z.txt", "notes/deep/a.txt"]


def test_overlapping_paths_ingest_each_file_once(corpus, index_dir):
    os.mkfifo(corpus / "notes" / "pipe")
    report = ingest([corpus, corpus / "notes" / "wind.txt", corpus / "notes"], collection="energy",
                    index_dir=index_dir, embedder="none")
    assert (report.added, report.failed) == (4, 0)
    assert rows(index_dir / "energy.sqlite3", "SELECT count(*) FROM documents") == [(4,)]
    assert report.skipped_files.count(("notes/pipe", "not a regular file")) == 1


def test_special_files_behind_symlinks_or_given_directly_are_skipped(corpus, index_dir):
    os.mkfifo(corpus / ".pipe")
    (corpus / "link.txt").symlink_to(corpus / ".pipe")  # reading it would block the run
    report = ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    assert ("link.txt", "not a regular file") in report.skipped_files and report.added == 4
    report = ingest([corpus / ".pipe"], collection="solo", index_dir=index_dir, embedder="none",
                    base_dir=corpus)
    assert report.skipped_files == [(".pipe", "not a regular file")]


def test_an_unreadable_directory_is_reported_and_the_rest_ingested(corpus, index_dir, monkeypatch):
    # The tests run as root, for whom mode 000 still lists: the refusal is simulated here.
    (corpus / "locked").mkdir()
    (corpus / "locked" / "a.txt").write_text("Behind a locked door.\n")
    real_scandir = os.scandir

    def scandir(path):
        # The walk lists directories through descriptors: name one by what it opens.
        name = os.readlink(f"/proc/self/fd/{path}") if isinstance(path, int) else path
        if os.path.basename(name) == "locked":
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    report = ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    assert ("locked", "unreadable directory") in report.skipped_files
    assert report.added == 4 and report.published


def test_paths_outside_the_base_dir_are_refused(tmp_path, corpus, index_dir):
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(InvalidRequest, match="outside the base directory"):
        ingest([other], collection="energy", index_dir=index_dir, embedder="none", base_dir=corpus)


def test_sources_are_stored_relative_to_the_base(corpus, index_dir):
    ingest([corpus / "notes"], collection="energy", index_dir=index_dir, embedder="none",
           base_dir=corpus)
    sources = {r[0] for r in rows(index_dir / "energy.sqlite3", "SELECT source FROM documents")}
    assert sources == {"notes/calc.py", "notes/hydro.html", "notes/wind.txt"}


def test_reader_keeps_a_consistent_view_while_ingest_replaces_the_file(tmp_path, index_dir):
    corpus = tmp_path / "c"
    corpus.mkdir()
    for i in range(200):
        (corpus / f"d{i}.txt").write_text(f"alpha document {i}\n\nsecond paragraph {i}\n")
    ingest([corpus], collection="live", index_dir=index_dir, embedder="none")
    path = index_dir / "live.sqlite3"
    held = open_immutable(path)  # a long-lived reader on the old file
    held_count = held.execute("SELECT count(*) FROM chunks").fetchone()[0]

    errors, observed, stop = [], set(), threading.Event()

    def reader():
        while not stop.is_set():
            try:
                conn = open_immutable(path)
                gen = conn.execute(
                    "SELECT value FROM groundkit_manifest WHERE key = 'generation'"
                ).fetchone()[0]
                n = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
                total = conn.execute("SELECT sum(chunk_count) FROM documents").fetchone()[0]
                alpha, beta = (
                    conn.execute("SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH ?", (word,)).fetchone()[0]
                    for word in ("alpha", "beta")
                )
                conn.close()
                # Generation 1 is all alpha, generation 2 all beta: the FTS index matches the rows.
                expected = {"1": (200, 200, 0), "2": (400, 0, 400)}.get(gen)
                if n != total or (n, alpha, beta) != expected:
                    errors.append((gen, n, total, alpha, beta))
                observed.add(gen)
            except Exception as exc:  # any torn read fails the test
                errors.append(repr(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(200):
            (corpus / f"d{i}.txt").write_text(f"beta document {i}\n")
        for i in range(200, 400):
            (corpus / f"d{i}.txt").write_text(f"beta extra {i}\n")
        ingest([corpus], collection="live", index_dir=index_dir, embedder="none")
        time.sleep(0.2)
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert observed == {"1", "2"} or observed == {"2"}
    # The reader that had the old file open still sees the old state, whole.
    assert held.execute("SELECT count(*) FROM chunks").fetchone()[0] == held_count
    assert held.execute("SELECT count(*) FROM documents").fetchone()[0] == 200
    held.close()
    assert rows(path, "SELECT count(*) FROM documents") == [(400,)]


async def test_datasette_browses_the_collection_with_fts(corpus, index_dir):
    from datasette.app import Datasette

    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    ds = Datasette(files=[], immutables=[str(index_dir / "energy.sqlite3")])
    tables = (await ds.client.get("/energy.json")).json()["tables"]
    by_name = {t["name"]: t for t in tables}
    assert by_name["chunks"]["fts_table"] == "chunks_fts"
    assert by_name["documents"]["count"] == 4
    r = await ds.client.get("/energy/chunks.json?_search=batteries&_shape=array")
    assert r.status_code == 200
    assert [row["content"].count("Batteries") for row in r.json()] == [1]


class _WideEmbedder:
    """A second embedder (a real plugin through our hook) with another model and width."""

    provider, model_name, dimensions = "test", "wide-512", 512

    def embed(self, texts):
        import numpy as np

        out = np.ones((len(texts), 512), dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_vectors_bind_the_manifest_and_a_different_model_is_refused(corpus, index_dir):
    from groundkit_datasette import registry as gk_registry
    from groundkit_datasette.errors import EmbedderError
    from groundkit_datasette.hookspecs import hookimpl
    from groundkit_datasette.indexing.vectors import open_table

    first = ingest([corpus], collection="energy", index_dir=index_dir)
    conn = open_immutable(index_dir / "energy.sqlite3")
    manifest = dict(conn.execute("SELECT key, value FROM groundkit_manifest"))
    n_chunks = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
    conn.close()
    assert manifest["embedding_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert manifest["embedding_dimensions"] == "384"
    table = open_table(index_dir / "energy.lance", int(manifest["lance_version"]))
    assert table.count_rows() == n_chunks == first.chunks_embedded

    class Plugin:
        @staticmethod
        @hookimpl
        def register_embedders(register):
            register("wide", lambda **o: _WideEmbedder())

    gk_registry.pm.register(Plugin, name="wide-test")
    try:
        before = snapshot(index_dir)
        (corpus / "solar.md").write_text("# Solar\n\nchanged\n")
        with pytest.raises(EmbedderError) as err:
            ingest([corpus], collection="energy", index_dir=index_dir, embedder="wide")
        message = str(err.value)
        assert "all-MiniLM-L6-v2" in message and "384" in message
        assert "wide-512" in message and "512" in message
        assert snapshot(index_dir) == before
        with pytest.raises(InvalidRequest, match="without vectors"):
            ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    finally:
        gk_registry.pm.unregister(name="wide-test")


def test_only_new_chunk_text_is_embedded_on_reingest(corpus, index_dir):
    first = ingest([corpus], collection="energy", index_dir=index_dir)
    text = (corpus / "solar.md").read_text()
    (corpus / "solar.md").write_text(text + "\n## Grid\n\nNet metering pays for exported power.\n")
    second = ingest([corpus], collection="energy", index_dir=index_dir)
    assert second.updated == 1
    assert 0 < second.chunks_embedded < first.chunks_embedded
    conn = open_immutable(index_dir / "energy.sqlite3")
    n_chunks = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
    version = conn.execute("SELECT value FROM groundkit_manifest WHERE key='lance_version'").fetchone()[0]
    conn.close()
    from groundkit_datasette.indexing.vectors import open_table

    assert open_table(index_dir / "energy.lance", int(version)).count_rows() == n_chunks


def test_pdf_chunks_keep_their_page_numbers_and_verify(tmp_path, index_dir):
    from groundkit_datasette.retrieval.collection import Collection

    from .test_extract import make_pdf

    corpus = tmp_path / "pdfs"
    corpus.mkdir()
    (corpus / "report.pdf").write_bytes(
        make_pdf([["Turbine blades erode at sea."], ["Inspection drones photograph every blade."]])
    )
    ingest([corpus], collection="pdfs", index_dir=index_dir, embedder="none", chunk_size=50,
           chunk_overlap=0)
    pages = rows(index_dir / "pdfs.sqlite3",
                 "SELECT content, page_start, page_end FROM chunks ORDER BY chunk_index")
    by_text = {c.strip(): (ps, pe) for c, ps, pe in pages}
    assert by_text["Turbine blades erode at sea."] == (1, 1)
    assert by_text["Inspection drones photograph every blade."] == (2, 2)
    with Collection.open("pdfs", index_dir=index_dir) as col:
        hit = col.search(query="drones", mode="bm25").hits[0]
        assert hit.page_start == 2
        assert col.fetch_chunk(hit.chunk_id).verification.status == "verified"


@pytest.mark.parametrize("source", ["a.md", "dir.d/file", "file.", ".bashrc", "x.tar.gz", "a/.b.txt",
                                    "noext", "a..b", "..", "a/b.", "d/.md", "notes/Report.PDF"])
def test_the_suffix_ingest_picks_an_extractor_by_is_the_paths_own(source):
    from pathlib import PurePosixPath

    from groundkit_datasette.indexing.prepared import source_suffix as _suffix

    assert _suffix(source) == PurePosixPath(source).suffix
