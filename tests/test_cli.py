"""The ``groundkit`` command line: every command, its defaults, its exit statuses and its words.

Most tests go through click's CliRunner (in process, real files); a few run the command as a real
subprocess so the module entry point and the process exit status are checked too.
"""

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from groundkit_datasette import cli as cli_module
from groundkit_datasette.indexing import ingest as ingest_module
from groundkit_datasette import registry as gk_registry
from groundkit_datasette.cli import cli
from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.hookspecs import hookimpl
from groundkit_datasette.indexing.schema import connect_readonly
from groundkit_datasette.indexing.vectors import open_table

from .conftest import manifest
from .test_extract import make_pdf


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def run_process(*args, cwd=None):
    """The CLI as a user runs it: a new Python process, its real exit status."""
    return subprocess.run(
        [sys.executable, "-m", "groundkit_datasette.cli", *map(str, args)],
        capture_output=True, text=True, cwd=cwd, timeout=300, env=dict(os.environ),
    )


def query(path, sql, params=()):
    conn = connect_readonly(path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


class _PoisonEmbedder:
    """Stands in for a remote embedding service that refuses some inputs (cannot run here)."""

    provider, model_name, dimensions = "test", "poison-8", 8

    def embed(self, texts):
        if any("POISON" in t for t in texts):
            raise RuntimeError("the service refused the batch")
        out = np.ones((len(texts), 8), dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.fixture
def poison_embedder(monkeypatch):
    class Plugin:
        @staticmethod
        @hookimpl
        def register_embedders(register):
            register("poison", lambda **o: _PoisonEmbedder())

    gk_registry.pm.register(Plugin, name="poison-test")
    # One document per embedding call, so one poisoned file fails alone.
    monkeypatch.setattr(ingest_module, "EMBED_BATCH_CHUNKS", 1)
    yield "poison"
    gk_registry.pm.unregister(name="poison-test")


# -- ingest ------------------------------------------------------------------


def test_ingest_defaults_to_1000_character_chunks_with_100_overlap(corpus, index_dir):
    """The documented defaults: a changed default breaks this test."""
    result = run("ingest", corpus, "-c", "energy", "--index-dir", index_dir, "--embedder", "none")
    assert result.exit_code == 0, result.output
    chunker = json.loads(manifest(index_dir / "energy.sqlite3")["chunker"])
    assert chunker == {"chunk_size": 1000, "chunk_overlap": 100, "header": "title > headings"}


def test_ingest_summary_names_skipped_files_and_ends_with_the_serve_command(corpus, index_dir):
    result = run("ingest", corpus, "-c", "energy", "--index-dir", index_dir, "--embedder", "none")
    assert result.exit_code == 0
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "4 added, 0 updated, 0 unchanged, 0 removed, 1 skipped, 0 failed"
    assert "  skipped: image.raw (binary)" in lines
    assert lines[-2] == f"Collection: {index_dir / 'energy.sqlite3'}"
    assert lines[-1] == f"Serve it with: groundkit serve {index_dir / 'energy.sqlite3'}"


def test_the_plain_summary_names_five_and_says_how_to_see_all(corpus, index_dir):
    for i in range(8):
        (corpus / f"blob{i}.raw").write_bytes(bytes(range(256)) * 4)
    args = ["ingest", corpus, "-c", "energy", "--index-dir", index_dir, "--embedder", "none"]
    plain = run(*args)
    named = [line for line in plain.stdout.splitlines() if line.startswith("  skipped: ")]
    assert len(named) == 5
    assert "  ... and 4 more; run with -v (or --json) to list every file" in plain.stdout
    shutil.rmtree(index_dir)
    verbose = run(*args, "-v")
    named = [line for line in verbose.stdout.splitlines() if line.startswith("  skipped: ")]
    assert sorted(named) == sorted(
        [f"  skipped: blob{i}.raw (binary)" for i in range(8)] + ["  skipped: image.raw (binary)"]
    )
    assert "more; run with" not in verbose.stdout
    shutil.rmtree(index_dir)
    top_level = CliRunner().invoke(cli, ["-v", *map(str, args)])  # groundkit -v ingest ...
    assert len([line for line in top_level.stdout.splitlines() if line.startswith("  skipped: ")]) == 9
    shutil.rmtree(index_dir)
    as_json = json.loads(run(*args, "--json").stdout)
    assert {"source": "blob7.raw", "reason": "binary"} in as_json["skipped_files"]
    assert len(as_json["skipped_files"]) == as_json["skipped"] == 9
    assert as_json["failed_files"] == []
    assert as_json["path"] == str(index_dir / "energy.sqlite3")


def test_some_files_failed_exits_1_names_them_and_publishes_the_rest(corpus, index_dir, poison_embedder):
    (corpus / "notes" / "wind.txt").write_text("POISON in the wind\n")
    result = run("ingest", corpus, "-c", "energy", "--index-dir", index_dir,
                 "--embedder", poison_embedder)
    assert result.exit_code == 1, result.output
    assert "  failed: notes/wind.txt (embedding failed)" in result.stdout
    assert result.stdout.splitlines()[0].endswith("1 skipped, 1 failed")
    sources = [r[0] for r in query(index_dir / "energy.sqlite3", "SELECT source FROM documents")]
    assert "notes/wind.txt" not in sources and len(sources) == 3

    again = run("ingest", corpus, "-c", "energy", "--index-dir", index_dir,
                "--embedder", poison_embedder, "--json")
    assert again.exit_code == 3  # files failed and none was written this time
    report = json.loads(again.stdout)
    assert report["failed_files"] == [{"source": "notes/wind.txt", "reason": "embedding failed"}]


def test_a_first_ingest_in_which_every_file_failed_exits_3_and_publishes_nothing(
    tmp_path, poison_embedder
):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n\nPOISON one\n")
    (docs / "b.txt").write_text("POISON two\n")
    index = tmp_path / "index"
    result = run("ingest", docs, "-c", "broken", "--index-dir", index, "--embedder", poison_embedder)
    assert result.exit_code == 3, result.output
    assert "Nothing published" in result.stdout
    assert "groundkit serve" not in result.stdout
    assert not (index / "broken.sqlite3").exists()
    assert not (index / "broken.lance").exists()


def test_a_refused_ingest_exits_2_and_writes_nothing(corpus, index_dir):
    first = run("ingest", corpus, "-c", "energy", "--index-dir", index_dir, "--embedder", "none")
    assert first.exit_code == 0
    before = (index_dir / "energy.sqlite3").read_bytes()
    refused = run("ingest", corpus, "-c", "energy", "--index-dir", index_dir, "--embedder", "nope")
    assert refused.exit_code == 2
    assert "unknown embedder 'nope'" in refused.stderr
    assert (index_dir / "energy.sqlite3").read_bytes() == before


@pytest.mark.parametrize(
    "args,message",
    [
        (["--chunk-size", "10"], "Error: --chunk-size must be at least 50 (characters)"),
        (["--chunk-size", "200", "--chunk-overlap", "100"],
         "Error: --chunk-overlap must be at least 0 and less than half of --chunk-size (200)"),
        (["--chunk-overlap", "-1"],
         "Error: --chunk-overlap must be at least 0 and less than half of --chunk-size (1000)"),
    ],
)
def test_ingest_option_errors_name_the_option_and_the_rule(corpus, index_dir, args, message):
    result = run("ingest", corpus, "-c", "energy", "--index-dir", index_dir, "--embedder", "none", *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert not (index_dir / "energy.sqlite3").exists()


# -- encodings -----------------------------------------------------------------


def test_cp1252_and_latin1_text_is_decoded_recorded_and_verifies(tmp_path):
    """A Windows-1252 file used to be skipped as "not utf-8 text"; now it is cited and verified."""
    docs = tmp_path / "docs"
    docs.mkdir()
    cp1252_text = "# Caf\xe9 notes\n\nThe \u201cna\xefve\u201d tariff costs \u20ac5 \u2014 per kWh.\n"
    (docs / "tariff.md").write_bytes(cp1252_text.encode("cp1252"))
    latin_text = "Cr\xe8me br\xfbl\xe9e \x81 recipe notes for the canteen.\n"
    (docs / "canteen.txt").write_bytes(latin_text.encode("latin-1"))
    index = tmp_path / "index"
    result = run("ingest", docs, "-c", "menu", "--index-dir", index, "--embedder", "none")
    assert result.exit_code == 0, result.output
    assert "skipped" not in result.stdout.splitlines()[0].replace("0 skipped", "")
    path = index / "menu.sqlite3"
    rows = dict(query(path, "SELECT source, encoding FROM documents"))
    assert rows == {"tariff.md": "cp1252", "canteen.txt": "iso8859-1"}
    texts = {"tariff.md": cp1252_text, "canteen.txt": latin_text}
    for source, start, end, content, chunk_id in query(
        path, "SELECT d.source, start_offset, end_offset, content, chunk_id "
              "FROM chunks JOIN documents d USING (document_id)"
    ):
        assert texts[source][start:end] == content  # offsets index the decoded text
        fetched = run("fetch-chunk", "menu", chunk_id, "--index-dir", index, "--json")
        assert fetched.exit_code == 0, fetched.output
        assert json.loads(fetched.stdout)["verification"]["status"] == "verified"
    hits = json.loads(run("search", path, "na\xefve", "--json").stdout)["hits"]
    assert hits and hits[0]["source"] == "tariff.md"


def test_verification_decodes_with_the_recorded_encoding(tmp_path):
    """Rewritten as UTF-8, the same characters are other bytes: the cp1252 citation no longer holds."""
    docs = tmp_path / "docs"
    docs.mkdir()
    text = "Caf\xe9 opening hours are nine to five.\n"
    (docs / "hours.txt").write_bytes(text.encode("cp1252"))
    index = tmp_path / "index"
    run("ingest", docs, "-c", "hours", "--index-dir", index, "--embedder", "none")
    (chunk_id,) = query(index / "hours.sqlite3", "SELECT chunk_id FROM chunks")[0]
    (docs / "hours.txt").write_bytes(text.encode("utf-8"))
    result = run("fetch-chunk", "hours", chunk_id, "--index-dir", index)
    assert result.exit_code == 3
    assert result.stdout.splitlines()[1].startswith("drifted:")


def test_a_collection_without_the_encoding_column_still_verifies(corpus, index_dir):
    """Collections written before documents.encoding existed keep working and gain the column."""
    run("ingest", corpus, "-c", "energy", "--index-dir", index_dir, "--embedder", "none")
    path = index_dir / "energy.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE documents DROP COLUMN encoding")
    conn.commit()
    conn.close()
    (chunk_id,) = query(path, "SELECT chunk_id FROM chunks LIMIT 1")[0]
    assert run("fetch-chunk", "energy", chunk_id, "--index-dir", index_dir).exit_code == 0
    (corpus / "solar.md").write_text("# Solar\n\nNew text.\n")
    assert run("ingest", corpus, "-c", "energy", "--index-dir", index_dir).exit_code == 0
    assert dict(query(path, "SELECT source, encoding FROM documents"))["solar.md"] == "utf-8"


# -- search, fetch-chunk ---------------------------------------------------------


@pytest.fixture
def many(tmp_path):
    """A BM25-only collection with 14 documents that all match 'turbine'."""
    docs = tmp_path / "many"
    docs.mkdir()
    for i in range(14):
        (docs / f"t{i:02}.md").write_text(f"# Turbine {i}\n\nTurbine number {i} spins {'fast ' * i}.\n")
    index = tmp_path / "index"
    assert run("ingest", docs, "-c", "many", "--index-dir", index, "--embedder", "none").exit_code == 0
    return docs, index


def test_search_returns_ten_hits_by_default(many):
    _docs, index = many
    result = run("search", "many", "turbine", "--index-dir", index, "--json")
    assert result.exit_code == 0
    response = json.loads(result.stdout)
    assert response["top_k"] == 10 and len(response["hits"]) == 10
    assert response["mode"] == "bm25"  # no vectors: bm25 is the default mode
    plain = run("search", "many", "turbine", "--index-dir", index, "--top-k", "3")
    assert plain.stdout.splitlines()[0].startswith("3 hits (bm25, generation 1, ")


def test_printed_hits_have_no_empty_headings_or_trailing_spaces(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "page.html").write_text("<html><body><p>Flood gates open at dawn.</p></body></html>")
    (docs / "plain.txt").write_text("Flood warnings go out by text message.\n")
    index = tmp_path / "index"
    run("ingest", docs, "-c", "flood", "--index-dir", index, "--embedder", "none")
    result = run("search", "flood", "flood", "--index-dir", index)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert all(line == line.rstrip() for line in lines)
    assert all(line.strip() for line in lines)
    for (chunk_id,) in query(index / "flood.sqlite3", "SELECT chunk_id FROM chunks"):
        fetched = run("fetch-chunk", "flood", chunk_id, "--index-dir", index)
        assert fetched.stdout.splitlines()[0] == fetched.stdout.splitlines()[0].rstrip()


def test_search_errors_name_the_option_and_the_rule(many):
    _docs, index = many
    for args, message in [
        (["turbine", "--top-k", "0"], "Error: --top-k must be between 1 and 50"),
        (["turbine", "--top-k", "51"], "Error: --top-k must be between 1 and 50"),
        ([""], "Error: QUERY must not be empty"),
        (["x" * 4001], "Error: QUERY must be at most 4000 characters"),
    ]:
        result = run("search", "many", *args, "--index-dir", index)
        assert result.exit_code == 2
        assert message in result.stderr
        assert "should" not in result.stderr  # pydantic's wording
    bad_id = run("fetch-chunk", "many", "c_nothex", "--index-dir", index)
    assert bad_id.exit_code == 2
    assert "CHUNK_ID must be c_ followed by 24 hex digits" in bad_id.stderr


def test_pdf_hits_print_pages_not_lines(tmp_path):
    docs = tmp_path / "pdfs"
    docs.mkdir()
    (docs / "report.pdf").write_bytes(
        make_pdf([["Turbine blades erode at sea."], ["Inspection drones photograph every blade."]])
    )
    index = tmp_path / "index"
    run("ingest", docs, "-c", "pdfs", "--index-dir", index, "--embedder", "none", "--chunk-size", "50",
        "--chunk-overlap", "0")
    result = run("search", "pdfs", "drones", "--index-dir", index, "--mode", "bm25")
    first_hit = result.stdout.splitlines()[1]
    assert "report.pdf p. 2  [c_" in first_hit
    chunk_id = first_hit.split("[")[1].rstrip("]")
    fetched = run("fetch-chunk", "pdfs", chunk_id, "--index-dir", index)
    assert fetched.exit_code == 0
    assert fetched.stdout.startswith("report.pdf p. 2 [")


def test_fetch_chunk_exit_statuses_in_a_real_process(many):
    """0 verified, 3 drifted, 4 unresolvable, 1 not found: a script can tell them apart."""
    docs, index = many
    (chunk_id,) = query(index / "many.sqlite3",
                        "SELECT chunk_id FROM chunks JOIN documents USING (document_id) "
                        "WHERE source = 't03.md'")[0]
    verified = run_process("fetch-chunk", "many", chunk_id, "--index-dir", index)
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.splitlines()[1].startswith("verified:")
    (docs / "t03.md").write_text("# Turbine 3\n\nRewritten entirely.\n")
    drifted = run_process("fetch-chunk", "many", chunk_id, "--index-dir", index, "--json")
    assert drifted.returncode == 3
    assert json.loads(drifted.stdout)["verification"]["status"] == "drifted"
    (docs / "t03.md").unlink()
    gone = run_process("fetch-chunk", "many", chunk_id, "--index-dir", index)
    assert gone.returncode == 4
    assert gone.stdout.splitlines()[1] == "unresolvable: source file not found"
    missing = run_process("fetch-chunk", "many", "c_" + "0" * 24, "--index-dir", index)
    assert missing.returncode == 1
    assert missing.stderr.strip() == "Error: chunk not found"


def test_ingest_search_status_in_a_real_process(corpus, tmp_path):
    index = tmp_path / "new-index"
    ingest = run_process("ingest", corpus, "-c", "energy", "--index-dir", index, "--embedder", "none")
    assert ingest.returncode == 0, ingest.stderr
    assert ingest.stdout.strip().endswith(f"groundkit serve {index / 'energy.sqlite3'}")
    search = run_process("search", "energy", "batteries", "--index-dir", index)
    assert search.returncode == 0
    assert "solar.md:" in search.stdout
    status = run_process("status", "energy", "--index-dir", index, "--json")
    assert json.loads(status.stdout)["documents"] == 4
    nothing = run_process("ingest", tmp_path / "nope", "-c", "energy", "--index-dir", index)
    assert nothing.returncode == 2
    assert "Traceback" not in nothing.stderr


# -- status, collections --------------------------------------------------------


def test_status_prints_for_people_and_json_for_scripts(corpus, index_dir):
    run("ingest", corpus, "-c", "energy", "--index-dir", index_dir, "--embedder", "none")
    result = run("status", "energy", "--index-dir", index_dir)
    assert result.exit_code == 0
    text = result.stdout
    for needle in ("{", "}", "None", "EmbeddingManifest", "'"):
        assert needle not in text
    assert text.splitlines()[0].split() == ["collection", "energy"]
    assert "documents    4" in text
    assert "embedding    none (BM25 only)" in text
    assert "chunker      1000 characters, 100 overlap" in text
    data = json.loads(run("status", "energy", "--index-dir", index_dir, "--json").stdout)
    assert data["documents"] == 4 and data["embedding"] is None and data["vectors"] is None


def test_collections_lists_names_says_when_there_are_none_and_has_json(corpus, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run("collections", "--index-dir", empty)
    assert result.exit_code == 0
    assert result.stdout.strip() == f"no collections in {empty}"
    assert json.loads(run("collections", "--index-dir", empty, "--json").stdout) == {"collections": []}
    index = tmp_path / "index"
    run("ingest", corpus, "-c", "energy", "--index-dir", index, "--embedder", "none")
    run("ingest", corpus, "-c", "again", "--index-dir", index, "--embedder", "none")
    assert run("collections", "--index-dir", index).stdout.splitlines() == ["again", "energy"]


# -- eval -----------------------------------------------------------------------


def test_eval_runs_from_the_cli(tmp_path):
    from .test_eval import _write_dataset

    data = _write_dataset(tmp_path / "tiny")
    result = run("eval", data, "--index-dir", tmp_path / "index", "--embedder", "none",
                 "--runs-db", tmp_path / "runs.db")
    assert result.exit_code == 0, result.output
    assert "bm25" in result.stdout and "nDCG@10" in result.stdout


# -- file modes -------------------------------------------------------------------


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def _tree_modes(root):
    modes = {}
    for dirpath, dirnames, filenames in os.walk(root):
        modes[dirpath] = _mode(dirpath)
        for f in filenames:
            modes[os.path.join(dirpath, f)] = _mode(os.path.join(dirpath, f))
    return modes


def test_a_new_collection_is_private(corpus, tmp_path):
    """0700 directories and 0600 files, whatever the umask would have given."""
    old = os.umask(0o022)
    try:
        index = tmp_path / "fresh"
        result = run("ingest", corpus, "-c", "energy", "--index-dir", index)
        assert result.exit_code == 0, result.output
    finally:
        os.umask(old)
    assert _mode(index) == 0o700
    assert _mode(index / "energy.sqlite3") == 0o600
    assert _mode(index / ".energy.lock") == 0o600
    lance = _tree_modes(index / "energy.lance")
    assert len(lance) > 3
    for path, mode in lance.items():
        assert mode == (0o700 if os.path.isdir(path) else 0o600), path


def test_group_readable_is_a_setting_and_a_reingest_keeps_it(corpus, tmp_path):
    index = tmp_path / "shared"
    run("ingest", corpus, "-c", "energy", "--index-dir", index, "--group-readable")
    assert _mode(index) == 0o750
    assert _mode(index / "energy.sqlite3") == 0o640
    for path, mode in _tree_modes(index / "energy.lance").items():
        assert mode == (0o750 if os.path.isdir(path) else 0o640), path
    (corpus / "solar.md").write_text("# Solar\n\nChanged.\n")
    run("ingest", corpus, "-c", "energy", "--index-dir", index)
    assert _mode(index / "energy.sqlite3") == 0o640  # no flag: the group keeps its access
    (corpus / "solar.md").write_text("# Solar\n\nChanged again.\n")
    run("ingest", corpus, "-c", "energy", "--index-dir", index, "--private")
    assert _mode(index / "energy.sqlite3") == 0o600
    for path, mode in _tree_modes(index / "energy.lance").items():
        assert mode == (0o700 if os.path.isdir(path) else 0o600), path


def test_an_existing_index_directory_keeps_its_mode(corpus, tmp_path):
    index = tmp_path / "mine"
    index.mkdir(mode=0o755)
    os.chmod(index, 0o755)
    run("ingest", corpus, "-c", "energy", "--index-dir", index, "--embedder", "none")
    assert _mode(index) == 0o755
    assert _mode(index / "energy.sqlite3") == 0o600


# -- lost vectors -------------------------------------------------------------------


def test_lost_vectors_are_embedded_again_before_publishing(corpus, index_dir):
    """Deleting <name>.lance and changing one file used to publish vectors for that file only."""
    assert run("ingest", corpus, "-c", "energy", "--index-dir", index_dir).exit_code == 0
    shutil.rmtree(index_dir / "energy.lance")
    lost = json.loads(run("status", "energy", "--index-dir", index_dir, "--json").stdout)
    assert lost["vectors"] == 0 and lost["dense_available"] is False
    (corpus / "solar.md").write_text("# Solar\n\nPanels on every roof.\n")
    result = run("ingest", corpus, "-c", "energy", "--index-dir", index_dir, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["vectors_restored"] > 0
    path = index_dir / "energy.sqlite3"
    chunk_ids = {r[0] for r in query(path, "SELECT chunk_id FROM chunks")}
    table = open_table(index_dir / "energy.lance", int(manifest(path)["lance_version"]))
    assert set(table.to_arrow()["chunk_id"].to_pylist()) == chunk_ids
    status = json.loads(run("status", "energy", "--index-dir", index_dir, "--json").stdout)
    assert status["vectors"] == status["chunks"] == len(chunk_ids)
    assert status["dense_available"] is True
    with Collection.open("energy", index_dir=index_dir) as col:
        assert col.search(query="wind turbines", mode="dense").hits
    plain = run("status", "energy", "--index-dir", index_dir).stdout
    assert f"vectors      {len(chunk_ids)} of {len(chunk_ids)} chunks" in plain


def test_lost_vectors_that_cannot_be_embedded_refuse_the_publish(corpus, index_dir, poison_embedder):
    assert run("ingest", corpus, "-c", "energy", "--index-dir", index_dir,
               "--embedder", poison_embedder).exit_code == 0
    shutil.rmtree(index_dir / "energy.lance")
    conn = sqlite3.connect(index_dir / "energy.sqlite3")
    conn.execute("UPDATE chunks SET content = content || ' POISON'")  # the service now refuses them
    conn.commit()
    conn.close()
    before = (index_dir / "energy.sqlite3").read_bytes()
    result = run("ingest", corpus, "-c", "energy", "--index-dir", index_dir, "--embedder", poison_embedder)
    assert result.exit_code == 2
    assert "have no vector" in result.stderr and "nothing was published" in result.stderr
    assert (index_dir / "energy.sqlite3").read_bytes() == before


# -- many paths ------------------------------------------------------------------------


def test_twenty_thousand_paths_ingest(tmp_path):
    """Every pair of input paths used to be compared with a stat each (O(n^2)): this finishes."""
    docs = tmp_path / "docs"
    docs.mkdir()
    paths = []
    for i in range(20_000):
        p = docs / f"f{i:05}.txt"
        p.write_text(f"note {i}\n")
        paths.append(str(p))
    from groundkit_datasette.indexing.ingest import Indexer

    report = Indexer("lots", index_dir=tmp_path / "index", embedder="none").ingest(paths + [str(docs)])
    assert report.added == 20_000 and report.failed == 0


def test_vector_coverage_counts_only_the_chunks_a_reader_may_read(tmp_path):
    """index_status.vectors, like its other counts, says nothing about hidden documents."""
    from groundkit_datasette.retrieval.permissions import Reader, ScopedCollection

    docs = tmp_path / "docs"
    (docs / "hr").mkdir(parents=True)
    (docs / "hr" / ".groundkit-acl.json").write_text(json.dumps({"groups": ["hr"]}))
    (docs / "hr" / "salaries.txt").write_text("Salary bands for the engineering ladder.\n")
    (docs / "public.txt").write_text("The canteen opens at noon.\n")
    (docs / "ferries.txt").write_text("Ferries leave the harbour every hour.\n")
    index = tmp_path / "index"
    assert run("ingest", docs, "-c", "office", "--index-dir", index).exit_code == 0
    path = index / "office.sqlite3"
    anonymous, hr = Reader.from_actor(None), Reader.from_actor({"id": "bo", "groups": ["hr"]})
    with Collection.open("office", index_dir=index) as col:
        assert col.status().vectors == col.status().chunks == 3
        assert ScopedCollection(col, anonymous).status().vectors == 2
    # Lose the public ferries document's vectors (a partial table) and publish that state by hand.
    table = open_table(index / "office.lance")
    (ferries,) = query(path, "SELECT document_id FROM documents WHERE source = 'ferries.txt'")[0]
    table.delete(f"document_id = '{ferries}'")
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE groundkit_manifest SET value = ? WHERE key = 'lance_version'",
                     (str(table.version),))
    conn.close()
    with Collection.open("office", index_dir=index) as col:
        full = col.status()
        assert (full.vectors, full.chunks, full.dense_available) == (2, 3, False)
        assert "vectors cover 2 of 3 chunks" in full.dense_unavailable_reason
        seen = ScopedCollection(col, anonymous).status()
        assert (seen.vectors, seen.chunks) == (1, 2)
        assert ScopedCollection(col, hr).status().vectors == 2


_EXIT_CHILD = """
import atexit, gc, sys
# Registered first, so it runs last: what the interpreter will do after every other exit hook.
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0, file=sys.stderr))
from groundkit_datasette import cli
if sys.argv[1] == "console":  # as the groundkit script runs it
    sys.argv = ["groundkit", *sys.argv[2:]]
    cli.main()
else:
    cli.cli(sys.argv[2:], prog_name="groundkit")
"""


def test_only_the_groundkit_process_skips_the_exit_collection(many, tmp_path):
    """``cli`` called from someone else's code leaves the interpreter's gc alone; the
    ``groundkit`` console script (``main``), a process of our own, lets one-answer commands
    exit without first collecting every cycle (about 10% of their cold start, adr/0059), and
    ingest, which writes, exits as usual."""
    docs, index = many
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))

    def child(how, *args):
        out = subprocess.run([sys.executable, "-c", _EXIT_CHILD, how, *map(str, args)], capture_output=True,
                             text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return out

    for how, one_answer in (("library", False), ("console", True)):
        expected = f"frozen at exit: {one_answer}"
        searched = child(how, "search", "many", "turbine", "--index-dir", index, "--json")
        assert expected in searched.stderr
        assert len(json.loads(searched.stdout)["hits"]) == 10
        chunk_id = json.loads(searched.stdout)["hits"][0]["chunk_id"]
        assert expected in child(how, "fetch-chunk", "many", chunk_id, "--index-dir", index).stderr
        assert expected in child(how, "status", "many", "--index-dir", index).stderr
        assert expected in child(how, "collections", "--index-dir", index).stderr
        ingested = child(how, "ingest", docs, "-c", f"again-{how}", "--index-dir", tmp_path / "i2",
                         "--embedder", "none")
        assert "frozen at exit: False" in ingested.stderr
