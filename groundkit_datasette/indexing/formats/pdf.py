"""PDF: pypdf's text of each page, pages separated by PDF_PAGE_SEPARATOR (a hard boundary to
the chunker), page starts kept so a citation names its page. Parsed in an isolation worker
(adr/0050); identity is pypdf's own version, since its text is what a citation is cut from."""

from __future__ import annotations

import io

from .base import Extraction, Extractor, Skipped, over, reraise_memory

__all__ = ["NO_TEXT_LAYER", "PDF", "PDF_PAGE_SEPARATOR"]

# A PDF whose pages carry no text at all: most often a scan without OCR.
NO_TEXT_LAYER = "no text layer (scanned?)"
# Between PDF pages; the chunker treats "\f" as a hard boundary for "pdf".
PDF_PAGE_SEPARATOR = "\n\f\n"


def _version() -> str:
    import pypdf

    return pypdf.__version__


def extract_pdf(data: bytes, *, encoding: str | None, budget) -> Extraction:
    try:
        import pypdf
    except ImportError:
        raise Skipped("pdf support not installed") from None
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise Skipped("encrypted")
        # The page tree only: no page is read before the count is known to be within bounds.
        if len(reader.pages) > budget.max_pages:
            raise over(budget.max_pages, "pages")
        pages = []
        for page in reader.pages:
            pages.append(page.extract_text() or "")
            budget.add_text(len(pages[-1]) + len(PDF_PAGE_SEPARATOR))
        title = _pdf_title(reader)
    except Skipped:
        raise
    except Exception as exc:  # malformed PDFs surface as almost any exception type
        reraise_memory(exc)
        raise Skipped("unreadable pdf") from None
    parts: list[str] = []
    starts: list[int] = []
    pos = 0
    for i, page in enumerate(pages):
        # A stray form feed would be read as a page break by the chunker.
        page = page.replace("\f", "\n").replace("\x00", "")
        if i:
            parts.append(PDF_PAGE_SEPARATOR)
            pos += len(PDF_PAGE_SEPARATOR)
        starts.append(pos)
        parts.append(page)
        pos += len(page)
    text = "".join(parts)
    if not text.strip():
        # Pages but no text: an image-only (scanned) PDF, said so rather than "empty".
        raise Skipped(NO_TEXT_LAYER if pages else "empty")
    return Extraction(text, title, tuple(starts))


def _pdf_title(reader) -> str | None:
    """The PDF's document-information ``/Title``, whitespace collapsed; None if unset or unreadable."""
    try:
        value = reader.metadata.title if reader.metadata is not None else None
    except Exception:  # a malformed info dictionary costs the title only
        return None
    return " ".join(value.split()) or None if isinstance(value, str) else None


PDF = Extractor("pypdf", _version, (".pdf",), "pdf", extract_pdf, isolated=True,
                imports=("pypdf",))
