"""Office and e-book formats, and PDFs without a text layer.

Every file here is written by a real library (python-docx, python-pptx, openpyxl, odfpy,
EbookLib, pypdf), ingested for real, found by BM25 search and verified by fetch_chunk
re-extracting the file; slides and sheets must show up as the chunk's heading.
"""

import datetime
import subprocess
import sys
from pathlib import Path

import pytest

from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.indexing.extract import (NO_TEXT_LAYER, Skipped, extract_bytes,
                                                    extract_file, extractor_available)
from groundkit_datasette.indexing.ingest import ingest


def make_docx(path: Path, marker: str = "Heliostat") -> Path:
    import docx

    document = docx.Document()
    document.core_properties.title = "Plant report"
    document.add_heading("Plant report", level=1)
    document.add_paragraph("An introduction that mentions nothing special.")
    document.add_heading("Mirrors", level=2)
    document.add_paragraph(f"{marker} fields track the sun with thousands of mirrors.")
    document.add_paragraph("# not a heading, just a line that starts with a hash")
    table = document.add_table(rows=2, cols=2)
    table.cell(0, 0).text = "Site"
    table.cell(0, 1).text = "Output"
    table.cell(1, 0).text = "Crescent Dunes"
    table.cell(1, 1).text = "110 MW"
    document.save(path)
    return path


def make_pptx(path: Path) -> Path:
    import pptx
    from pptx.util import Inches

    deck = pptx.Presentation()
    for title, body in [("Agenda", "Welcome and goals"), ("Budget", "Capital spend"),
                        ("Turbines", "Gearbox vibration anomalies in the nacelle")]:
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
    box = deck.slides[2].shapes.add_textbox(Inches(1), Inches(5), Inches(4), Inches(1))
    box.text_frame.text = "Second box on slide three"
    group = deck.slides[2].shapes.add_group_shape()
    group.shapes.add_textbox(Inches(1), Inches(6), Inches(4), Inches(1)).text_frame.text = (
        "Grouped caption about yaw")
    deck.slides[2].notes_slide.notes_text_frame.text = "Speaker notes mention bearings"
    deck.save(path)
    return path


def make_xlsx(path: Path) -> Path:
    import openpyxl

    book = openpyxl.Workbook()
    first = book.active
    first.title = "Q2"
    first.append(["Region", "Revenue"])
    first.append(["North", 100])
    q3 = book.create_sheet("Q3")
    q3.append(["Region", "Revenue", "Closed"])
    q3.append(["Archipelago", 1234.5, datetime.date(2024, 9, 30)])
    q3.append(["Fjordland", 17, True])
    book.create_sheet("Empty")
    book.save(path)
    return path


def make_odt(path: Path) -> Path:
    from odf.opendocument import OpenDocumentText
    from odf.table import Table, TableCell, TableColumn, TableRow
    from odf.text import H, List, ListItem, P

    document = OpenDocumentText()
    document.text.addElement(H(outlinelevel=1, text="Field notes"))
    document.text.addElement(P(text="Nothing to see in the first section."))
    items = List()
    for word in ("crampons", "ice axe"):
        item = ListItem()
        item.addElement(P(text=word))
        items.addElement(item)
    document.text.addElement(items)
    table = Table(name="Kit")
    table.addElement(TableColumn(numbercolumnsrepeated=2))
    row = TableRow()
    for word in ("rope", "40 m"):
        cell = TableCell()
        cell.addElement(P(text=word))
        row.addElement(cell)
    table.addElement(row)
    document.text.addElement(table)
    document.text.addElement(H(outlinelevel=2, text="Glaciers"))
    document.text.addElement(P(text="Moraine deposits mark where the glacier once ended."))
    document.save(str(path))
    return path


def make_epub(path: Path) -> Path:
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("groundkit-test-book")
    book.set_title("A small book")
    book.set_language("en")
    chapters = []
    for n, (title, body) in enumerate([("Departure", "The ship left the harbour at dawn."),
                                       ("Landfall", "Albatross sightings announced the coast.")], 1):
        chapter = epub.EpubHtml(title=title, file_name=f"chap_{n}.xhtml", lang="en")
        chapter.content = f"<html><head><title>{title}</title></head><body><h1>{title}</h1><p>{body}</p></body></html>"
        book.add_item(chapter)
        chapters.append(chapter)
    book.toc = chapters
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = chapters
    epub.write_epub(str(path), book)
    return path


