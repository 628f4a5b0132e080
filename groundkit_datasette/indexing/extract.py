"""Turn a file into text, deterministically.

Citation verification re-extracts the source and compares offsets, so
the same bytes must always yield the same text, and text formats are
kept verbatim (no newline normalisation; only a BOM is removed).

Text that is not UTF-8 is decoded by a fixed rule, not guessed by a
detector: a BOM (UTF-8 or UTF-16), else UTF-8, else Windows-1252, else
Latin-1 (which decodes any bytes). The encoding used is returned with the
text and recorded per document, and verification decodes with the
recorded one (adr/0012-text-encodings.md).

Office and e-book files (.docx, .pptx, .xlsx, .odt, .epub) become Markdown-shaped
text: their headings, slides (``# Slide 3``) and sheets (``# Sheet "Q3"``) become ATX
headings, so the chunker's heading paths name where a citation is, and a body line that
would read as Markdown structure is escaped with a backslash. Each of these extractors
records its own version and the library's, so a citation is only checked by the same
code (adr/0020-office-and-ebook-text.md).
"""

from __future__ import annotations

import codecs
import datetime
import io
import posixpath
import re
import time
import zipfile
from urllib.parse import unquote
from xml.etree import ElementTree
from xml.parsers import expat
from bisect import bisect_right
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from . import isolation
from .chunking import find_headings

__all__ = [
    "Exceeded",
    "Extracted",
    "ExtractionBusy",
    "Skipped",
    "HTML_EXTRACTOR_VERSION",
    "FORMAT_EXTRACTOR_VERSION",
    "NO_TEXT_LAYER",
    "MAX_FILE_BYTES",
    "PDF_PAGE_SEPARATOR",
    "TEXT_EXTRACTOR_VERSION",
    "extract_bytes",
    "extract_file",
    "extractor_available",
    "page_for_offset",
    "source_class_for",
]

TEXT_EXTRACTOR_VERSION = "1"
# Bump whenever _HTMLText's output changes for any input.
HTML_EXTRACTOR_VERSION = "1"
MAX_FILE_BYTES = 64 * 1024 * 1024
# Bump whenever an Office/e-book extractor's output changes for any input (the library's own
# version is recorded beside it).
FORMAT_EXTRACTOR_VERSION = "1"
# A zip container (Office, OpenDocument, EPUB) may unpack to at most this many bytes in all.
MAX_UNPACKED_BYTES = 256 * 1024 * 1024
# -- Budgets (adr/0050-isolated-extraction.md) -----------------------------------------------
# What one file may cost while it is extracted, checked as it streams: a file past one is
# skipped with the bound named ("exceeds the extraction budget: 2,000,000 cells"). No ordinary
# document comes near them (docs/performance.md, "Extraction budgets and isolation"). Plain
# text, Markdown, HTML and code give at most one character per byte read, so MAX_FILE_BYTES is
# their budget; these bound the formats that expand.
MAX_TEXT_CHARS = 20_000_000       # characters of text (about 10,000 pages of prose)
MAX_CELLS = 2_000_000             # spreadsheet cells present in the file (gaps cost nothing)
MAX_ROWS = 2_000_000              # spreadsheet rows, empty ones included
MAX_XML_ELEMENTS = 10_000_000     # XML elements read from a package's members
MAX_MEMBERS = 10_000              # members of a zip package
MAX_PDF_PAGES = 10_000            # pages of a PDF, counted before any page is read
# Limits of the child process that extracts PDFs and packages (indexing/isolation.py): wall
# time, and address space beyond what it holds when it starts (the file's bytes included).
EXTRACT_SECONDS = 120.0           # at ingest
SERVE_EXTRACT_SECONDS = 30.0      # re-extraction for a request (fetch_chunk, verify_quote)
EXTRACT_MEMORY_BYTES = 1024 * 1024 * 1024
# Isolated re-extractions running at once in a server, and callers that may wait for one.
SERVE_EXTRACTIONS = 2
SERVE_EXTRACTIONS_WAITING = 8
# A PDF whose pages carry no text at all: most often a scan without OCR.
NO_TEXT_LAYER = "no text layer (scanned?)"
# Between PDF pages; the chunker treats "\f" as a hard boundary for "pdf".
PDF_PAGE_SEPARATOR = "\n\f\n"


@dataclass(frozen=True)
class Extracted:
    text: str
    title: str | None
    source_class: str
    extractor: str
    extractor_version: str
    page_starts: tuple[int, ...] = ()
    # Python codec name the text was decoded with (None for PDFs, which are not decoded).
    encoding: str | None = None


