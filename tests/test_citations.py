import hashlib
import os
import shutil
import stat
from pathlib import Path

import pydantic
import pytest

from groundkit_datasette.retrieval import citations
from groundkit_datasette.indexing import schema
from groundkit_datasette.indexing.chunking import chunk_text
from groundkit_datasette.retrieval.citations import Verification, verify_citation
from groundkit_datasette.indexing.extract import extract_file
from groundkit_datasette.indexing.ingest import ingest

from .conftest import HTML, MARKDOWN, TEXT, snapshot, write_corpus


def cite(base, source, containing):
    """The citation of the chunk of ``source`` whose text contains ``containing``."""
    ex = extract_file(base / source)
    for ch in chunk_text(ex.text, source_class=ex.source_class, chunk_size=200, chunk_overlap=0):
        if containing in ch.text:
            return dict(
                source=source,
                source_class=ex.source_class,
                extractor=ex.extractor,
                extractor_version=ex.extractor_version,
                start=ch.start,
                end=ch.end,
                content=ch.text,
                line_start=ch.line_start,
                line_end=ch.line_end,
            )
    raise AssertionError(f"no chunk contains {containing!r}")


def verify(citation, base, **kw):
    args = {k: v for k, v in citation.items() if k not in ("line_start", "line_end")}
    args.update(kw)
    return verify_citation(base_dir=base, **args)


@pytest.fixture
def base(corpus):
    return corpus


def test_verified_returns_the_span_and_its_context(base):
    c = cite(base, "solar.md", "Lithium-ion")
    v = verify(c, base)
    assert v.status == "verified"
    assert v.source_text == c["content"]
    assert v.relocated is None
    assert MARKDOWN[: c["start"]].endswith(v.context_before)
    assert MARKDOWN[c["end"] :].startswith(v.context_after)
    assert v.source_text.startswith("## Storage")
    assert "Photovoltaic" in v.context_before
    assert v.context_after.lstrip().startswith("## Costs")


def test_context_is_bounded_by_context_chars(base):
    c = cite(base, "notes/wind.txt", "Maintenance")
    v = verify(c, base, context_chars=10)
    assert v.status == "verified"
    assert v.context_before == TEXT[c["start"] - 10 : c["start"]]
    assert len(v.context_after) <= 10
    assert verify(c, base, context_chars=0).context_before == ""


def test_verification_is_frozen(base):
    v = verify(cite(base, "solar.md", "Lithium-ion"), base)
    with pytest.raises(pydantic.ValidationError):
        v.status = "drifted"


def test_editing_the_cited_span_drifts(base):
    c = cite(base, "solar.md", "Lithium-ion")
    path = base / "solar.md"
    path.write_text(MARKDOWN.replace("Lithium-ion", "Sodium-ion"), encoding="utf-8")
    v = verify(c, base)
    assert v.status == "drifted"
    assert v.relocated is None
    assert "no longer in the source" in v.reason
    assert v.source_text is None and v.context_before is None and v.context_after is None


def test_inserting_text_above_relocates_the_span(base):
    c = cite(base, "solar.md", "Lithium-ion")
    inserted = "Preface line one.\nPreface line two.\n\n"
    new_text = inserted + MARKDOWN
    (base / "solar.md").write_text(new_text, encoding="utf-8")
    v = verify(c, base)
    assert v.status == "drifted"
    assert "moved" in v.reason
    r = v.relocated
    assert r is not None
    assert new_text[r.start_offset : r.end_offset] == c["content"]
    assert r.start_offset == c["start"] + len(inserted)
    assert (r.line_start, r.line_end) == (c["line_start"] + 3, c["line_end"] + 3)
    assert r.occurrences == 1


def test_relocation_picks_the_occurrence_nearest_the_old_offset(tmp_path):
    base = tmp_path / "corpus"
    base.mkdir()
    para = "The same sentence repeats here."
    original = f"Intro.\n\n{para}\n\nMiddle part.\n\n{para}\n\nEnd.\n"
    (base / "r.txt").write_text(original, encoding="utf-8")
    second = original.rindex(para)
    citation = dict(source="r.txt", source_class="text", extractor="text",
                    extractor_version="1", start=second, end=second + len(para), content=para)
    assert verify(citation, base).status == "verified"
    edited = "Added.\n" + original
    (base / "r.txt").write_text(edited, encoding="utf-8")
    r = verify(citation, base).relocated
    assert r.occurrences == 2
    assert r.start_offset == edited.rindex(para)
    assert r.line_start == r.line_end == edited[: r.start_offset].count("\n") + 1


