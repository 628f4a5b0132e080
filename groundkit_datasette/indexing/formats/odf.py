"""OpenDocument text (.odt), read from its XML with the standard library: headings by outline
level, paragraphs, lists and tables; footnotes and comments are not the running text. Parsed
in an isolation worker (adr/0050), every part counted before it is parsed."""

from __future__ import annotations

from .base import Budget, Extraction, Extractor, Skipped, collapse
from .packages import DC, FORMAT_EXTRACTOR_VERSION, Outline, packaged, q, read_xml

__all__ = ["ODT"]


def _version() -> str:
    return FORMAT_EXTRACTOR_VERSION  # no library: the version is ours alone


def extract_odt(data: bytes, *, encoding: str | None, budget) -> Extraction:
    return packaged(data, budget, "odt", _read_odt, _version, heading_title=True)


_ODF_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
_ODF_TABLE = "urn:oasis:names:tc:opendocument:xmlns:table:1.0"
_ODF_OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"


def _read_odt(data: bytes, archive, budget: Budget) -> tuple[Outline, str | None]:
    content = read_xml(archive, "content.xml", budget)
    if content is None:
        raise Skipped("unreadable odt")
    out = Outline()
    body = content.find(f"{q(_ODF_OFFICE, 'body')}/{q(_ODF_OFFICE, 'text')}")
    if body is not None:
        _odt_blocks(body, out)
    title = None
    meta = read_xml(archive, "meta.xml", budget)
    if meta is not None:
        node = meta.find(f".//{q(DC, 'title')}")
        if node is not None and node.text and node.text.strip():
            title = collapse(node.text)
    return out, title


def _odt_blocks(parent, out: Outline) -> None:
    for child in parent:
        tag = child.tag
        if tag == q(_ODF_TEXT, "h"):
            level = child.get(q(_ODF_TEXT, "outline-level"), "1")
            out.heading(int(level) if level.isdigit() else 1, _odt_inline(child))
        elif tag == q(_ODF_TEXT, "p"):
            out.paragraph(_odt_inline(child))
        elif tag == q(_ODF_TABLE, "table"):
            out.rows(
                [_odt_cell(cell) for cell in row.iter()
                 if cell.tag == q(_ODF_TABLE, "table-cell")]
                for row in child.iter(q(_ODF_TABLE, "table-row"))
            )
        elif tag in (q(_ODF_TEXT, "list"), q(_ODF_TEXT, "list-item"), q(_ODF_TEXT, "section"),
                     q(_ODF_TEXT, "list-header")):
            _odt_blocks(child, out)


def _odt_cell(cell) -> str:
    return " ".join(_odt_inline(p) for p in cell.iter(q(_ODF_TEXT, "p")))


def _odt_inline(node) -> str:
    parts: list[str] = []

    def walk(el):
        if el.text:
            parts.append(el.text)
        for child in el:
            tag = child.tag
            if tag == q(_ODF_TEXT, "s"):
                count = child.get(q(_ODF_TEXT, "c"), "1")
                parts.append(" " * min(int(count) if count.isdigit() else 1, 1000))
            elif tag == q(_ODF_TEXT, "tab"):
                parts.append("\t")
            elif tag == q(_ODF_TEXT, "line-break"):
                parts.append("\n")
            elif tag in (q(_ODF_TEXT, "note"), q(_ODF_OFFICE, "annotation")):
                pass  # footnotes and comments are not the running text
            else:
                walk(child)
            if child.tail:
                parts.append(child.tail)

    walk(node)
    return "".join(parts)


ODT = Extractor("odt", _version, (".odt",), "markdown", extract_odt, isolated=True)
