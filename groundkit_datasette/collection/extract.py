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
import zipfile
from urllib.parse import unquote
from xml.etree import ElementTree
from bisect import bisect_right
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from .chunking import find_headings

__all__ = [
    "Extracted",
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
    return _extract(data, path.suffix, path.name, max_bytes, encoding)


def extract_bytes(
    data: bytes, suffix: str, *, max_bytes: int = MAX_FILE_BYTES, encoding: str | None = None
) -> Extracted:
    """Like extract_file, for content already in memory (``suffix`` as ".md").

    ``encoding`` (a codec name recorded at ingest) decodes text with that codec instead of
    choosing one, so a citation is checked against the text it was cut from.
    """
    return _extract(data, suffix, "", max_bytes, encoding)


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
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise Skipped("encrypted")
        pages = [(page.extract_text() or "") for page in reader.pages]
        title = _pdf_title(reader)
    except Skipped:
        raise
    except Exception:  # malformed PDFs surface as almost any exception type
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
        unpacked = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError):
        raise Skipped(f"unreadable {what}") from None
    if unpacked > MAX_UNPACKED_BYTES:
        raise Skipped("too large")  # a zip bomb, or simply a huge document
    return archive


def _extract_packaged(extractor: str, data: bytes) -> Extracted:
    archive = _open_zip(data, extractor)
    try:
        version = _format_version(extractor)
    except ImportError:
        raise Skipped(f"{extractor} support not installed") from None
    try:
        outline, title = _PACKAGED_READERS[extractor](data, archive)
    except Skipped:
        raise
    except Exception:  # malformed packages surface as almost any exception type
        raise Skipped(f"unreadable {extractor}") from None
    finally:
        archive.close()
    text = outline.text()
    if not text.strip():
        raise Skipped("empty")
    if title is None and extractor in ("docx", "odt"):
        title = outline.first_heading  # a slide or sheet label is no title for the file
    return Extracted(text, title, "markdown", extractor, version)


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


def _read_docx(data: bytes, archive) -> tuple[_Outline, str | None]:
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


def _read_pptx(data: bytes, archive) -> tuple[_Outline, str | None]:
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


def _read_xlsx(data: bytes, archive) -> tuple[_Outline, str | None]:
    import openpyxl

    # read_only streams rows; data_only takes each formula's cached value, as the user saw it.
    book = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    try:
        out = _Outline()
        for sheet in book.worksheets:
            sheet.reset_dimensions()  # do not trust the stored used-range
            rows = [[_cell_text(v) for v in row] for row in sheet.iter_rows(values_only=True)]
            if not any(any(c.strip() for c in row) for row in rows):
                continue
            out.heading(1, f'Sheet "{sheet.title}"')
            out.rows(rows)
        title = book.properties.title if book.properties is not None else None
        return out, (title or None)
    finally:
        book.close()


_ODF_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
_ODF_TABLE = "urn:oasis:names:tc:opendocument:xmlns:table:1.0"
_ODF_OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
_DC = "http://purl.org/dc/elements/1.1/"


def _q(ns: str, tag: str) -> str:
    return f"{{{ns}}}{tag}"


def _read_xml(archive, name: str):
    """Parse one member (expat resolves no external entities and caps entity expansion)."""
    try:
        raw = archive.read(name)
    except KeyError:
        return None
    return ElementTree.fromstring(raw)


def _read_odt(data: bytes, archive) -> tuple[_Outline, str | None]:
    content = _read_xml(archive, "content.xml")
    if content is None:
        raise Skipped("unreadable odt")
    out = _Outline()
    body = content.find(f"{_q(_ODF_OFFICE, 'body')}/{_q(_ODF_OFFICE, 'text')}")
    if body is not None:
        _odt_blocks(body, out)
    title = None
    meta = _read_xml(archive, "meta.xml")
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


def _read_epub(data: bytes, archive) -> tuple[_Outline, str | None]:
    container = _read_xml(archive, "META-INF/container.xml")
    rootfile = container.find(f".//{_q(_CONTAINER, 'rootfile')}") if container is not None else None
    opf_path = rootfile.get("full-path") if rootfile is not None else None
    package = _read_xml(archive, opf_path) if opf_path else None
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
            chapter = archive.read(name)
        except KeyError:
            continue  # a spine entry the package does not hold
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
