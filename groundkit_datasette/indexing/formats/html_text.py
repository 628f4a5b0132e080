"""HTML: the text a reader sees (scripts, styles and the head left out), paragraphs and
table rows as lines, titled by ``<title>`` or the first ``<h1>``. Decoded by its BOM, UTF-8,
a ``<meta charset>`` that fits, else the single-byte fallback of plain text."""

from __future__ import annotations

import codecs
import re
from html.parser import HTMLParser

from .base import Extraction, Extractor, Skipped, collapse
from .text import UTF_8, decode, detect_text, utf8_or_single_byte

__all__ = ["HTML", "HTML_EXTRACTOR_VERSION", "html_text"]

# Bump whenever _HTMLText's output changes for any input.
HTML_EXTRACTOR_VERSION = "1"
_SPACE_RUN = re.compile(r"\s+")

_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)


def _detect_html(data: bytes) -> str:
    """BOM, else UTF-8, else a ``<meta charset>`` that decodes, else the single-byte fallback."""
    if data.startswith((codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return detect_text(data)
    if b"\x00" in data:
        raise Skipped("binary")
    try:
        data.decode("utf-8")
        return UTF_8
    except UnicodeDecodeError:
        pass
    m = _META_CHARSET.search(data[:4096])
    if m:
        try:
            name = codecs.lookup(m.group(1).decode("ascii")).name
            data.decode(name)
            return name
        except (LookupError, UnicodeDecodeError):
            pass
    return utf8_or_single_byte(data)


# Content never shown as text.
_SKIP_TAGS = {"script", "style", "noscript", "template", "svg", "math", "iframe", "object"}
# Allowed inside <head>; anything else means the head ended without </head>.
_HEAD_TAGS = {"title", "meta", "link", "base", "style", "script", "noscript", "template"}
_PARAGRAPH_TAGS = {
    "p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "table",
    "ul", "ol", "dl", "section", "article", "header", "footer", "nav",
    "aside", "main", "figure", "form", "fieldset", "details", "hr",
    "address", "body",
}
_LINE_TAGS = {
    "div", "li", "dt", "dd", "tr", "caption", "figcaption", "summary",
    "legend", "option", "thead", "tbody", "tfoot", "center",
}
_CELL_TAGS = {"td", "th"}
_VOID_TAGS = {
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link",
    "meta", "param", "source", "track", "wbr",
}
_TRAILING_SPACE = re.compile(r"[ \t]+\n")
_MANY_NEWLINES = re.compile(r"\n{3,}")


class _HTMLText(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.pending_break = 0  # newlines owed before the next text
        self.pending_space = False
        self.at_line_start = True
        self.skip_depth = 0
        self.in_head = False
        self.pre_depth = 0
        self.pre_fresh = False  # drop one newline right after <pre>
        self.cell_index = 0
        self.pending_sep = False  # " | " owed before the next table cell's text
        self.title: str | None = None
        self.title_parts: list[str] | None = None
        self.h1: str | None = None
        self.h1_parts: list[str] | None = None

    # Structure

    def _break(self, n: int) -> None:
        self.pending_break = max(self.pending_break, n)
        self.pending_space = False
        self.pending_sep = False

    def handle_starttag(self, tag, attrs):
        if tag == "head":
            self.in_head = True
            return
        if self.in_head and tag not in _HEAD_TAGS:
            self.in_head = False
        if tag in _SKIP_TAGS:
            self.skip_depth += 1
            return
        if self.skip_depth:
            return
        if tag == "title":
            self.title_parts = []
            return
        if self.in_head:
            return
        if tag == "h1" and self.h1 is None:
            self.h1_parts = []
        if tag == "br":
            self.out.append("\n" * (1 + (self.pending_break if self.out else 0)))
            self.pending_break = 0
            self.pending_space = False
            self.pending_sep = False
            self.at_line_start = True
        elif tag in _PARAGRAPH_TAGS:
            self._break(2)
        elif tag in _LINE_TAGS:
            self._break(1)
        if tag == "tr":
            self.cell_index = 0
        elif tag in _CELL_TAGS:
            if self.cell_index:
                self.pending_sep = True
            self.cell_index += 1
        if tag == "pre":
            self.pre_depth += 1
            self.pre_fresh = True

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in _VOID_TAGS:
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if tag == "head":
            self.in_head = False
            return
        if tag in _SKIP_TAGS:
            if self.skip_depth:
                self.skip_depth -= 1
            return
        if self.skip_depth:
            return
        if tag == "title":
            if self.title_parts is not None and self.title is None:
                self.title = collapse("".join(self.title_parts)) or None
            self.title_parts = None
            return
        if self.in_head or self.skip_depth:
            return
        if tag == "h1" and self.h1_parts is not None:
            self.h1 = collapse("".join(self.h1_parts)) or None
            self.h1_parts = None
        if tag == "pre" and self.pre_depth:
            self.pre_depth -= 1
            self.pre_fresh = False
        if tag in _PARAGRAPH_TAGS:
            self._break(2)
        elif tag in _LINE_TAGS:
            self._break(1)

    # Text

    def handle_data(self, data):
        if self.skip_depth:
            return
        if self.title_parts is not None:
            self.title_parts.append(data)
            return
        if self.in_head:
            return
        if self.h1_parts is not None:
            self.h1_parts.append(data)
        if self.pre_depth:
            if self.pre_fresh:
                self.pre_fresh = False
                if data.startswith("\r\n"):
                    data = data[2:]
                elif data.startswith("\n"):
                    data = data[1:]
            data = data.replace("\r\n", "\n").replace("\r", "\n")
            if data:
                self._emit(data, raw=True)
            return
        if not data:
            return
        leading = data[0].isspace()
        trailing = data[-1].isspace()
        words = _SPACE_RUN.sub(" ", data).strip()
        if leading and not self.at_line_start:
            self.pending_space = True
        if words:
            self._emit(words)
            self.pending_space = trailing

    def _emit(self, s: str, raw: bool = False) -> None:
        if self.out and self.pending_break:
            self.out.append("\n" * self.pending_break)
            self.at_line_start = True
        self.pending_break = 0
        if self.pending_sep and not self.at_line_start:
            self.out.append(" | ")
        elif self.pending_space and not self.at_line_start:
            self.out.append(" ")
        self.pending_space = False
        self.pending_sep = False
        self.out.append(s)
        self.at_line_start = s.endswith("\n")

    def result(self) -> str:
        text = "".join(self.out)
        text = _TRAILING_SPACE.sub("\n", text)
        text = _MANY_NEWLINES.sub("\n\n", text)
        return text.strip()


def html_text(data: bytes, encoding: str | None) -> tuple[str, str | None, str]:
    """(text, title, codec used); EPUB chapters are read by this too."""
    used = encoding or _detect_html(data)
    parser = _HTMLText()
    parser.feed(decode(data, used))
    parser.close()
    if parser.title is None and parser.title_parts:
        parser.title = collapse("".join(parser.title_parts)) or None  # unclosed <title>
    return parser.result(), parser.title or parser.h1, used


def _html(data: bytes, *, encoding: str | None, budget) -> Extraction:
    text, title, used = html_text(data, encoding)
    return Extraction(text, title, encoding=used)


HTML = Extractor("html", HTML_EXTRACTOR_VERSION, (".html", ".htm", ".xhtml"), "html", _html)
