"""Small files that expand (issue 33.4): extraction budgets and isolated extraction.

Every hostile file here is built by the test: a 32 KB spreadsheet whose 275,000 rows each hold
one cell in the last column (XFD), a docx whose document.xml inflates to 200 MB, a PDF of
10,001 pages. They are ingested and re-extracted for real, in the fork server's children
(indexing/isolation.py); nothing is mocked. Where a limit must be reached deterministically
(the time and memory limits of a real extraction), the limit is lowered for the test.
"""

import io
import json
import os
import random
import resource
import signal
import subprocess
import sys
import threading
import time
import warnings
import zipfile
from pathlib import Path

import pytest

from groundkit_datasette.indexing import extract, isolation
from groundkit_datasette.indexing.formats.packages import Outline
from groundkit_datasette.indexing.formats.spreadsheet import cell_text, read_xlsx
from groundkit_datasette.indexing.extract import (Exceeded, ExtractionBusy, Skipped, extract_bytes,
                                                    extract_file)
from groundkit_datasette.indexing.ingest import Indexer, ingest
from groundkit_datasette.retrieval.collection import Collection
from .pdf_support import write_pdf

TEXT_BUDGET = "exceeds the extraction budget: 20,000,000 characters of text"
PAGE_BUDGET = "exceeds the extraction budget: 10,000 pages"
W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
X_NS = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"


# -- hostile files, built here ------------------------------------------------------------------


def _repack(template: bytes, replace: dict, out) -> None:
    """``template`` (a package a library wrote) with members replaced by streamed pieces."""
    src = zipfile.ZipFile(io.BytesIO(template))
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for info in src.infolist():
            if info.filename in replace:
                with z.open(info.filename, "w") as member:
                    for piece in replace[info.filename]():
                        member.write(piece)
            else:
                z.writestr(info.filename, src.read(info))


def wide_xlsx(path: Path, rows: int = 275_000) -> Path:
    """Rows of one cell each, in column XFD: 32 KB, which openpyxl's read-only mode padded to
    4.5 billion values (issue 33: 275,001 chunks, 1.9 GB)."""
    import openpyxl

    book = openpyxl.Workbook()
    book.active["A1"] = "template"
    template = io.BytesIO()
    book.save(template)

    def sheet():
        yield f'<?xml version="1.0" encoding="UTF-8"?><worksheet xmlns="{X_NS}"><sheetData>'.encode()
        for start in range(0, rows, 5000):
            yield b'<row><c r="XFD1"><v>1</v></c></row>' * min(5000, rows - start)
        yield b"</sheetData></worksheet>"

    _repack(template.getvalue(), {"xl/worksheets/sheet1.xml": sheet}, path)
    return path