def make_blank_pdf(path: Path) -> Path:
    import pypdf

    writer = pypdf.PdfWriter()
    writer.add_blank_page(width=612, height=792)
    with open(path, "wb") as f:
        writer.write(f)
    return path


CASES = [
    # (file name, maker, query, expected heading, text the hit must contain)
    ("report.docx", make_docx, "heliostat mirrors", "Plant report > Mirrors", "Heliostat fields"),
    ("deck.pptx", make_pptx, "gearbox vibration nacelle", "Slide 3 > Turbines", "Gearbox vibration"),
    ("sales.xlsx", make_xlsx, "archipelago", 'Sheet "Q3"', "Archipelago | 1234.5 | 2024-09-30\n"),
    ("notes.odt", make_odt, "moraine glacier", "Field notes > Glaciers", "Moraine deposits"),
    ("book.epub", make_epub, "albatross sightings", "A small book > Landfall", "Albatross sightings"),  # the book title heads the path (adr/0035)
]


@pytest.fixture
def formats_corpus(tmp_path):
    root = tmp_path / "corpus"
    root.mkdir()
    for name, maker, *_ in CASES:
        maker(root / name)
    make_blank_pdf(root / "scan.pdf")
    return root


@pytest.mark.parametrize("name, maker, query, heading, needle", CASES, ids=[c[0] for c in CASES])
def test_each_format_is_searchable_cited_by_heading_and_verified(
        formats_corpus, tmp_path, name, maker, query, heading, needle):
    """Office/e-book text is found by search, the hit's heading names the slide/sheet/section,
    and fetch_chunk re-extracts the file and verifies the span."""
    index = tmp_path / "index"
    report = ingest([formats_corpus], collection="docs", index_dir=index, embedder="none")
    assert report.added == 5, report.as_dict()
    with Collection.open("docs", index_dir=index) as col:
        hits = [h for h in col.search(query=query, mode="bm25").hits if h.source == name]
        assert hits, f"no hit in {name}"
        hit = hits[0]
        assert hit.heading == heading
        assert needle in hit.content
        fetched = col.fetch_chunk(hit.chunk_id)
        assert fetched.verification.status == "verified"
        row = col.query("SELECT extractor, extractor_version FROM documents WHERE source = ?", (name,))
        extractor, version = row[0]
        assert extractor == Path(name).suffix[1:]
        assert extractor_available(extractor, version)
        assert not extractor_available(extractor, "0")


@pytest.mark.parametrize("name, maker", [(c[0], c[1]) for c in CASES], ids=[c[0] for c in CASES])
def test_a_changed_file_drifts(tmp_path, name, maker):
    """After the file changes on disk, fetch_chunk re-extracts it and reports the chunk drifted."""
    root = tmp_path / "corpus"
    root.mkdir()
    path = maker(root / name)
    index = tmp_path / "index"
    ingest([root], collection="docs", index_dir=index, embedder="none")
    with Collection.open("docs", index_dir=index) as col:
        chunk_ids = [r[0] for r in col.query("SELECT chunk_id FROM chunks ORDER BY chunk_index")]
        assert all(col.fetch_chunk(c).verification.status == "verified" for c in chunk_ids)
        # Rewrite the file with every letter of its text different: nothing can re-anchor.
        text = extract_file(path).text
        replacement = root / ("other" + path.suffix)
        if name.endswith(".docx"):
            make_docx(replacement, marker="Zeppelin")
        else:
            _rewrite_other(path, replacement)
        replacement.replace(path)
        assert extract_file(path).text != text
        statuses = {col.fetch_chunk(c).verification.status for c in chunk_ids}
        assert "drifted" in statuses


