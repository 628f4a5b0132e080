"""Turn a file into text, deterministically.

Citation verification re-extracts the source and compares offsets, so
the same bytes must always yield the same text, and text formats are
kept verbatim (no newline normalisation; only a BOM is removed).

Text that is not UTF-8 is decoded by a fixed rule, not guessed by a
detector: a BOM (UTF-8 or UTF-16), else UTF-8, else Windows-1252, else
Latin-1 (which decodes any bytes). The encoding used is returned with the
text and recorded per document, and verification decodes with the
recorded one (adr/0012-text-encodings.md).
"""

from __future__ import annotations

import codecs
import io
import re
from bisect import bisect_right
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from .chunking import find_headings

__all__ = [
    "Extracted",
    "Skipped",
    "HTML_EXTRACTOR_VERSION",
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
# Known binary formats: refused without sniffing.
_UNSUPPORTED = {
    ".png", ".jpg", ".jpeg", ".gif", ".bmp", ".ico", ".webp", ".tif",
    ".tiff", ".heic", ".psd", ".zip", ".gz", ".tgz", ".bz2", ".xz", ".zst",
    ".7z", ".rar", ".tar", ".exe", ".dll", ".so", ".dylib", ".o", ".a",
    ".lib", ".class", ".jar", ".pyc", ".pyo", ".whl", ".egg", ".doc",
    ".docx", ".xls", ".xlsx", ".ppt", ".pptx", ".odt", ".ods", ".odp",
    ".epub", ".mp3", ".mp4", ".m4a", ".wav", ".avi", ".mov", ".mkv",
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
    if source_class == "markdown":
        for h in find_headings(text, "markdown"):
            if h.level == 1 and h.title:
                return h.title
    elif source_class == "rst":
        for h in find_headings(text, "rst"):
            return h.title
    return None


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
        raise Skipped("empty")
    return Extracted(text, None, "pdf", "pypdf", pypdf.__version__, tuple(starts))