def test_rewriting_drifts_without_relocation(base):
    c = cite(base, "notes/wind.txt", "Offshore")
    (base / "notes/wind.txt").write_text("Entirely different words now.\n", encoding="utf-8")
    v = verify(c, base)
    assert v.status == "drifted"
    assert v.relocated is None


@pytest.mark.parametrize("start,end", [(-5, 10), (10, 5), (0, 10**9), (10**9, 10**9 + 5)])
def test_out_of_range_offsets_drift(base, start, end):
    c = cite(base, "solar.md", "Lithium-ion")
    v = verify(c, base, start=start, end=end)
    assert v.status == "drifted"
    assert v.relocated is not None  # the text itself is still there
    assert MARKDOWN[v.relocated.start_offset : v.relocated.end_offset] == c["content"]


def test_html_citation_verifies_after_re_extraction(base):
    c = cite(base, "notes/hydro.html", "Pumped storage")
    assert c["extractor"] == "html"
    v = verify(c, base)
    assert v.status == "verified"
    assert "Pumped storage" in v.source_text
    assert "<p>" not in v.source_text and "secret" not in (v.context_before + v.context_after)
    # The offsets index the extracted text, not the markup.
    assert HTML[c["start"] : c["end"]] != c["content"]


def test_symlink_inside_base_is_followed(base):
    os.symlink(base / "solar.md", base / "alias.md")
    c = cite(base, "solar.md", "Lithium-ion")
    assert verify(c, base, source="alias.md").status == "verified"


def unresolvable_cases(tmp_path):
    """(name, base_dir, citation overrides) for every refusal, with real files arranged."""
    base = write_corpus(tmp_path / "corpus")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text(MARKDOWN, encoding="utf-8")
    c = cite(base, "solar.md", "Lithium-ion")

    (base / "gone.md").write_text(MARKDOWN, encoding="utf-8")
    (base / "gone.md").unlink()
    shutil.move(base / "notes" / "wind.txt", outside / "wind.txt")
    os.symlink(outside / "secret.md", base / "link.md")
    os.symlink(outside / "missing.md", base / "dangling.md")
    os.symlink(outside, base / "linkdir")
    (base / "folder.md").mkdir()
    return base, c, [
        ("deleted", base, {"source": "gone.md"}, "source file not found"),
        ("moved away", base, {"source": "notes/wind.txt"}, "source file not found"),
        ("symlink outside", base, {"source": "link.md"}, "source is outside the base directory"),
        ("dangling symlink outside", base, {"source": "dangling.md"},
         "source is outside the base directory"),
        ("symlinked dir outside", base, {"source": "linkdir/secret.md"},
         "source is outside the base directory"),
        ("dot-dot", base, {"source": "../outside/secret.md"},
         "source is outside the base directory"),
        ("inner dot-dot", base, {"source": "notes/../../outside/secret.md"},
         "source is outside the base directory"),
        ("absolute", base, {"source": str(outside / "secret.md")},
         "source is outside the base directory"),
        ("backslash", base, {"source": "notes\\wind.txt"}, "source is outside the base directory"),
        ("nul", base, {"source": "solar.md\x00.txt"}, "source is outside the base directory"),
        ("empty", base, {"source": ""}, "source is outside the base directory"),
        ("directory", base, {"source": "folder.md"}, "source file unreadable"),
        ("no base", None, {}, "no base directory configured"),
        ("missing base", tmp_path / "nowhere", {}, "base directory not found"),
        ("pdf version", base, {"extractor": "pypdf", "extractor_version": "0.0.1"},
         "extractor pypdf version 0.0.1 is not available"),
        ("text version", base, {"extractor_version": "0"},
         "extractor text version 0 is not available"),
        ("other extractor", base, {"source": "notes/hydro.html", "extractor": "text"},
         "source is no longer extracted the way it was when cited"),
        ("binary now", base, {"source": "image.raw"}, "source can no longer be extracted"),
    ]