class Skipped(Exception):
    """The file is not ingested; ``reason`` is short and safe to show."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Exceeded(Skipped):
    """Skipped for a budget, or for the extracting child's time or memory limit: the file may
    be well formed, it costs more than any file may. ``kind``: "budget", "time" or "memory"."""

    def __init__(self, reason: str, kind: str = "budget"):
        super().__init__(reason)
        self.kind = kind


def _over(limit: int, what: str) -> Exceeded:
    return Exceeded(f"exceeds the extraction budget: {limit:,} {what}")


class _Budget:
    """What one file has cost so far; ``Exceeded`` as soon as a count passes its bound."""

    __slots__ = ("text", "cells", "rows", "elements")

    def __init__(self) -> None:
        self.text = self.cells = self.rows = self.elements = 0

    def add_text(self, n: int) -> None:
        self.text += n
        if self.text > MAX_TEXT_CHARS:
            raise _over(MAX_TEXT_CHARS, "characters of text")

    def add_cells(self, n: int) -> None:
        self.cells += n
        if self.cells > MAX_CELLS:
            raise _over(MAX_CELLS, "cells")

    def add_row(self) -> None:
        self.rows += 1
        if self.rows > MAX_ROWS:
            raise _over(MAX_ROWS, "rows")

    def add_elements(self, n: int) -> None:
        self.elements += n
        if self.elements > MAX_XML_ELEMENTS:
            raise _over(MAX_XML_ELEMENTS, "XML elements")


_MARKDOWN = {".md", ".markdown", ".mdown", ".mkd", ".mdx"}
_TEXT = {".txt", ".text", ".log"}
_RST = {".rst", ".rest"}
_HTML = {".html", ".htm", ".xhtml"}
_CODE = {
    ".py", ".pyi", ".js", ".mjs", ".cjs", ".jsx", ".ts", ".tsx", ".c", ".h",
    ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".hxx", ".rs", ".go", ".java",
    ".kt", ".kts", ".scala", ".swift", ".m", ".mm", ".cs", ".fs", ".rb",
    ".php", ".pl", ".pm", ".lua", ".r", ".jl", ".hs", ".ml", ".mli",
    ".ex", ".exs", ".erl", ".clj", ".dart", ".zig", ".nim", ".vue",
    ".svelte", ".sh", ".bash", ".zsh", ".fish", ".ps1", ".bat", ".cmd",
    ".toml", ".yaml", ".yml", ".json", ".jsonl", ".ini", ".cfg", ".conf",
    ".sql", ".css", ".scss", ".sass", ".less", ".xml", ".proto",
    ".graphql", ".gql", ".tf", ".cmake", ".mk", ".gradle", ".dockerfile",
    ".tex", ".bib", ".csv", ".tsv",
}
_CODE_NAMES = {
    "makefile", "gnumakefile", "dockerfile", "containerfile", "cmakelists.txt",
    "rakefile", "gemfile", "justfile", "vagrantfile", "procfile",
}
_PDF = {".pdf"}
# Suffix -> extractor name for the zip-based document formats.
_PACKAGED = {".docx": "docx", ".pptx": "pptx", ".xlsx": "xlsx", ".odt": "odt", ".epub": "epub"}
# Known binary formats: refused without sniffing.
_UNSUPPORTED = {
    ".png", ".jpg", ".jpeg", ".gif", ".bmp", ".ico", ".webp", ".tif",
    ".tiff", ".heic", ".psd", ".zip", ".gz", ".tgz", ".bz2", ".xz", ".zst",
    ".7z", ".rar", ".tar", ".exe", ".dll", ".so", ".dylib", ".o", ".a",
    ".lib", ".class", ".jar", ".pyc", ".pyo", ".whl", ".egg", ".doc",
    ".xls", ".ppt", ".ods", ".odp", ".mp3", ".mp4", ".m4a", ".wav", ".avi", ".mov", ".mkv",
    ".flac", ".ogg", ".webm", ".woff", ".woff2", ".ttf", ".otf", ".eot",
    ".sqlite", ".sqlite3", ".db", ".iso", ".dmg", ".bin", ".parquet",
    ".arrow", ".lance", ".npy", ".npz", ".pkl", ".pickle", ".onnx",
}


def source_class_for(suffix: str, name: str = "") -> str | None:
    """The source class a file would get, or None if it is refused."""
    suffix = _norm_suffix(suffix)
    if name.lower() in _CODE_NAMES:
        return "code"
    if suffix in _MARKDOWN:
        return "markdown"
    if suffix in _RST:
        return "rst"
    if suffix in _HTML:
        return "html"
    if suffix in _PDF:
        return "pdf"
    if suffix in _PACKAGED:
        return "markdown"  # Markdown-shaped text with the document's headings
    if suffix in _CODE:
        return "code"
    if suffix in _UNSUPPORTED:
        return None
    return "text"  # includes .txt, no suffix and unknown suffixes that decode


def extract_file(path: Path, *, max_bytes: int = MAX_FILE_BYTES,
                 encoding: str | None = None) -> Extracted:
    path = Path(path)
    if source_class_for(path.suffix, path.name) is None:
        raise Skipped("unsupported type")
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise Skipped("too large")
        data = path.read_bytes()
    except OSError:
        raise Skipped("unreadable") from None
    if _isolate(path.suffix):
        return _extract_isolated(data, path.suffix, max_bytes, encoding, serving=False)
    return _extract(data, path.suffix, path.name, max_bytes, encoding)


def extract_bytes(
    data: bytes, suffix: str, *, max_bytes: int = MAX_FILE_BYTES, encoding: str | None = None,
    serving: bool = False, seconds: float | None = None,
) -> Extracted:
    """Like extract_file, for content already in memory (``suffix`` as ".md").

    ``encoding`` (a codec name recorded at ingest) decodes text with that codec instead of
    choosing one, so a citation is checked against the text it was cut from.

    PDFs and packages (Office, EPUB) are parsed in a child process limited to EXTRACT_SECONDS
    (SERVE_EXTRACT_SECONDS when ``serving``) and EXTRACT_MEMORY_BYTES, so a hostile file costs
    its own extraction only: past a limit it is ``Exceeded`` ("extraction timed out after
    120 s"). ``serving`` also takes one of SERVE_EXTRACTIONS slots, waiting for one within the
    time limit; ``ExtractionBusy`` when none is to be had. ``seconds`` lowers the time limit
    (a request's own deadline). Text, Markdown, HTML and code are decoded here, by linear code
    of our own.
    """
    if _isolate(suffix):
        return _extract_isolated(data, suffix, max_bytes, encoding, serving=serving,
                                 seconds=seconds)
    return _extract(data, suffix, "", max_bytes, encoding)


class ExtractionBusy(Exception):
    """Serving: SERVE_EXTRACTIONS files are being extracted and enough callers wait already."""


_SERVE_SLOTS = isolation.Slots(SERVE_EXTRACTIONS, SERVE_EXTRACTIONS_WAITING)


def _isolate(suffix: str) -> bool:
    suffix = _norm_suffix(suffix)
    if suffix not in _PDF and suffix not in _PACKAGED:
        return False
    return not isolation.in_child()  # in a child already: parse here


def _extract_isolated(data: bytes, suffix: str, max_bytes: int, encoding: str | None,
                      serving: bool, seconds: float | None = None) -> Extracted:
    if len(data) > max_bytes:
        raise Skipped("too large")  # not worth a child
    limit = SERVE_EXTRACT_SECONDS if serving else EXTRACT_SECONDS
    if seconds is not None:
        limit = min(limit, max(0.001, seconds))
    seconds = limit
    slots = None
    if serving:
        slots = _SERVE_SLOTS
        started = time.monotonic()
        try:
            slots.acquire(seconds)
        except isolation.Busy:
            raise ExtractionBusy("too many files are being re-extracted at once; retry shortly") from None
        seconds = max(0.001, seconds - (time.monotonic() - started))
    try:
        plain = isolation.run_in_worker(
            _extract_plain, data, suffix, max_bytes, encoding, timeout=seconds,
            memory_bytes=EXTRACT_MEMORY_BYTES, passthrough=(Exceeded, Skipped),
            imports=_LIBRARIES.get(_norm_suffix(suffix), ()))
    except isolation.ChildTimeout:
        raise Exceeded(f"extraction timed out after {limit:g} s", "time") from None
    except isolation.ChildOutOfMemory:
        raise Exceeded("extraction exceeded its memory limit", "memory") from None
    except isolation.ChildFailed:
        raise Skipped("extraction crashed") from None
    finally:
        if slots is not None:
            slots.release()
    try:
        return _from_plain(plain)
    except (TypeError, ValueError, KeyError):  # a child the file compromised, or a defect
        raise Skipped("extraction crashed") from None


def warm_up() -> None:
    """Extract a small file of every isolated format, once, where calls will run (a worker, the
    fork server): the libraries' lazy imports, compiled patterns and caches are then ready for
    every call (or inherited by every child) instead of being built by the first."""
    samples = [(".pdf", _warm_pdf())]
    try:
        import docx

        document = docx.Document()
        document.add_heading("Warm", level=1)
        document.add_paragraph("up")
        document.add_table(rows=1, cols=2).cell(0, 0).text = "cell"
        samples.append((".docx", _saved(document.save)))
    except Exception:
        pass
    try:
        import pptx

        deck = pptx.Presentation()
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = "Warm"
        slide.placeholders[1].text = "up"
        samples.append((".pptx", _saved(deck.save)))
    except Exception:
        pass
    try:
        import openpyxl

        book = openpyxl.Workbook()
        book.active.append(["warm", 1, 2.5])
        samples.append((".xlsx", _saved(book.save)))
    except Exception:
        pass
    for suffix, data in samples:
        try:
            _extract(data, suffix, "", MAX_FILE_BYTES)
        except Exception:  # a warm-up: whatever it does not reach, a child does itself
            pass


def _saved(save) -> bytes:
    out = io.BytesIO()
    save(out)
    return out.getvalue()


def _warm_pdf() -> bytes:
    """One page saying "warm", with its cross-reference table."""
    stream = b"BT /F1 12 Tf 72 720 Td (warm) Tj ET"
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R"
            b" >> >> /Contents 5 0 R >>", b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
            b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream)]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 6\n0000000000 65535 f \n" + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size 6 /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


# What a worker imports before an extraction of each kind, outside its memory limit.
_LIBRARIES = {
    ".pdf": ("pypdf",),
    ".docx": ("docx", "docx.table"),
    ".pptx": ("pptx", "pptx.shapes.group"),
    ".xlsx": ("openpyxl", "openpyxl.utils.cell", "openpyxl.utils.datetime",
              "openpyxl.styles.numbers"),
}


def _extract_plain(data: bytes, suffix: str, max_bytes: int, encoding: str | None) -> dict:
    """In the child: the extraction as plain data (no pickle crosses back)."""
    e = _extract(data, suffix, "", max_bytes, encoding)
    return {"text": e.text, "title": e.title, "source_class": e.source_class,
            "extractor": e.extractor, "extractor_version": e.extractor_version,
            "page_starts": list(e.page_starts), "encoding": e.encoding}


def _from_plain(plain) -> Extracted:
    """The child's answer, checked for shape: it is data from a process a file may control."""
    def text(value, optional=False):
        if (value is None and optional) or isinstance(value, str):
            return value
        raise TypeError("not text")

    starts = plain["page_starts"]
    if not isinstance(starts, list) or not all(type(p) is int for p in starts):
        raise TypeError("page starts")
    body = text(plain["text"])
    if starts != sorted(starts) or any(p < 0 or p > len(body) for p in starts):
        raise ValueError("page starts")
    return Extracted(body, text(plain["title"], True), text(plain["source_class"]),
                     text(plain["extractor"]), text(plain["extractor_version"]), tuple(starts),
                     text(plain["encoding"], True))


def extractor_available(extractor: str, version: str) -> bool:
    """Whether this process re-extracts exactly as ``extractor``/``version`` did."""
    if extractor == "text":
        return version == TEXT_EXTRACTOR_VERSION
    if extractor == "html":
        return version == HTML_EXTRACTOR_VERSION
    if extractor == "pypdf":
        try:
            import pypdf
        except ImportError:
            return False
        return version == pypdf.__version__
    if extractor in _FORMAT_EXTRACTORS:
        try:
            return version == _format_version(extractor)
        except ImportError:
            return False
    return False


def page_for_offset(page_starts: tuple[int, ...], offset: int) -> int | None:
    """1-based page holding ``offset``, or None for non-paged documents."""
    if not page_starts:
        return None
    return max(1, bisect_right(page_starts, offset))


def _norm_suffix(suffix: str) -> str:
    suffix = suffix.lower()
    if suffix and not suffix.startswith("."):
        suffix = "." + suffix
    return suffix


def _extract(data: bytes, suffix: str, name: str, max_bytes: int,
             encoding: str | None = None) -> Extracted:
    source_class = source_class_for(suffix, name)
    if source_class is None:
        raise Skipped("unsupported type")
    if len(data) > max_bytes:
        raise Skipped("too large")
    if source_class == "pdf":
        return _extract_pdf(data)
    packaged = _PACKAGED.get(_norm_suffix(suffix))
    if packaged is not None:
        return _extract_packaged(packaged, data)
    if source_class == "html":
        text, title, used = _extract_html(data, encoding)
        if not text.strip():
            raise Skipped("empty")
        return Extracted(text, title, "html", "html", HTML_EXTRACTOR_VERSION, encoding=used)
    used = encoding or _detect_text(data)
    text = _decode(data, used)
    if not text.strip():
        raise Skipped("empty")
    return Extracted(
        text, _title(text, source_class), source_class, "text", TEXT_EXTRACTOR_VERSION,
        encoding=used,
    )


# --------------------------------------------------------------------------
# Plain text


_CONTROL_BYTES = frozenset(range(0x20)) - {0x09, 0x0A, 0x0C, 0x0D, 0x1B}


def _looks_binary(data: bytes) -> bool:
    sample = data[:8192]
    if not sample:
        return False
    controls = sum(1 for b in sample if b in _CONTROL_BYTES)
    return controls * 20 > len(sample)


UTF_8 = "utf-8"
UTF_16 = "utf-16"
CP1252 = "cp1252"
LATIN_1 = "iso8859-1"  # codecs' own name for Latin-1


def _detect_text(data: bytes) -> str:
    """The codec for a text file's bytes, by the fixed rule in the module docstring."""
    if data.startswith(codecs.BOM_UTF8):
        return UTF_8
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return UTF_16
    if b"\x00" in data:
        raise Skipped("binary")
    return _utf8_or_single_byte(data)


def _utf8_or_single_byte(data: bytes) -> str:
    try:
        data.decode("utf-8")
        return UTF_8
    except UnicodeDecodeError:
        pass
    if _looks_binary(data):
        raise Skipped("binary")
    try:
        data.decode(CP1252)  # leaves five bytes undefined; Latin-1 decodes those too
        return CP1252
    except UnicodeDecodeError:
        return LATIN_1


def _decode(data: bytes, encoding: str) -> str:
    """Decode with ``encoding`` exactly (a leading BOM removed); Skipped if it does not fit."""
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        raise Skipped("unknown encoding") from None
    if name == UTF_8 and data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    elif name != UTF_16 and b"\x00" in data:
        raise Skipped("binary")
    try:
        text = data.decode(name)  # utf-16 consumes its BOM
    except UnicodeDecodeError:
        raise Skipped("binary" if _looks_binary(data) else f"not {name} text") from None
    if "\x00" in text:
        raise Skipped("binary")
    return text


def _title(text: str, source_class: str) -> str | None:
    """Markdown: the first level-1 heading, else the front matter's ``title:``;
    reStructuredText: the first heading."""
    if source_class == "markdown":
        for h in find_headings(text, "markdown"):
            if h.level == 1 and h.title:
                return h.title
        return _front_matter_title(text)
    elif source_class == "rst":
        for h in find_headings(text, "rst"):
            return h.title
    return None


def _front_matter_title(text: str) -> str | None:
    """The ``title:`` of a Markdown file's YAML front matter, whitespace collapsed."""
    from .access_lists import front_matter

    try:
        matter = front_matter(text.lstrip("\ufeff"))
    except Exception:  # front matter that is not YAML gives no title (and stays text)
        return None
    value = matter.get("title") if matter else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    return " ".join(value.split()) or None if isinstance(value, str) else None


# --------------------------------------------------------------------------
# HTML


_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)


def _detect_html(data: bytes) -> str:
    """BOM, else UTF-8, else a ``<meta charset>`` that decodes, else the single-byte fallback."""
    if data.startswith((codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return _detect_text(data)
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
    return _utf8_or_single_byte(data)


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
_SPACE_RUN = re.compile(r"\s+")
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
                self.title = _collapse("".join(self.title_parts)) or None
            self.title_parts = None
            return
        if self.in_head or self.skip_depth:
            return
        if tag == "h1" and self.h1_parts is not None:
            self.h1 = _collapse("".join(self.h1_parts)) or None
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


def _collapse(s: str) -> str:
    return _SPACE_RUN.sub(" ", s).strip()


def _extract_html(data: bytes, encoding: str | None) -> tuple[str, str | None, str]:
    used = encoding or _detect_html(data)
    parser = _HTMLText()
    parser.feed(_decode(data, used))
    parser.close()
    if parser.title is None and parser.title_parts:
        parser.title = _collapse("".join(parser.title_parts)) or None  # unclosed <title>
    return parser.result(), parser.title or parser.h1, used


# --------------------------------------------------------------------------
# PDF


def _extract_pdf(data: bytes) -> Extracted:
    try:
        import pypdf
    except ImportError:
        raise Skipped("pdf support not installed") from None
    budget = _Budget()
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise Skipped("encrypted")
        # The page tree only: no page is read before the count is known to be within bounds.
        if len(reader.pages) > MAX_PDF_PAGES:
            raise _over(MAX_PDF_PAGES, "pages")
        pages = []
        for page in reader.pages:
            pages.append(page.extract_text() or "")
            budget.add_text(len(pages[-1]) + len(PDF_PAGE_SEPARATOR))
        title = _pdf_title(reader)
    except Skipped:
        raise
    except Exception as exc:  # malformed PDFs surface as almost any exception type
        _reraise_memory(exc)
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
    return Extracted(text, title, "pdf", "pypdf", pypdf.__version__, tuple(starts))


def _pdf_title(reader) -> str | None:
    """The PDF's document-information ``/Title``, whitespace collapsed; None if unset or unreadable."""
    try:
        value = reader.metadata.title if reader.metadata is not None else None
    except Exception:  # a malformed info dictionary costs the title only
        return None
    return " ".join(value.split()) or None if isinstance(value, str) else None


# --------------------------------------------------------------------------
# Office and e-book formats (zip containers)


_FORMAT_LIBRARIES = {"docx": "docx", "pptx": "pptx", "xlsx": "openpyxl", "odt": None, "epub": None}
_FORMAT_EXTRACTORS = frozenset(_FORMAT_LIBRARIES)


def _format_version(extractor: str) -> str:
    """``<ours>`` or ``<ours>/<library>-<its version>``; ImportError if the library is missing."""
    module = _FORMAT_LIBRARIES[extractor]
    if extractor == "epub":  # its chapters go through the HTML extractor
        return f"{FORMAT_EXTRACTOR_VERSION}/html-{HTML_EXTRACTOR_VERSION}"
    if module is None:
        return FORMAT_EXTRACTOR_VERSION
    lib = __import__(module)
    return f"{FORMAT_EXTRACTOR_VERSION}/{module}-{lib.__version__}"


# A line that the Markdown heading finder would read as structure: an ATX marker, a fence,
# or a setext underline (which would also turn the line above it into a heading).
_MARKDOWN_STRUCTURE = re.compile(r" {0,3}(?:#|`{3}|~{3}|=+[ \t]*$|-+[ \t]*$)")


class _Outline:
    """Blocks of Markdown-shaped text: headings and escaped paragraphs, blank-line separated."""

    def __init__(self) -> None:
        self.blocks: list[str] = []
        self.first_heading: str | None = None

    def heading(self, level: int, title: str) -> None:
        title = _collapse(title)
        if not title:
            return
        if self.first_heading is None:
            self.first_heading = title
        self.blocks.append("#" * max(1, min(level, 6)) + " " + title)

    def paragraph(self, text: str) -> None:
        lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
        lines = ["\\" + line if _MARKDOWN_STRUCTURE.match(line) else line for line in lines]
        block = "\n".join(lines).strip("\n")
        if block.strip():
            self.blocks.append(block.replace("\f", " ").replace("\x00", ""))

    def rows(self, rows) -> None:
        """A table: one line per non-empty row, cells joined by " | "."""
        lines = []
        for row in rows:
            cells = [_collapse(c) for c in row]
            while cells and not cells[-1]:
                cells.pop()
            if any(cells):
                lines.append(" | ".join(cells))
        if lines:
            self.paragraph("\n".join(lines))

    def text(self) -> str:
        return "\n\n".join(self.blocks)


def _open_zip(data: bytes, what: str) -> zipfile.ZipFile:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = archive.infolist()
        unpacked = sum(info.file_size for info in members)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError):
        raise Skipped(f"unreadable {what}") from None
    if unpacked > MAX_UNPACKED_BYTES:
        archive.close()
        raise Skipped("too large")  # a zip bomb, or simply a huge document
    if len(members) > MAX_MEMBERS:
        archive.close()
        raise _over(MAX_MEMBERS, "members")
    return archive


def _extract_packaged(extractor: str, data: bytes) -> Extracted:
    archive = _open_zip(data, extractor)
    try:
        version = _format_version(extractor)
    except ImportError:
        archive.close()
        raise Skipped(f"{extractor} support not installed") from None
    budget = _Budget()
    try:
        if extractor in ("docx", "pptx"):
            # Their libraries parse whichever parts they choose, whole: every member is
            # counted first, streamed, so a part that inflates stops at the budget unparsed.
            for info in archive.infolist():
                _scan_member(archive, info, budget)
        outline, title = _PACKAGED_READERS[extractor](data, archive, budget)
    except Skipped:
        raise
    except Exception as exc:  # malformed packages surface as almost any exception type
        _reraise_memory(exc)
        raise Skipped(f"unreadable {extractor}") from None
    finally:
        archive.close()
    text = outline.text()
    if len(text) > MAX_TEXT_CHARS:
        raise _over(MAX_TEXT_CHARS, "characters of text")
    if not text.strip():
        raise Skipped("empty")
    if title is None and extractor in ("docx", "odt"):
        title = outline.first_heading  # a slide or sheet label is no title for the file
    return Extracted(text, title, "markdown", extractor, version)


def _reraise_memory(exc: Exception) -> None:
    """Out of memory is not a malformed file: it is raised as such, so that the child's memory
    limit is named. libxml2 (lxml, under python-docx and python-pptx) reports a failed
    allocation as a parse error whose code says so (ERR_NO_MEMORY)."""
    if isinstance(exc, MemoryError):
        raise MemoryError() from None
    if type(exc).__module__.startswith("lxml") and getattr(exc, "code", None) == _LXML_NO_MEMORY:
        raise MemoryError() from None


_LXML_NO_MEMORY = 2  # lxml.etree.ErrorTypes.ERR_NO_MEMORY


# Decompressed bytes fed to expat at a time; the budget is checked between feeds.
_SCAN_BYTES = 64 * 1024


def _scan_member(archive, info, budget: _Budget, html: bool = False,
                 forbid_entities: bool = False) -> None:
    """Stream one member through expat, counting its elements and character data (entities
    expanded) against ``budget``, without building anything. Where the bytes stop being XML
    (a picture, a malformed part) the count stops, as an XML parser would; an HTML chapter
    (``html``) counts its remaining bytes as text instead, since the HTML extractor reads on
    and gives at most a character per byte. External entities are never fetched."""
    parser = expat.ParserCreate()
    parser.buffer_text = True
    counts = [0, 0]  # elements, characters

    def start(_name, _attrs):
        counts[0] += 1

    def text(data):
        counts[1] += len(data)

    parser.StartElementHandler = start
    parser.CharacterDataHandler = text
    if forbid_entities:
        parser.EntityDeclHandler = _forbid_entities
    with archive.open(info) as member:
        read = 0
        while True:
            chunk = member.read(_SCAN_BYTES)
            read += len(chunk)
            try:
                parser.Parse(chunk, not chunk)
            except expat.ExpatError:
                if html:
                    counts[1] += info.file_size - read
                chunk = b""
            budget.add_elements(counts[0])
            budget.add_text(counts[1])
            counts[0] = counts[1] = 0
            if not chunk:
                return


def _cell_text(value) -> str:
    """A spreadsheet value as text, the same way every time."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)
    if isinstance(value, datetime.datetime) and value.time() == datetime.time(0):
        return value.date().isoformat()  # a date cell: Excel stores dates as midnight datetimes
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    return str(value)


def _read_docx(data: bytes, archive, budget: _Budget) -> tuple[_Outline, str | None]:
    import docx
    from docx.table import Table

    document = docx.Document(io.BytesIO(data))
    out = _Outline()
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


def _read_pptx(data: bytes, archive, budget: _Budget) -> tuple[_Outline, str | None]:
    import pptx

    presentation = pptx.Presentation(io.BytesIO(data))
    out = _Outline()
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


def _pptx_shape(shape, out: _Outline) -> None:
    from pptx.shapes.group import GroupShape

    if isinstance(shape, GroupShape):
        for inner in shape.shapes:  # a group: its shapes in document order
            _pptx_shape(inner, out)
        return
    if getattr(shape, "has_table", False) and shape.has_table:
        out.rows([cell.text for cell in row.cells] for row in shape.table.rows)
    elif getattr(shape, "has_text_frame", False) and shape.has_text_frame:
        out.paragraph("\n".join(p.text if hasattr(p, "text") else "" for p in shape.text_frame.paragraphs))


# Spreadsheets are streamed here rather than read with openpyxl's read-only mode, which pads
# every row to its last cell's column (a row holding one cell in column XFD became 16,384
# values) and holds the shared strings whole. The values are what openpyxl 3.1's reader made
# of the same XML (its date and number-format rules are used as they are), so the text is as
# before and the extractor keeps its version (tests/test_extract_budget.py compares the two).
_XL_MAIN = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_XL_REL_ID = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}id"
_XL_ROW = f"{_XL_MAIN} row"
_XL_VALUE = f"{_XL_MAIN} v"
_XL_INLINE = f"{_XL_MAIN} is"
_XL_STRING = f"{_XL_MAIN} si"
_XL_WORKBOOK_TYPES = (  # as openpyxl looks for the workbook part, in this order
    "application/vnd.ms-excel.template.macroEnabled.main+xml",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.template.main+xml",
    "application/vnd.ms-excel.sheet.macroEnabled.main+xml",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml",
)
_XL_STRINGS_TYPE = "application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"


def _local(tag: str) -> str:
    """An element's name without its namespace (ElementTree's ``{ns}name``, expat's ``ns name``)."""
    return tag.rpartition("}")[2].rpartition(" ")[2]


class _EntitiesForbidden(ValueError):
    """A spreadsheet part declares entities: openpyxl refused those (through defusedxml)."""


def _forbid_entities(*_args):
    raise _EntitiesForbidden()


class _RichText:
    """What openpyxl's ``Text.content`` makes of an ``<si>`` or ``<is>``: the text of its last
    ``<t>`` child, then of each ``<r>`` run's last ``<t>`` (children matched by local name)."""

    __slots__ = ("plain", "runs")

    def __init__(self) -> None:
        self.plain: str | None = None
        self.runs: list = []

    def content(self) -> str:
        parts = [self.plain] if self.plain is not None else []
        return "".join(parts + [t for t in self.runs if t is not None])


class _XMLStream:
    """One member fed to expat in pieces, its elements counted against the budget. The text
    of an element before its first child (ElementTree's ``.text``) is gathered on request."""

    def __init__(self, budget: _Budget):
        self.budget = budget
        self.depth = 0
        self.elements = 0
        self.gathering = False
        self.gather_depth = 0
        self.parts: list[str] = []

    def run(self, archive, name: str) -> None:
        parser = expat.ParserCreate(namespace_separator=" ")
        parser.buffer_text = True
        parser.EntityDeclHandler = _forbid_entities
        parser.StartElementHandler = self._start
        parser.EndElementHandler = self._end
        parser.CharacterDataHandler = self._text
        with archive.open(name) as member:
            while True:
                chunk = member.read(_SCAN_BYTES)
                parser.Parse(chunk, not chunk)
                self.budget.add_elements(self.elements)
                self.elements = 0
                self.checkpoint()
                if not chunk:
                    return

    def gather(self) -> None:
        self.gathering, self.gather_depth, self.parts = True, self.depth, []

    def _start(self, name, attrs):
        self.depth += 1
        self.elements += 1
        self.gathering = False  # a child: the text gathered is what came before it
        self.start(name, attrs)

    def _end(self, name):
        self.gathering = False
        self.end(name)
        self.depth -= 1

    def _text(self, data):
        if self.gathering:
            self.parts.append(data)

    def gathered(self) -> str | None:
        """At the end of the element ``gather`` was called in: its text, or None."""
        return "".join(self.parts) if self.parts else None

    def checkpoint(self) -> None:
        """Between pieces: where a subclass checks what it has built against the budget."""

    def rich_start(self, rich: _RichText, base: int, name) -> None:
        """An element inside an ``<si>``/``<is>`` at depth ``base``."""
        level = self.depth - base
        if level == 1:
            local = _local(name)
            if local == "t":
                self.rich_target = 0
                self.gather()
            elif local == "r":
                rich.runs.append(None)
                self.in_run = True
        elif level == 2 and self.in_run and _local(name) == "t":
            self.rich_target = 1
            self.gather()

    def rich_end(self, rich: _RichText, base: int) -> None:
        level = self.depth - base
        if self.rich_target is not None and self.depth == self.gather_depth:
            if self.rich_target == 0:
                rich.plain = self.gathered()
            else:
                rich.runs[-1] = self.gathered()
            self.rich_target = None
        if level == 1:
            self.in_run = False

    in_run = False
    rich_target = None


class _SharedStrings(_XMLStream):
    """xl/sharedStrings.xml as openpyxl's ``read_string_table`` read it, counted as text."""

    def __init__(self, budget: _Budget):
        super().__init__(budget)
        self.strings: list[str] = []
        self.base = 0
        self.rich: _RichText | None = None
        self.chars = 0

    def start(self, name, attrs):
        if self.rich is not None:
            self.rich_start(self.rich, self.base, name)
        elif name == _XL_STRING:
            self.base, self.rich = self.depth, _RichText()

    def end(self, name):
        if self.rich is None:
            return
        if self.depth == self.base:
            text = self.rich.content().replace("x005F_", "")
            self.strings.append(text)
            self.chars += len(text)
            self.rich = None
        else:
            self.rich_end(self.rich, self.base)

    def checkpoint(self) -> None:
        # The table on its own may hold as much text as a file's text may be.
        if self.chars > MAX_TEXT_CHARS:
            raise _over(MAX_TEXT_CHARS, "characters of text")


class _Sheet(_XMLStream):
    """One worksheet's rows, as openpyxl's read-only ``iter_rows(values_only=True)`` gave them
    with its dimensions reset, but without padding: a row is its cells, a line of text is
    built from them directly, and every cell, row and character is counted as it comes."""

    def __init__(self, budget: _Budget, strings, date_styles, timedelta_styles, epoch):
        from openpyxl.utils.cell import coordinate_to_tuple
        from openpyxl.utils.datetime import from_excel, from_ISO8601

        super().__init__(budget)
        self.coordinate_to_tuple = coordinate_to_tuple
        self.from_excel, self.from_ISO8601 = from_excel, from_ISO8601
        self.strings = strings
        self.date_styles = date_styles
        self.timedelta_styles = timedelta_styles
        self.epoch = epoch
        self.lines: list[str] = []
        self.row_depth = 0
        self.row_attrs = None
        self.cells: list = []  # [attrs, value text, value seen, _RichText or None]
        self.in_inline = False
        self.row_counter = 0  # openpyxl's WorkSheetParser.row_counter
        self.next_row = 1  # openpyxl's _cells_by_row counter: rows before it are dropped

    def start(self, name, attrs):
        if not self.row_depth:
            if name == _XL_ROW:
                self.row_depth, self.row_attrs, self.cells = self.depth, attrs, []
            return
        level = self.depth - self.row_depth
        if level == 1:  # every child of a row is a cell to openpyxl
            self.cells.append([attrs, None, False, None])
        elif level == 2:
            cell = self.cells[-1]
            if name == _XL_VALUE and not cell[2]:
                cell[2] = True
                self.value_cell = cell
                self.gather()
            elif name == _XL_INLINE and cell[3] is None:
                cell[3] = _RichText()
                self.in_inline = True
        elif self.in_inline:
            self.rich_start(self.cells[-1][3], self.row_depth + 2, name)

    def end(self, name):
        if not self.row_depth:
            return
        level = self.depth - self.row_depth
        if level == 0:
            self.row_depth = 0
            self._row()
        elif level == 2:
            if self.value_cell is not None and self.depth == self.gather_depth:
                self.value_cell[1] = self.gathered()
                self.value_cell = None
            self.in_inline = False
        elif self.in_inline:
            self.rich_end(self.cells[-1][3], self.row_depth + 2)

    value_cell = None

    def _row(self) -> None:
        coordinate_to_tuple = self.coordinate_to_tuple
        budget = self.budget
        budget.add_row()
        budget.add_cells(len(self.cells))
        number = self.row_attrs.get("r")
        if number is not None:
            try:
                self.row_counter = int(number)
            except ValueError:
                value = float(number)
                if not value.is_integer():
                    raise ValueError("not a row number") from None
                self.row_counter = int(value)
        else:
            self.row_counter += 1
        column = 0
        values: dict[int, object] = {}
        for attrs, text, _seen, rich in self.cells:
            coordinate = attrs.get("r")
            if coordinate:
                column = coordinate_to_tuple(coordinate)[1]
            else:
                column += 1
            values[column] = self._value(attrs, text, rich)
        self.cells = []
        if self.row_counter > self.next_row:
            self.next_row = self.row_counter  # missing rows are empty: no text
        if self.row_counter < self.next_row:
            return  # a row out of order: openpyxl's reader skipped it
        self.next_row += 1
        if not values:
            return
        last = column  # the row's last cell bounds it, as openpyxl's _get_row did
        line, previous = [], 1
        for col in sorted(values):
            value = values[col]
            if value is None or not 1 <= col <= last:
                continue
            text = _collapse(_cell_text(value))
            if text:
                line.append(" | " * (col - previous))
                line.append(text)
                previous = col
        if line:
            text = "".join(line)
            budget.add_text(len(text) + 1)
            self.lines.append(text)

    def _value(self, attrs, text, rich):
        """A cell's value as openpyxl's WorkSheetParser.parse_cell made it (data_only)."""
        data_type = attrs.get("t", "n")
        if data_type == "inlineStr":
            return rich.content() if rich is not None else None
        value = text or None
        if value is None:
            return None
        if data_type == "n":
            value = float(value) if ("." in value or "E" in value or "e" in value) else int(value)
            style = attrs.get("s", 0)
            if style:
                style = int(style)
            if style in self.date_styles:
                try:
                    return self.from_excel(value, self.epoch, timedelta=style in self.timedelta_styles)
                except (OverflowError, ValueError):
                    return "#VALUE!"
            return value
        if data_type == "s":
            return self.strings[int(value)]
        if data_type == "b":
            return bool(int(value))
        if data_type == "d":
            return self.from_ISO8601(value)
        return value  # "str", "e" and the rest: the text as written


def _xlsx_tree(archive, name: str, budget: _Budget):
    """A small part (manifest, workbook, relationships, styles, properties): counted, entities
    refused, then parsed."""
    try:
        info = archive.getinfo(name)
    except KeyError:
        return None
    _scan_member(archive, info, budget, forbid_entities=True)
    return ElementTree.fromstring(archive.read(info))


def _xlsx_relationships(archive, part: str, budget: _Budget) -> dict[str, tuple[str, str]]:
    """Id -> (target path in the package, type), resolved as openpyxl's get_dependents did."""
    folder, name = posixpath.split(part)
    tree = _xlsx_tree(archive, posixpath.join(folder, "_rels", f"{name}.rels"), budget)
    rels: dict[str, tuple[str, str]] = {}
    parent = posixpath.split(folder)[0]
    for rel in (tree if tree is not None else ()):
        if _local(rel.tag) != "Relationship":
            continue
        target = rel.get("Target") or ""
        if rel.get("TargetMode") != "External":
            target = target[1:] if target.startswith("/") else posixpath.normpath(
                posixpath.join(parent, target))
        rels.setdefault(rel.get("Id"), (target, rel.get("Type") or ""))
    return rels


def _xlsx_date_styles(archive, budget: _Budget) -> tuple[set, set]:
    """The cell style indexes whose number format is a date, and a duration (openpyxl's rules)."""
    from openpyxl.styles.numbers import builtin_format_code, is_date_format, is_timedelta_format

    tree = _xlsx_tree(archive, "xl/styles.xml", budget)
    custom: dict[int, str] = {}
    formats: list[int] = []
    for child in (tree if tree is not None else ()):
        local = _local(child.tag)
        if local == "numFmts":
            custom = {int(n.get("numFmtId")): n.get("formatCode") for n in child
                      if _local(n.tag) == "numFmt"}
        elif local == "cellXfs":
            formats = [int(xf.get("numFmtId", 0)) for xf in child if _local(xf.tag) == "xf"]
    dates, durations = set(), set()
    for index, number in enumerate(formats):
        code = custom[number] if number in custom else builtin_format_code(number)
        if is_date_format(code):
            dates.add(index)
        if is_timedelta_format(code):
            durations.add(index)
    return dates, durations


def _read_xlsx(data: bytes, archive, budget: _Budget) -> tuple[_Outline, str | None]:
    from openpyxl.utils.datetime import CALENDAR_MAC_1904, WINDOWS_EPOCH

    manifest = _xlsx_tree(archive, "[Content_Types].xml", budget)
    overrides = [(o.get("PartName") or "", o.get("ContentType")) for o in manifest
                 if _local(o.tag) == "Override"]
    defaults = {d.get("ContentType") for d in manifest if _local(d.tag) == "Default"}
    part = next((name[1:] for kind in _XL_WORKBOOK_TYPES for name, t in overrides if t == kind),
                None)
    if part is None:
        if not defaults & set(_XL_WORKBOOK_TYPES):
            raise Skipped("unreadable xlsx")
        part = "xl/workbook.xml"
    workbook = _xlsx_tree(archive, part, budget)
    if workbook is None:
        raise Skipped("unreadable xlsx")
    rels = _xlsx_relationships(archive, part, budget)
    epoch = WINDOWS_EPOCH
    sheets = []
    for child in workbook:
        local = _local(child.tag)
        if local == "workbookPr" and child.get("date1904") not in (None, "", "false", "f", "0"):
            epoch = CALENDAR_MAC_1904
        elif local == "sheets":
            sheets = [(s.get("name"), s.get(_XL_REL_ID)) for s in child if _local(s.tag) == "sheet"]
    strings_part = next((name[1:] for name, t in overrides if t == _XL_STRINGS_TYPE), None)
    strings = _SharedStrings(budget)
    if strings_part is not None:
        strings.run(archive, strings_part)
    dates, durations = _xlsx_date_styles(archive, budget)
    members = set(archive.namelist())
    out = _Outline()
    for title, rel_id in sheets:
        if not rel_id:
            continue  # openpyxl dropped a sheet without a relationship, with a warning
        target, kind = rels[rel_id]
        if target not in members or "chartsheet" in kind:
            continue
        sheet = _Sheet(budget, strings.strings, dates, durations, epoch)
        sheet.run(archive, target)
        if sheet.lines:
            out.heading(1, f'Sheet "{title}"')
            out.paragraph("\n".join(sheet.lines))
    title = None
    if "docProps/core.xml" in members:
        core = _xlsx_tree(archive, "docProps/core.xml", budget)
        for node in core:  # by local name, the last one, as openpyxl's properties reader did
            if _local(node.tag) == "title":
                title = node.text
    return out, (title or None)


_ODF_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
_ODF_TABLE = "urn:oasis:names:tc:opendocument:xmlns:table:1.0"
_ODF_OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
_DC = "http://purl.org/dc/elements/1.1/"


def _q(ns: str, tag: str) -> str:
    return f"{{{ns}}}{tag}"


def _read_xml(archive, name: str, budget: _Budget):
    """Parse one member, counted against ``budget`` first (expat resolves no external entities
    and caps entity expansion)."""
    try:
        info = archive.getinfo(name)
    except KeyError:
        return None
    _scan_member(archive, info, budget)
    return ElementTree.fromstring(archive.read(info))


def _read_odt(data: bytes, archive, budget: _Budget) -> tuple[_Outline, str | None]:
    content = _read_xml(archive, "content.xml", budget)
    if content is None:
        raise Skipped("unreadable odt")
    out = _Outline()
    body = content.find(f"{_q(_ODF_OFFICE, 'body')}/{_q(_ODF_OFFICE, 'text')}")
    if body is not None:
        _odt_blocks(body, out)
    title = None
    meta = _read_xml(archive, "meta.xml", budget)
    if meta is not None:
        node = meta.find(f".//{_q(_DC, 'title')}")
        if node is not None and node.text and node.text.strip():
            title = _collapse(node.text)
    return out, title


def _odt_blocks(parent, out: _Outline) -> None:
    for child in parent:
        tag = child.tag
        if tag == _q(_ODF_TEXT, "h"):
            level = child.get(_q(_ODF_TEXT, "outline-level"), "1")
            out.heading(int(level) if level.isdigit() else 1, _odt_inline(child))
        elif tag == _q(_ODF_TEXT, "p"):
            out.paragraph(_odt_inline(child))
        elif tag == _q(_ODF_TABLE, "table"):
            out.rows(
                [_odt_cell(cell) for cell in row.iter()
                 if cell.tag == _q(_ODF_TABLE, "table-cell")]
                for row in child.iter(_q(_ODF_TABLE, "table-row"))
            )
        elif tag in (_q(_ODF_TEXT, "list"), _q(_ODF_TEXT, "list-item"), _q(_ODF_TEXT, "section"),
                     _q(_ODF_TEXT, "list-header")):
            _odt_blocks(child, out)


def _odt_cell(cell) -> str:
    return " ".join(_odt_inline(p) for p in cell.iter(_q(_ODF_TEXT, "p")))


def _odt_inline(node) -> str:
    parts: list[str] = []

    def walk(el):
        if el.text:
            parts.append(el.text)
        for child in el:
            tag = child.tag
            if tag == _q(_ODF_TEXT, "s"):
                count = child.get(_q(_ODF_TEXT, "c"), "1")
                parts.append(" " * min(int(count) if count.isdigit() else 1, 1000))
            elif tag == _q(_ODF_TEXT, "tab"):
                parts.append("\t")
            elif tag == _q(_ODF_TEXT, "line-break"):
                parts.append("\n")
            elif tag in (_q(_ODF_TEXT, "note"), _q(_ODF_OFFICE, "annotation")):
                pass  # footnotes and comments are not the running text
            else:
                walk(child)
            if child.tail:
                parts.append(child.tail)

    walk(node)
    return "".join(parts)


_OPF = "http://www.idpf.org/2007/opf"
_CONTAINER = "urn:oasis:names:tc:opendocument:xmlns:container"
_XHTML_TYPES = {"application/xhtml+xml", "text/html"}


def _read_epub(data: bytes, archive, budget: _Budget) -> tuple[_Outline, str | None]:
    container = _read_xml(archive, "META-INF/container.xml", budget)
    rootfile = container.find(f".//{_q(_CONTAINER, 'rootfile')}") if container is not None else None
    opf_path = rootfile.get("full-path") if rootfile is not None else None
    package = _read_xml(archive, opf_path, budget) if opf_path else None
    if package is None:
        raise Skipped("unreadable epub")
    opf_dir = posixpath.dirname(opf_path)
    items = {
        item.get("id"): (item.get("href") or "", item.get("media-type") or "")
        for item in package.iter(_q(_OPF, "item"))
    }
    out = _Outline()
    for number, ref in enumerate(package.iter(_q(_OPF, "itemref")), 1):
        href, media_type = items.get(ref.get("idref"), ("", ""))
        if media_type not in _XHTML_TYPES or not href:
            continue
        name = posixpath.normpath(posixpath.join(opf_dir, unquote(href.split("#", 1)[0])))
        try:
            info = archive.getinfo(name)
        except KeyError:
            continue  # a spine entry the package does not hold
        _scan_member(archive, info, budget, html=True)
        chapter = archive.read(info)
        try:
            text, chapter_title, _used = _extract_html(chapter, None)
        except Skipped:
            continue
        if not text.strip():
            continue
        heading = _collapse(chapter_title or f"Section {number}")
        first, _sep, rest = text.partition("\n\n")
        if _collapse(first) == heading:
            text = rest  # the chapter's own <h1> repeats its title
        out.heading(1, heading)
        out.paragraph(text)
    title_node = package.find(f".//{_q(_DC, 'title')}")
    title = _collapse(title_node.text) if title_node is not None and title_node.text else None
    return out, (title or None)


_PACKAGED_READERS = {
    "docx": _read_docx,
    "pptx": _read_pptx,
    "xlsx": _read_xlsx,
    "odt": _read_odt,
    "epub": _read_epub,
}