def _rewrite_other(path: Path, target: Path) -> None:
    """A different document of the same format (the docx maker already takes a marker)."""
    if path.suffix == ".pptx":
        import pptx

        deck = pptx.Presentation()
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = "Replaced"
        slide.placeholders[1].text = "Entirely different words"
        deck.save(target)
    elif path.suffix == ".xlsx":
        import openpyxl

        book = openpyxl.Workbook()
        book.active.title = "Q3"
        book.active.append(["Other", "Values"])
        book.save(target)
    elif path.suffix == ".odt":
        from odf.opendocument import OpenDocumentText
        from odf.text import P

        document = OpenDocumentText()
        document.text.addElement(P(text="Replaced content only."))
        document.save(str(target))
    elif path.suffix == ".epub":
        from ebooklib import epub

        book = epub.EpubBook()
        book.set_identifier("other")
        book.set_title("Other")
        chapter = epub.EpubHtml(title="Other", file_name="c.xhtml")
        chapter.content = "<html><body><p>Replaced content only.</p></body></html>"
        book.add_item(chapter)
        book.add_item(epub.EpubNav())
        book.spine = [chapter]
        epub.write_epub(str(target), book)


def test_extraction_is_deterministic_and_structured(formats_corpus):
    """The same bytes give the same text; structure becomes headings and body lines that
    look like Markdown headings are escaped, not turned into headings."""
    for name, *_ in CASES:
        data = (formats_corpus / name).read_bytes()
        first = extract_bytes(data, Path(name).suffix)
        assert first == extract_bytes(data, Path(name).suffix)
        assert first.source_class == "markdown"
    docx_text = extract_file(formats_corpus / "report.docx")
    assert docx_text.title == "Plant report"
    assert "\\# not a heading" in docx_text.text
    assert "Crescent Dunes | 110 MW" in docx_text.text
    xlsx = extract_file(formats_corpus / "sales.xlsx").text
    assert xlsx.startswith('# Sheet "Q2"\n\nRegion | Revenue\nNorth | 100')
    assert 'Sheet "Empty"' not in xlsx  # an empty sheet is no section
    assert "Fjordland | 17 | TRUE" in xlsx
    pptx_text = extract_file(formats_corpus / "deck.pptx").text
    assert "# Slide 1\n\n## Agenda" in pptx_text
    assert "Second box on slide three" in pptx_text
    assert "Notes: Speaker notes mention bearings" in pptx_text
    assert "Grouped caption about yaw" in pptx_text  # text inside a group shape
    odt_text = extract_file(formats_corpus / "notes.odt").text
    assert "crampons\n\nice axe" in odt_text and "rope | 40 m" in odt_text
    assert extract_file(formats_corpus / "book.epub").title == "A small book"


def test_scanned_pdf_is_skipped_with_its_reason(formats_corpus, tmp_path):
    """A PDF whose pages have no text is reported as skipped "no text layer (scanned?)",
    in the ingest report and by name in the CLI summary, not silently empty."""
    with pytest.raises(Skipped) as info:
        extract_file(formats_corpus / "scan.pdf")
    assert info.value.reason == NO_TEXT_LAYER
    report = ingest([formats_corpus], collection="docs", index_dir=tmp_path / "i1", embedder="none")
    assert ("scan.pdf", NO_TEXT_LAYER) in report.skipped_files
    result = subprocess.run(
        [sys.executable, "-m", "groundkit_datasette.cli", "ingest", str(formats_corpus),
         "-c", "docs", "--index-dir", str(tmp_path / "i2"), "--embedder", "none"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert f"skipped: scan.pdf ({NO_TEXT_LAYER})" in result.stdout


@pytest.mark.parametrize("suffix", [".docx", ".pptx", ".xlsx", ".odt", ".epub"])
def test_malformed_packages_are_skipped_not_crashed(suffix):
    """Bytes that are not a valid package of that format are skipped with a short reason."""
    with pytest.raises(Skipped) as info:
        extract_bytes(b"PK\x03\x04 definitely not a zip", suffix)
    assert info.value.reason == f"unreadable {suffix[1:]}"


def test_a_zip_bomb_is_refused_before_unpacking(tmp_path):
    """A package that would unpack past the bound is skipped as too large."""
    import zipfile

    path = tmp_path / "bomb.docx"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("word/document.xml", b"\0" * (300 * 1024 * 1024))
    with pytest.raises(Skipped) as info:
        extract_file(path)
    assert info.value.reason == "too large"
