"""A file format is a plugin (adr/0057): a third-party extractor registered through the
``register_extractors`` hook gets its files ingested, searched and cited like a built-in's,
and it can never replace a built-in (or another plugin's) extractor silently."""

import sys
import types
from pathlib import Path

import pytest

from groundkit_datasette.hookspecs import hookimpl
from groundkit_datasette.indexing import extract
from groundkit_datasette.indexing.formats.base import Extraction, Extractor
from groundkit_datasette.indexing.formats.builtin import BUILTIN_EXTRACTORS
from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.registry import pm
from groundkit_datasette.retrieval.collection import Collection

sys.path.insert(0, str(Path(__file__).parent / "plugins"))
import subrip  # noqa: E402

SRT = """1
00:00:01,000 --> 00:00:03,500
Captain Varga charts the glacier

2
00:00:04,000 --> 00:00:06,000
The crevasse field lies northward
"""


@pytest.fixture
def with_subrip():
    pm.register(subrip, name="subrip_test")
    yield
    pm.unregister(name="subrip_test")


def test_a_plugins_format_is_ingested_searched_and_cited(tmp_path, with_subrip):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "film.srt").write_text(SRT)
    (corpus / "notes.md").write_text("# Notes\n\nNothing about ice here.\n")
    index = tmp_path / "index"
    report = ingest([corpus], collection="films", index_dir=index, embedder="none")
    assert report.added == 2 and not report.failed, report.as_dict()
    with Collection.open("films", index_dir=index) as col:
        (extractor, version, source_class, title), = col.query(
            "SELECT extractor, extractor_version, source_class, title FROM documents "
            "WHERE source = 'film.srt'")
        assert (extractor, version, source_class) == ("subrip", "1", "text")
        assert title == "Captain Varga charts the glacier"
        hits = col.search(query="crevasse glacier", mode="bm25").hits
        assert [h.source for h in hits] == ["film.srt"]
        assert "00:00" not in hits[0].content  # the plugin's text, not the file read as text
        assert col.fetch_chunk(hits[0].chunk_id).verification.status == "verified"
        pm.unregister(name="subrip_test")
        try:  # without the plugin the extractor that made the text is gone: nothing to check by
            assert not extract.extractor_available("subrip", "1")
            assert col.fetch_chunk(hits[0].chunk_id).verification.status != "verified"
        finally:
            pm.register(subrip, name="subrip_test")


def test_a_plugins_extractor_runs_in_an_isolation_worker(with_subrip):
    """Isolated like the built-in PDF and package extractors (adr/0050): its skip crosses back."""
    assert extract.extractor_for(".SRT") is subrip.SUBRIP
    with pytest.raises(extract.Skipped, match="not a subrip file"):
        extract.extract_bytes(b"just some words", ".srt")
    assert extract.extract_bytes(SRT.encode(), ".srt").text.startswith("Captain Varga")


def _plugin(*extractors):
    module = types.ModuleType("conflicting_plugin")

    @hookimpl
    def register_extractors(register):
        for extractor in extractors:
            register(extractor)

    module.register_extractors = register_extractors
    return module


def _plain(data, *, encoding, budget):
    return Extraction(data.decode())


@pytest.mark.parametrize("extractor, message", [
    (Extractor("better-md", "1", (".md",), "markdown", _plain),
     "extractors 'text' and 'better-md' both claim the suffix '.md'"),
    (Extractor("pdfium", "1", ("PDF",), "pdf", _plain),
     "extractors 'pypdf' and 'pdfium' both claim the suffix '.pdf'"),
    (Extractor("make", "1", (".mak",), "code", _plain, file_names=("Makefile",)),
     "extractors 'text' and 'make' both claim the file name 'makefile'"),
    (Extractor("text", "2", (".new",), "text", _plain),
     "two plugins register an extractor named 'text'"),
])
def test_a_plugin_cannot_replace_a_built_in(extractor, message):
    """Not silently: the dispatcher refuses to choose, for every file, until it is removed."""
    pm.register(_plugin(extractor), name="conflicting_test")
    try:
        with pytest.raises(extract.ExtractorConflict) as raised:
            extract.extract_bytes(b"# Title\n\ntext\n", ".md")
        assert str(raised.value) == message
    finally:
        pm.unregister(name="conflicting_test")
    assert extract.extract_bytes(b"# Title\n\ntext\n", ".md").extractor == "text"


def test_two_plugins_claiming_one_new_suffix_conflict(with_subrip):
    other = Extractor("other-srt", "1", (".srt",), "text", _plain)
    pm.register(_plugin(other), name="conflicting_test")
    try:
        with pytest.raises(extract.ExtractorConflict, match="'subrip' and 'other-srt'"):
            extract.extractor_for(".srt")
    finally:
        pm.unregister(name="conflicting_test")


def test_a_plugin_may_claim_a_refused_suffix():
    """A known binary suffix is refused only while no extractor reads it."""
    assert extract.source_class_for(".doc") is None
    doc = Extractor("doc-text", "1", (".doc",), "text", _plain)
    pm.register(_plugin(doc), name="doc_test")
    try:
        assert extract.source_class_for(".doc") == "text"
        assert extract.extract_bytes(b"old word file", ".doc").extractor == "doc-text"
    finally:
        pm.unregister(name="doc_test")
    assert extract.source_class_for(".doc") is None


def test_every_built_in_is_registered_through_the_hook():
    assert set(extract.extractor_for(s) for e in BUILTIN_EXTRACTORS for s in e.suffixes) == set(
        BUILTIN_EXTRACTORS)


def test_an_isolated_extractor_must_be_importable_by_name():
    def local(data, *, encoding, budget):
        return Extraction("x")

    pm.register(_plugin(Extractor("local", "1", (".loc",), "text", local, isolated=True)),
                name="local_test")
    try:
        with pytest.raises(TypeError, match="top of an importable module"):
            extract.extractor_for(".loc")
    finally:
        pm.unregister(name="local_test")


def test_the_cluster_writer_expects_a_plugins_extractor(with_subrip):
    """A cluster worker's answer for a plugin's file is held to the plugin's identity."""
    from groundkit_datasette.indexing.cluster import _expected_extractor

    assert _expected_extractor("films/film.srt") == ("text", "subrip")
    assert _expected_extractor("a/report.docx") == ("markdown", "docx")
    assert _expected_extractor("a/picture.png") == (None, None)


def test_an_ingest_with_conflicting_extractors_refuses_to_start(tmp_path):
    """One clear error before anything is read or written, not one failed file per document."""
    from click.testing import CliRunner

    from groundkit_datasette.cli import cli

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\ntext\n")
    pm.register(_plugin(Extractor("better-md", "1", (".md",), "markdown", _plain)), name="conflicting_test")
    try:
        result = CliRunner().invoke(cli, ["ingest", str(tmp_path / "docs"), "--collection", "c",
                                          "--index-dir", str(tmp_path / "index"), "--embedder", "none"])
    finally:
        pm.unregister(name="conflicting_test")
    assert result.exit_code == 2, result.output
    assert "extractors 'text' and 'better-md' both claim the suffix '.md'" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "index").exists() or not any((tmp_path / "index").iterdir())