def test_unresolvable_cases_and_their_reasons_never_name_a_path(tmp_path):
    base, c, cases = unresolvable_cases(tmp_path)
    for name, base_dir, overrides, reason in cases:
        v = verify(c, base_dir, **overrides)
        assert (name, v.status, v.reason) == (name, "unresolvable", reason)
        assert str(tmp_path) not in v.reason and str(base) not in v.reason
        assert v.source_text is None and v.relocated is None and v.context_after is None


def test_no_reason_names_a_path(tmp_path):
    base = write_corpus(tmp_path / "corpus")
    c = cite(base, "solar.md", "Lithium-ion")
    reasons = [verify(c, base).reason]
    (base / "solar.md").write_text("Prefix.\n" + MARKDOWN, encoding="utf-8")
    reasons.append(verify(c, base).reason)
    (base / "solar.md").write_text("Nothing left.\n", encoding="utf-8")
    reasons.append(verify(c, base).reason)
    reasons.append(verify(c, base, start=10**6, end=10**6 + 3).reason)
    for r in reasons:
        assert str(tmp_path) not in r and "solar.md" not in r


def test_the_size_limit_is_the_ingest_limit():
    from groundkit_datasette.indexing.extract import MAX_FILE_BYTES

    assert citations.MAX_FILE_BYTES == MAX_FILE_BYTES


def test_file_over_the_size_limit_is_refused(base, monkeypatch):
    c = cite(base, "solar.md", "Lithium-ion")
    monkeypatch.setattr(citations, "MAX_FILE_BYTES", 100)
    v = verify(c, base)
    assert (v.status, v.reason) == ("unresolvable", "source file too large")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs procfs")
def test_a_file_opened_outside_the_base_is_refused(tmp_path, base):
    # Stands in for a directory swapped for a link between resolving and opening.
    secret = tmp_path / "secret.txt"
    secret.write_text("not for callers\n")
    fd = os.open(secret, os.O_RDONLY)
    try:
        with pytest.raises(citations.Unresolvable) as exc:
            citations._check_opened_inside(fd, base.resolve())
    finally:
        os.close(fd)
    assert exc.value.reason == "source is outside the base directory"


def test_a_fifo_is_refused_without_blocking(base):
    os.mkfifo(base / "pipe.md")
    v = verify(cite(base, "solar.md", "Lithium-ion"), base, source="pipe.md")
    assert (v.status, v.reason) == ("unresolvable", "source file unreadable")


def tree(base):
    """Every entry under ``base`` (links not followed): type, mtime, and content hash or target."""
    out = {}
    for dirpath, dirs, files in os.walk(base):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                what = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                what = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            else:
                what = None
            out[os.path.relpath(path, base)] = (st.st_mode, st.st_mtime_ns, what)
    return out


def test_verification_writes_nothing(tmp_path):
    base, c, cases = unresolvable_cases(tmp_path)
    tree_before = tree(base)
    outside_before = snapshot(tmp_path / "outside")
    for _name, base_dir, overrides, _reason in cases:
        verify(c, base_dir, **overrides)
    assert verify(c, base).status == "verified"
    assert verify(cite(base, "notes/hydro.html", "Dams"), base).status == "verified"
    assert tree(base) == tree_before
    (base / "solar.md").write_text("Prefix.\n" + MARKDOWN, encoding="utf-8")
    tree_before = tree(base)
    assert verify(c, base).status == "drifted"
    assert tree(base) == tree_before
    assert snapshot(tmp_path / "outside") == outside_before
    assert sorted(os.listdir(tmp_path)) == ["corpus", "outside"]


def test_every_ingested_chunk_verifies(corpus, index_dir):
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    conn = schema.connect_readonly(index_dir / "energy.sqlite3")
    try:
        rows = conn.execute(
            """SELECT d.source, d.source_class, d.extractor, d.extractor_version,
                      c.start_offset, c.end_offset, c.content
               FROM chunks c JOIN documents d USING (document_id)"""
        ).fetchall()
    finally:
        conn.close()
    assert rows
    for source, cls, ex, ver, start, end, content in rows:
        v = verify_citation(source=source, source_class=cls, extractor=ex,
                            extractor_version=ver, start=start, end=end,
                            content=content, base_dir=corpus)
        assert v.status == "verified", (source, v.reason)
        assert isinstance(v, Verification)