def big_docx(path: Path, paragraphs: int = 200_000) -> Path:
    """A docx whose document.xml inflates to about 200 MB (under the 256 MiB unpacked bound)."""
    import docx

    document = docx.Document()
    document.add_paragraph("template")
    template = io.BytesIO()
    document.save(template)
    paragraph = ("<w:p><w:r><w:t>" + "lorem ipsum dolor sit amet " * 37 + "</w:t></w:r></w:p>").encode()

    def body():
        yield f'<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="{W_NS}"><w:body>'.encode()
        for _ in range(paragraphs // 1000):
            yield paragraph * 1000
        yield b"</w:body></w:document>"

    _repack(template.getvalue(), {"word/document.xml": body}, path)
    return path


def many_pages_pdf(pages: int, text: str = "page") -> bytes:
    """A valid PDF of ``pages`` pages sharing one content stream (one line of text each)."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objs = {1: b"<< /Type /Catalog /Pages 2 0 R >>",
            3: b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
            4: b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream"}
    kids = []
    for i in range(pages):
        kids.append(b"%d 0 R" % (5 + i))
        objs[5 + i] = (b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
                       b"/Resources << /Font << /F1 3 0 R >> >> /Contents 4 0 R >>")
    objs[2] = b"<< /Type /Pages /Kids [" + b" ".join(kids) + b"] /Count %d >>" % pages
    return write_pdf([objs[n] for n in range(1, max(objs) + 1)], 1)


def ordinary_files(root: Path) -> None:
    """What must still be published beside the hostile files."""
    import docx
    import openpyxl

    (root / "notes.md").write_text("# Harbour notes\n\nKestrels nest above the tide tables.\n")
    document = docx.Document()
    document.add_heading("Mirrors", level=1)
    document.add_paragraph("Heliostat fields track the sun.")
    document.save(root / "plant.docx")
    book = openpyxl.Workbook()
    book.active.append(["Region", "Revenue"])
    book.active.append(["Archipelago", 1234.5])
    book.save(root / "sales.xlsx")
    (root / "short.pdf").write_bytes(many_pages_pdf(3, "albatross sightings"))


@pytest.fixture(scope="module")
def hostile_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    return {"wide.xlsx": wide_xlsx(root / "wide.xlsx"), "big.docx": big_docx(root / "big.docx"),
            "long.pdf": _write(root / "long.pdf", many_pages_pdf(10_001))}


def _ordinary_docx(path: Path, paragraphs: int) -> Path:
    import docx

    document = docx.Document()
    for i in range(paragraphs):
        document.add_paragraph(f"Paragraph {i} on heliostat mirrors and their tracking motors.")
    document.save(path)
    return path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# -- ingest ----------------------------------------------------------------------------------------


def test_hostile_files_are_skipped_with_the_budget_named_and_the_rest_published(tmp_path,
                                                                                 hostile_files):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    ordinary_files(corpus)
    for name, path in hostile_files.items():
        (corpus / name).write_bytes(path.read_bytes())
    assert (corpus / "wide.xlsx").stat().st_size < 40_000
    started = time.monotonic()
    report = ingest([corpus], collection="docs", index_dir=tmp_path / "index", embedder="none")
    print(f"ingest with three hostile files: {time.monotonic() - started:.1f} s")
    assert dict(report.skipped_files) == {"wide.xlsx": TEXT_BUDGET, "big.docx": TEXT_BUDGET,
                                          "long.pdf": PAGE_BUDGET}
    assert report.added == 4 and report.failed == 0 and report.published
    with Collection.open("docs", index_dir=tmp_path / "index") as col:
        for query, source in [("kestrels", "notes.md"), ("heliostat", "plant.docx"),
                              ("archipelago", "sales.xlsx"), ("albatross", "short.pdf")]:
            hits = col.search(query=query, mode="bm25").hits
            assert {h.source for h in hits} == {source}
            assert col.fetch_chunk(hits[0].chunk_id).verification.status == "verified"
        assert col.query("SELECT count(*) FROM chunks")[0][0] < 10


def test_a_row_costs_its_cells_not_its_padding(tmp_path, monkeypatch):
    """300 rows of one cell in XFD: 300 cells, where openpyxl's padding made 4.9 million; the
    text keeps the padding's separators, as before, and counts against the text budget."""
    monkeypatch.setattr(extract, "MAX_CELLS", 1000)
    data = wide_xlsx(tmp_path / "w.xlsx", rows=300).read_bytes()
    text = extract._extract(data, ".xlsx", "", extract.MAX_FILE_BYTES).text  # here: patched bound
    assert text.count("\n") == 301 and text.endswith(" | " * 16383 + "1")
    monkeypatch.setattr(extract, "MAX_CELLS", 299)
    with pytest.raises(Exceeded, match="exceeds the extraction budget: 299 cells"):
        extract._extract(data, ".xlsx", "", extract.MAX_FILE_BYTES)
    monkeypatch.setattr(extract, "MAX_ROWS", 100)
    with pytest.raises(Exceeded, match="exceeds the extraction budget: 100 rows"):
        extract._extract(data, ".xlsx", "", extract.MAX_FILE_BYTES)


def _flooded(tmp_path, extractor: str, piece: bytes, count: int) -> Path:
    """A real package of ``extractor`` whose main part is ``piece`` repeated ``count`` times."""
    sys.path.insert(0, str(Path(__file__).parent))
    import test_formats

    path = getattr(test_formats, f"make_{extractor}")(tmp_path / f"f.{extractor}")
    names = zipfile.ZipFile(path).namelist()
    member = {"docx": "word/document.xml", "pptx": "ppt/slides/slide1.xml",
              "odt": "content.xml"}.get(extractor) or next(n for n in names if n.endswith("chap_1.xhtml"))
    ns = 'xmlns="http://www.w3.org/1999/xhtml"' if extractor == "epub" else 'xmlns:x="urn:x"'

    def flood():
        yield f"<root {ns}>".encode()
        for _ in range(count // 10_000):
            yield piece * 10_000
        yield b"</root>"

    out = tmp_path / f"flood.{extractor}"
    _repack(path.read_bytes(), {member: flood}, out)
    return out


@pytest.mark.parametrize("extractor", ["docx", "pptx", "odt", "epub"])
def test_member_xml_stops_at_the_budget_while_streaming(tmp_path, monkeypatch, extractor):
    """A part that is all markup stops at the element budget, one that is all text at the text
    budget, streamed, before any library parses it (bounds lowered: here, in process)."""
    monkeypatch.setattr(extract, "MAX_XML_ELEMENTS", 500_000)
    markup = _flooded(tmp_path, extractor, b"<br/>", 1_000_000).read_bytes()
    with pytest.raises(Exceeded, match="exceeds the extraction budget: 500,000 XML elements"):
        extract._extract(markup, f".{extractor}", "", extract.MAX_FILE_BYTES)
    monkeypatch.setattr(extract, "MAX_TEXT_CHARS", 1_000_000)
    text = _flooded(tmp_path, extractor, b"lorem ipsum ", 200_000).read_bytes()
    with pytest.raises(Exceeded, match="exceeds the extraction budget: 1,000,000 characters of text"):
        extract._extract(text, f".{extractor}", "", extract.MAX_FILE_BYTES)


def test_the_default_element_budget_in_the_child(tmp_path):
    """11 million empty elements (55 MB inflated) in a docx: refused at 10 million, isolated."""
    flood = _flooded(tmp_path, "docx", b"<br/>", 11_000_000)
    with pytest.raises(Exceeded, match="exceeds the extraction budget: 10,000,000 XML elements"):
        extract_file(flood)


def test_zip_members_and_pdf_pages_are_bounded(tmp_path):
    with zipfile.ZipFile(tmp_path / "many.docx", "w") as z:
        for i in range(10_001):
            z.writestr(f"m{i}", b"")
    with pytest.raises(Exceeded, match="exceeds the extraction budget: 10,000 members"):
        extract_file(tmp_path / "many.docx")
    assert extract_bytes(many_pages_pdf(10_000), ".pdf").text.count("\f") == 9_999
    with pytest.raises(Exceeded, match=PAGE_BUDGET):
        extract_bytes(many_pages_pdf(10_001), ".pdf")


def test_a_run_of_many_files_isolates_and_budgets_the_same(tmp_path, hostile_files):
    """A run of over 64 files (once given to forked children, adr/0046; in process since
    adr/0055) skips the same files for the same reasons."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    ordinary_files(corpus)
    for i in range(70):
        (corpus / f"note{i:02d}.md").write_text(f"# Note {i}\n\nThe {i}th remark on tides.\n")
    for name, path in hostile_files.items():
        (corpus / name).write_bytes(path.read_bytes())
    script = ("import json, sys\n"
              "from groundkit_datasette.indexing.ingest import Indexer\n"
              "r = Indexer('docs', index_dir=sys.argv[2], embedder='none').ingest([sys.argv[1]])\n"
              "print(json.dumps(r.as_dict()))\n")
    result = subprocess.run([sys.executable, "-c", script, str(corpus), str(tmp_path / "index")],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["map_stage"] == "local"
    skipped = {s["source"]: s["reason"] for s in report["skipped_files"]}
    assert skipped == {"wide.xlsx": TEXT_BUDGET, "big.docx": TEXT_BUDGET, "long.pdf": PAGE_BUDGET}
    assert report["added"] == 74 and report["failed"] == 0
    assert "Traceback" not in result.stderr


def test_time_and_memory_limits_of_extraction_are_named(tmp_path, monkeypatch):
    """The limits of a real extraction, lowered so that an ordinary file reaches them: at
    ingest the file is skipped with the limit named, at serve time it is unresolvable."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    ordinary_files(corpus)
    big = tmp_path / "big"  # ordinary files whose parse needs more than 1 MiB of new memory
    big.mkdir()
    (big / "notes.md").write_text("# Notes\n\nNothing to parse in a child.\n")
    (big / "report.pdf").write_bytes(many_pages_pdf(3000, "turbine blade inspection"))
    _ordinary_docx(big / "report.docx", paragraphs=20_000)
    monkeypatch.setattr(extract, "EXTRACT_MEMORY_BYTES", 1024 * 1024)  # 1 MiB beyond its start
    isolation.end_workers()  # a fresh worker: no memory left free by earlier calls to draw on
    report = ingest([big], collection="docs", index_dir=tmp_path / "i1", embedder="none")
    memory = "extraction exceeded its memory limit"
    skipped = dict(report.skipped_files)
    assert skipped["report.docx"] == memory
    # pypdf, recovering from what it takes for a broken file, may catch the MemoryError itself.
    assert skipped["report.pdf"] in (memory, "unreadable pdf")
    assert report.added == 1 and report.published  # notes.md: our own decoder, in process
    monkeypatch.undo()
    monkeypatch.setattr(extract, "EXTRACT_SECONDS", 0.001)  # no child answers in a millisecond
    report = ingest([corpus], collection="docs", index_dir=tmp_path / "i2", embedder="none")
    late = "extraction timed out after 0.001 s"
    assert dict(report.skipped_files) == {"plant.docx": late, "sales.xlsx": late, "short.pdf": late}
    monkeypatch.undo()
    ingest([corpus], collection="docs", index_dir=tmp_path / "i3", embedder="none")
    monkeypatch.setattr(extract, "SERVE_EXTRACT_SECONDS", 0.001)
    with Collection.open("docs", index_dir=tmp_path / "i3") as col:
        hit = col.search(query="heliostat", mode="bm25").hits[0]
        verification = col.fetch_chunk(hit.chunk_id).verification
        assert verification.status == "unresolvable"
        assert verification.reason == ("source can no longer be extracted: "
                                       "extraction timed out after 0.001 s")
    assert all(_alive(pid) for pid in isolation.worker_pids())  # the killed ones are reaped


# -- serve time ------------------------------------------------------------------------------------


def _swapped_collection(tmp_path, hostile: Path):
    """A collection whose sales.xlsx has since been replaced by ``hostile``."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    ordinary_files(corpus)
    ingest([corpus], collection="docs", index_dir=tmp_path / "index", embedder="none")
    (corpus / "sales.xlsx").write_bytes(hostile.read_bytes())
    return Collection.open("docs", index_dir=tmp_path / "index")


def test_fetch_chunk_on_a_swapped_hostile_file_is_unresolvable(tmp_path, hostile_files):
    with _swapped_collection(tmp_path, hostile_files["wide.xlsx"]) as col:
        hit = col.search(query="archipelago", mode="bm25").hits[0]
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.monotonic()
        verification = col.fetch_chunk(hit.chunk_id).verification
        print(f"fetch_chunk on the 32 KB spreadsheet: {time.monotonic() - started:.2f} s")
        assert verification.status == "unresolvable"
        assert verification.reason == f"source can no longer be extracted: {TEXT_BUDGET}"
        # The expansion happened in a child: this process did not grow for it.
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 100 * 1024


def test_concurrent_re_extractions_are_bounded(tmp_path, hostile_files):
    """Six fetch_chunk calls at once on the 200 MB docx: never more than SERVE_EXTRACTIONS
    extraction workers at a time; every call answers unresolvable with the budget named."""
    big = hostile_files["big.docx"]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    ordinary_files(corpus)
    ingest([corpus], collection="docs", index_dir=tmp_path / "index", embedder="none")
    (corpus / "plant.docx").write_bytes(big.read_bytes())
    with Collection.open("docs", index_dir=tmp_path / "index") as col:
        chunk_id = col.search(query="heliostat", mode="bm25").hits[0].chunk_id
        most, done = 0, threading.Event()

        def sample():
            nonlocal most
            while not done.wait(0.005):
                most = max(most, len(_workers()))

        sampler = threading.Thread(target=sample)
        sampler.start()
        results = []
        threads = [threading.Thread(target=lambda: results.append(col.fetch_chunk(chunk_id).verification))
                   for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        sampler.join()
    assert [(v.status, v.reason) for v in results] == [
        ("unresolvable", f"source can no longer be extracted: {TEXT_BUDGET}")] * 6
    assert 1 <= most <= extract.SERVE_EXTRACTIONS


def test_slots_bound_running_and_waiting_callers():
    slots = isolation.Slots(running=2, waiting=1)
    slots.acquire(0)
    slots.acquire(0)
    with pytest.raises(isolation.Busy):
        slots.acquire(0)  # none free, and no wait allowed
    got = threading.Event()

    def waiter():
        slots.acquire(60)
        got.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    while slots._waiting == 0:
        time.sleep(0.001)
    with pytest.raises(isolation.Busy):
        slots.acquire(60)  # the one waiting place is taken: busy at once
    slots.release()
    thread.join()
    assert got.is_set()


def test_busy_re_extraction_is_said_so(monkeypatch, hostile_files):
    monkeypatch.setattr(extract, "_SERVE_SLOTS", isolation.Slots(running=1, waiting=0))
    extract._SERVE_SLOTS.acquire(0)  # another request's extraction holds the only slot
    try:
        with pytest.raises(ExtractionBusy, match="too many files are being re-extracted at once"):
            extract_bytes(hostile_files["big.docx"].read_bytes(), ".docx", serving=True)
    finally:
        extract._SERVE_SLOTS.release()


# -- the isolation itself --------------------------------------------------------------------------


def allocate(n: int) -> int:
    block = bytearray(n)
    return len(block)


def sleep_after_writing_pid(path: str) -> None:
    Path(path).write_text(str(os.getpid()))
    time.sleep(3600)


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def echo(*args):
    return [os.getpid(), *args]


def not_plain_data():
    return {1, 2}


def extract_inside(data: bytes) -> list:
    """In a child: extraction runs in place (isolated already), no fork server is started."""
    text = extract_bytes(data, ".docx").text
    return [text, isolation.in_child(), isolation.server_pid()]


def test_the_memory_limit_holds_and_the_parent_is_fine():
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(isolation.ChildOutOfMemory):
        isolation.run_isolated(allocate, 2 * 1024 ** 3, timeout=60, memory_bytes=256 * 1024 ** 2)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 100 * 1024
    assert isolation.run_isolated(allocate, 64 * 1024 ** 2, timeout=60,
                                  memory_bytes=256 * 1024 ** 2) == 64 * 1024 ** 2
    with pytest.raises(isolation.ChildOutOfMemory):  # the kernel's kill, as the OOM killer's
        isolation.run_isolated(kill_self, timeout=60, memory_bytes=256 * 1024 ** 2)


def test_a_timeout_kills_the_child(tmp_path):
    marker = tmp_path / "pid"
    with pytest.raises(isolation.ChildTimeout):
        isolation.run_isolated(sleep_after_writing_pid, str(marker), timeout=1,
                               memory_bytes=256 * 1024 ** 2)
    pid = int(marker.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped before run_isolated raised
    assert _children(isolation.server_pid()) == []


def test_answers_are_plain_data_and_children_do_not_nest(tmp_path):
    pid, data, text, nothing = isolation.run_isolated(echo, b"\x00bytes", "text", None, timeout=60,
                                                      memory_bytes=256 * 1024 ** 2)
    assert pid != os.getpid() and (data, text, nothing) == (b"\x00bytes", "text", None)
    with pytest.raises(isolation.ChildFailed):
        isolation.run_isolated(not_plain_data, timeout=60, memory_bytes=256 * 1024 ** 2)
    with pytest.raises(TypeError):
        isolation.run_isolated(lambda: 1, timeout=60, memory_bytes=1 << 28)
    sys.path.insert(0, str(Path(__file__).parent))
    import test_formats

    data = test_formats.make_docx(tmp_path / "r.docx").read_bytes()
    text, in_child, server = isolation.run_isolated(extract_inside, data, timeout=60,
                                                    memory_bytes=512 * 1024 ** 2)
    assert (in_child, server) == (True, None)
    assert text == extract_bytes(data, ".docx").text == extract._extract(
        data, ".docx", "", extract.MAX_FILE_BYTES).text


def test_the_fork_server_and_the_workers_end_with_their_owner():
    script = ("import sys\n"
              "sys.path.insert(0, sys.argv[1])\n"
              "from groundkit_datasette.indexing import extract, isolation\n"
              "import tests.test_extract_budget as t\n"
              "isolation.run_isolated(t.echo, timeout=60, memory_bytes=1 << 28)\n"
              "try:\n    extract.extract_bytes(b'x', '.pdf')\nexcept extract.Skipped:\n    pass\n"
              "print(isolation.server_pid(), *isolation.worker_pids())\n")
    result = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent.parent)],
                            capture_output=True, text=True, timeout=120)
    left = [int(pid) for pid in result.stdout.split()]
    assert len(left) == 2, result.stderr
    for _ in range(2000):  # the owner is gone: the server's pipe, the worker's socket closed
        if not any(Path(f"/proc/{pid}").exists() for pid in left):
            break
        time.sleep(0.01)
    assert not any(Path(f"/proc/{pid}").exists() for pid in left)


def test_workers_are_reused_limited_per_call_and_replaced_after_a_failure(tmp_path):
    limit = 256 * 1024 ** 2
    first = isolation.run_in_worker(echo, timeout=60, memory_bytes=limit)[0]
    assert first != os.getpid()
    for _ in range(5):  # the same worker, each call allowed its own 256 MiB again
        assert isolation.run_in_worker(allocate, 200 * 1024 ** 2, timeout=60,
                                       memory_bytes=limit) == 200 * 1024 ** 2
    assert isolation.run_in_worker(echo, timeout=60, memory_bytes=limit)[0] == first
    with pytest.raises(isolation.ChildOutOfMemory):
        isolation.run_in_worker(allocate, 2 * 1024 ** 3, timeout=60, memory_bytes=limit)
    assert not _alive(first)  # out of memory: ended, never used again
    second = isolation.run_in_worker(echo, timeout=60, memory_bytes=limit)[0]
    assert second != first
    with pytest.raises(Skipped, match="passed through"):  # an answer: the worker stays
        isolation.run_in_worker(skip, timeout=60, memory_bytes=limit, passthrough=(Skipped,))
    assert isolation.run_in_worker(echo, timeout=60, memory_bytes=limit)[0] == second
    marker = tmp_path / "pid"
    with pytest.raises(isolation.ChildTimeout):
        isolation.run_in_worker(sleep_after_writing_pid, str(marker), timeout=1, memory_bytes=limit)
    assert int(marker.read_text()) == second and not _alive(second)  # killed and reaped
    assert isolation.run_in_worker(echo, timeout=60, memory_bytes=limit)[0] not in (first, second)


def skip() -> None:
    raise Skipped("passed through")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _workers() -> list[int]:
    """This process's live extraction workers, idle or busy."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) != os.getpid() or fields[0] == "Z":
                continue
            if b"isolation_workers import _work" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _children(server: int | None) -> list[int]:
    if server is None:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == server and fields[0] != "Z":
            found.append(int(entry.name))
    return found


# -- the spreadsheet reader gives the text openpyxl's read-only mode gave -------------------------


def openpyxl_text(data: bytes):
    """The extractor as it was (openpyxl 3.1, read-only, dimensions reset): the reference."""
    import openpyxl

    book = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    try:
        out = Outline()
        for sheet in book.worksheets:
            sheet.reset_dimensions()
            rows = [[cell_text(v) for v in row] for row in sheet.iter_rows(values_only=True)]
            if not any(any(c.strip() for c in row) for row in rows):
                continue
            out.heading(1, f'Sheet "{sheet.title}"')
            out.rows(rows)
        title = book.properties.title if book.properties is not None else None
        return out.text(), title or None
    finally:
        book.close()


def streamed_text(data: bytes):
    """The streamed reader's text and title (an empty workbook included: no "empty" skip)."""
    outline, title = read_xlsx(data, zipfile.ZipFile(io.BytesIO(data)), extract._budget())
    return outline.text(), title


def random_workbook(seed: int) -> bytes:
    import datetime

    import openpyxl
    from openpyxl.cell.rich_text import CellRichText, TextBlock
    from openpyxl.cell.text import InlineFont
    from openpyxl.chart import BarChart, Reference

    r = random.Random(seed)
    book = openpyxl.Workbook()
    if r.random() < 0.3:
        book.epoch = openpyxl.utils.datetime.CALENDAR_MAC_1904
    if r.random() < 0.5:
        book.properties.title = r.choice(["T", "  spaced title ", "Ünïcode"])
    for number in range(r.randint(1, 3)):
        sheet = book.active if number == 0 else book.create_sheet(f"S{number}")
        if number and r.random() < 0.3:
            sheet.sheet_state = "hidden"
        for _ in range(r.randint(0, 30)):
            cell = sheet.cell(row=r.randint(1, 60), column=r.randint(1, r.choice([5, 30, 16384])))
            cell.value = r.choice([
                r.randint(-10 ** 12, 10 ** 12), r.uniform(-1e6, 1e6), 1e20, True, False, "#N/A",
                datetime.date(2024, r.randint(1, 12), r.randint(1, 28)),
                datetime.datetime(2020, 1, 2, r.randint(0, 23), r.randint(0, 59), r.randint(0, 59)),
                datetime.time(r.randint(0, 23), r.randint(0, 59)),
                datetime.timedelta(hours=r.randint(0, 100), minutes=r.randint(0, 59)),
                "plain", "  lead", "multi\nline\ttab", "# hash", "x005F_y", "", " ", "=SUM(A1:A2)",
                CellRichText([TextBlock(InlineFont(b=True), "bold"), " and plain"]),
            ])
            if isinstance(cell.value, float) and r.random() < 0.5:
                cell.number_format = r.choice(["0.00%", "yyyy-mm-dd", "[h]:mm:ss", "#,##0", "mmm d",
                                               "General", "0.0E+00"])
        if r.random() < 0.3:
            sheet.append([None, None, "appended"])
    if r.random() < 0.2:
        chart = BarChart()
        chart.add_data(Reference(book.active, min_col=1, min_row=1, max_row=3))
        book.create_chartsheet("Chart").add_chart(chart)
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def test_streamed_spreadsheets_read_as_openpyxl_read_them():
    warnings.simplefilter("ignore")  # openpyxl warns of dates it cannot convert (the same ones)
    for seed in range(120):
        data = random_workbook(seed)
        assert streamed_text(data) == openpyxl_text(data), seed


STRINGS = f"""<sst xmlns="{X_NS}">
<si><t>plain</t></si>
<si><r><rPr><b/></rPr><t>bold</t></r><r><t xml:space="preserve"> run</t></r></si>
<si><t>base</t><rPh sb="0" eb="1"><t>PHON</t></rPh><phoneticPr fontId="1"/></si>
<si><t>x005F_x000D_ab</t></si>
<si><t>a<x/>b</t><r><t>c</t></r><t>last-t-wins</t></si>
</sst>"""
QUIRKS = f"""<worksheet xmlns="{X_NS}"><dimension ref="B2:D10"/><sheetData>
<row r="3"><c r="B3" t="s"><v>1</v></c><c t="s"><v>2</v></c><c r="E3" t="str"><v>text</v></c></row>
<row><c t="b"><v>1</v></c><c t="e"><v>#DIV/0!</v></c><c t="d"><v>2024-02-29T10:00:00</v></c></row>
<row r="2"><c r="A2"><v>7</v></c></row>
<row r="7"><c r="A7"><v>1.5E3</v></c><c r="C7" t="inlineStr"><is><t>inline</t><r><t>+run</t></r></is></c></row>
<row r="7"><c r="A7"><v>6</v></c></row>
<row r="8"><c r="A8" s="1"><v>45000.5</v></c><c r="B8"><f>A8*2</f><v>90001</v></c><c r="C8"><v></v></c><c r="D8" t="s"><v>3</v></c></row>
<row r="9"><c r="B9"><v>1</v></c><c r="B9"><v>2</v></c><c r="D9"><v>4</v></c><c r="C9"><v>3</v></c></row>
<row r="10.0"><c r="Z10" t="s"><v>4</v></c><c r="A10" t="s"><v>0</v></c></row>
<row r="11"/>
<row r="12"><c r="A12" t="inlineStr"/><c r="B12" t="n"/><c r="C12" t="s"><v>-1</v></c></row>
<row r="13"><c r="B13" t="str"><v>  spaced   out  </v></c><c r="XFD13"><v>5</v></c></row>
<row r="14"><c r="C14"><v>8</v></c><c r="A14"><v>9</v></c></row>
</sheetData></worksheet>"""


def test_hand_written_sheet_xml_reads_as_openpyxl_read_it():
    """Rows and cells without references, rows out of order, repeated and later columns,
    shared strings with runs and phonetic text, inline strings, every cell type."""
    import openpyxl

    book = openpyxl.Workbook()
    book.active["C1"].number_format = "yyyy-mm-dd"  # style 1: a date
    book.active["C1"] = 45000
    template = io.BytesIO()
    book.save(template)
    content_types = zipfile.ZipFile(template).read("[Content_Types].xml").replace(
        b"</Types>", b'<Override PartName="/xl/sharedStrings.xml" ContentType="application/vnd.'
                     b'openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/></Types>')
    out = io.BytesIO()
    _repack(template.getvalue(), {"xl/worksheets/sheet1.xml": lambda: [QUIRKS.encode()],
                                  "[Content_Types].xml": lambda: [content_types]}, out)
    with zipfile.ZipFile(out, "a") as z:
        z.writestr("xl/sharedStrings.xml", STRINGS)
    data = out.getvalue()
    text, _title = streamed_text(data)
    assert (text, _title) == openpyxl_text(data)
    assert "bold run | base" in text and "x000D_ab" in text and "last-t-winsc" in text
    assert "1500 |  | inline+run" in text and "TRUE | #DIV/0! | 2024-02-29T10:00:00" in text
    assert "\n7\n" not in text and "\n6\n" not in text  # rows out of order: dropped, as before
    assert text.endswith("\n9")  # a cell past the row's last cell: dropped, as before


def test_a_spreadsheet_declaring_entities_is_refused(tmp_path):
    """openpyxl read sheets through defusedxml; so does the streamed reader refuse entities."""
    import openpyxl

    book = openpyxl.Workbook()
    book.active["A1"] = 1
    template = io.BytesIO()
    book.save(template)
    laughs = (f'<?xml version="1.0"?><!DOCTYPE w [<!ENTITY a "aaaaaaaaaa">'
              f'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>'
              f'<worksheet xmlns="{X_NS}"><sheetData><row><c t="str"><v>&b;</v></c></row>'
              f'</sheetData></worksheet>').encode()
    _repack(template.getvalue(), {"xl/worksheets/sheet1.xml": lambda: [laughs]}, tmp_path / "e.xlsx")
    with pytest.raises(Skipped, match="unreadable xlsx"):
        extract_file(tmp_path / "e.xlsx")
