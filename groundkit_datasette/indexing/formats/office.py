"""Word and PowerPoint documents (OOXML .docx, .pptx), read with python-docx and python-pptx.

Headings (a "Title" or "Heading N" style) and slides (``# Slide 3``, its title as ``##``)
become the outline's headings; tables are rows of cells joined by " | "; speaker notes follow
their slide. Parsed in an isolation worker (adr/0050); every member is counted first, since
the libraries parse whole parts."""

from __future__ import annotations

import io
import re

from .base import Extraction, Extractor
from .packages import Outline, library_version, packaged

__all__ = ["DOCX", "PPTX"]


def _docx_version() -> str:
    return library_version("docx")


def _pptx_version() -> str:
    return library_version("pptx")


def extract_docx(data: bytes, *, encoding: str | None, budget) -> Extraction:
    return packaged(data, budget, "docx", _read_docx, _docx_version, scan_first=True,
                    heading_title=True)


def extract_pptx(data: bytes, *, encoding: str | None, budget) -> Extraction:
    return packaged(data, budget, "pptx", _read_pptx, _pptx_version, scan_first=True)


def _read_docx(data: bytes, archive, budget) -> tuple[Outline, str | None]:
    import docx
    from docx.table import Table

    document = docx.Document(io.BytesIO(data))
    out = Outline()
    for block in document.iter_inner_content():
        if isinstance(block, Table):
            out.rows(_docx_rows(block))
            continue
        style = (block.style.name if block.style is not None else "") or ""
        level = _heading_level(style)
        if level:
            out.heading(level, block.text)
        else:
            out.paragraph(block.text)
    return out, (document.core_properties.title or None)


def _heading_level(style: str) -> int:
    if style == "Title":
        return 1
    m = re.fullmatch(r"Heading ([1-9])", style)
    return int(m.group(1)) if m else 0


def _docx_rows(table):
    for row in table.rows:
        cells, seen = [], set()
        for cell in row.cells:
            if id(cell._tc) in seen:  # a merged cell is listed once per grid column it spans
                continue
            seen.add(id(cell._tc))
            cells.append(cell.text)
        yield cells


def _read_pptx(data: bytes, archive, budget) -> tuple[Outline, str | None]:
    import pptx

    presentation = pptx.Presentation(io.BytesIO(data))
    out = Outline()
    for number, slide in enumerate(presentation.slides, 1):
        out.heading(1, f"Slide {number}")
        title_shape = slide.shapes.title
        if title_shape is not None and title_shape.has_text_frame and title_shape.text_frame.text.strip():
            out.heading(2, title_shape.text_frame.text)
        for shape in slide.shapes:
            if title_shape is not None and shape.shape_id == title_shape.shape_id:
                continue
            _pptx_shape(shape, out)
        if slide.has_notes_slide:
            notes = slide.notes_slide.notes_text_frame
            if notes is not None and notes.text.strip():
                out.paragraph("Notes: " + notes.text)
    return out, (presentation.core_properties.title or None)


def _pptx_shape(shape, out: Outline) -> None:
    from pptx.shapes.group import GroupShape

    if isinstance(shape, GroupShape):
        for inner in shape.shapes:  # a group: its shapes in document order
            _pptx_shape(inner, out)
        return
    if getattr(shape, "has_table", False) and shape.has_table:
        out.rows([cell.text for cell in row.cells] for row in shape.table.rows)
    elif getattr(shape, "has_text_frame", False) and shape.has_text_frame:
        out.paragraph("\n".join(p.text if hasattr(p, "text") else "" for p in shape.text_frame.paragraphs))


DOCX = Extractor("docx", _docx_version, (".docx",), "markdown", extract_docx, isolated=True,
                 imports=("docx", "docx.table"))
PPTX = Extractor("pptx", _pptx_version, (".pptx",), "markdown", extract_pptx, isolated=True,
                 imports=("pptx", "pptx.shapes.group"))
