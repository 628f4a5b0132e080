"""Turn a file into text, deterministically: the dispatcher in front of the format extractors.

Citation verification re-extracts the source and compares offsets, so the same bytes must
always yield the same text, and the extractor's name and version are recorded per document:
a citation is only checked by the same code.

A format is a plugin (adr/0057): every extractor, the built-in ones included (``formats/``),
is an ``Extractor`` registered through the ``register_extractors`` hook, claiming suffixes
(and whole file names, such as ``Makefile``). This module chooses one for a file, applies
the size limit and the budgets, runs it (PDFs and packages in an isolation worker, adr/0050)
and records its identity. A file no extractor claims is read as plain text unless its suffix
is a known binary format. Two plugins claiming one suffix, or a plugin claiming a built-in's
suffix, is an ``ExtractorConflict``, never a silent replacement.
"""

from __future__ import annotations

import importlib
import io
import sys
import time
from bisect import bisect_right
from pathlib import Path

from ..errors import InvalidRequest
from . import isolation
from .formats.base import (SOURCE_CLASSES, Budget, Exceeded, Extracted, Extraction, Extractor,
                           Skipped)
from .formats.html_text import HTML_EXTRACTOR_VERSION
from .formats.office import DOCX, PPTX
from .formats.packages import FORMAT_EXTRACTOR_VERSION
from .formats.pdf import NO_TEXT_LAYER, PDF, PDF_PAGE_SEPARATOR
from .formats.spreadsheet import XLSX
from .formats.text import PLAIN, TEXT_EXTRACTOR_VERSION

__all__ = [
    "Exceeded",
    "Extracted",
    "Extraction",
    "ExtractionBusy",
    "Extractor",
    "ExtractorConflict",
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
    "extractor_for",
    "page_for_offset",
    "source_class_for",
]

MAX_FILE_BYTES = 64 * 1024 * 1024
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

# Known binary formats: refused without sniffing, unless an extractor claims the suffix.
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


class ExtractorConflict(InvalidRequest):
    """Two extractors claim one suffix or file name, or two plugins one extractor name: a
    plugin never replaces a built-in (or another plugin) silently. An ingest refuses to start
    (``check_extractors``), so the user reads the conflict once, not one failure per file."""


class ExtractionBusy(Exception):
    """Serving: SERVE_EXTRACTIONS files are being extracted and enough callers wait already."""


_SERVE_SLOTS = isolation.Slots(SERVE_EXTRACTIONS, SERVE_EXTRACTIONS_WAITING)


def _budget() -> Budget:
    """A fresh budget with this module's bounds (read per file, so a test may lower them)."""
    return Budget(max_text=MAX_TEXT_CHARS, max_cells=MAX_CELLS, max_rows=MAX_ROWS,
                  max_elements=MAX_XML_ELEMENTS, max_members=MAX_MEMBERS,
                  max_pages=MAX_PDF_PAGES, max_unpacked=MAX_UNPACKED_BYTES)


# -- The registered extractors ---------------------------------------------------------------


class _Table:
    """Every registered extractor by suffix, file name and extractor name."""

    def __init__(self) -> None:
        self.by_suffix: dict[str, Extractor] = {}
        self.by_file_name: dict[str, Extractor] = {}
        self.by_name: dict[str, tuple[Extractor, object]] = {}

    def add(self, extractor, owner) -> None:
        if not isinstance(extractor, Extractor):
            raise TypeError("register_extractors: register() takes an Extractor")
        if extractor.source_class not in SOURCE_CLASSES:
            raise ValueError(f"extractor {extractor.name!r}: source class must be one of "
                             f"{', '.join(sorted(SOURCE_CLASSES))}")
        if extractor.isolated:
            _check_importable(extractor)
        known = self.by_name.get(extractor.name)
        if known is not None and known[1] is not owner:
            raise ExtractorConflict(f"two plugins register an extractor named {extractor.name!r}")
        self.by_name.setdefault(extractor.name, (extractor, owner))
        for claims, keys, what in ((self.by_suffix, extractor.suffixes, "suffix"),
                                   (self.by_file_name, extractor.file_names, "file name")):
            for key in keys:
                key = _norm_suffix(key) if what == "suffix" else key.lower()
                other = claims.get(key)
                if other is not None and other is not extractor:
                    raise ExtractorConflict(f"extractors {other.name!r} and {extractor.name!r} "
                                            f"both claim the {what} {key!r}")
                claims[key] = extractor


def _check_importable(extractor: Extractor) -> None:
    """An isolated extractor is called in a worker by module and name (isolation's rule)."""
    for fn in (extractor.extract, extractor.version):
        if isinstance(fn, str):
            continue
        module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
        if (not module or module == "__main__" or not name.isidentifier()
                or getattr(sys.modules.get(module), name, None) is not fn):
            raise TypeError(f"isolated extractor {extractor.name!r}: its functions must be "
                            "defined at the top of an importable module")


_table_cache: tuple[tuple, _Table] | None = None


def _table() -> _Table:
    """The registered extractors, asked again only when the hook's implementations change (a
    plugin registered or removed since), as ``modes.registered_modes`` does."""
    from ..registry import _load_builtins, add_builtins, pm
    from .formats import builtin

    global _table_cache
    known = _table_cache
    if known is not None and known[0] == tuple(pm.hook.register_extractors.get_hookimpls()):
        return known[1]
    add_builtins(builtin)
    _load_builtins()
    impls = tuple(pm.hook.register_extractors.get_hookimpls())
    table = _Table()
    # The built-ins first, then plugins in registration order: a conflict names the built-in
    # first however the plugin was loaded.
    for impl in sorted(impls, key=lambda impl: impl.plugin is not builtin):
        impl.function(register=lambda extractor, _owner=impl: table.add(extractor, _owner))
    _table_cache = (impls, table)
    return table


def check_extractors() -> None:
    """Raise ``ExtractorConflict`` if the installed extractors disagree."""
    _table()


def extractor_for(suffix: str, name: str = "") -> Extractor | None:
    """The extractor a file gets: by its whole name, else its suffix, else plain text; None if
    it is refused (a known binary suffix no extractor claims)."""
    table = _table()
    found = table.by_file_name.get(name.lower()) if name else None
    if found is None:
        suffix = _norm_suffix(suffix)
        found = table.by_suffix.get(suffix)
        if found is None and suffix not in _UNSUPPORTED:
            return PLAIN  # includes no suffix and unknown suffixes that decode
    return found


def source_class_for(suffix: str, name: str = "") -> str | None:
    """The source class a file would get, or None if it is refused."""
    extractor = extractor_for(suffix, name)
    return extractor.source_class if extractor is not None else None


def extractor_available(extractor: str, version: str) -> bool:
    """Whether this process re-extracts exactly as ``extractor``/``version`` did."""
    found = _table().by_name.get(extractor)
    if found is None:
        return False
    try:
        return version == found[0].current_version()
    except ImportError:
        return False


# -- Extraction ------------------------------------------------------------------------------


def extract_file(path: Path, *, max_bytes: int = MAX_FILE_BYTES,
                 encoding: str | None = None) -> Extracted:
    path = Path(path)
    extractor = extractor_for(path.suffix, path.name)
    if extractor is None:
        raise Skipped("unsupported type")
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise Skipped("too large")
        data = path.read_bytes()
    except OSError:
        raise Skipped("unreadable") from None
    if _isolate(extractor):
        return _extract_isolated(extractor, data, max_bytes, encoding, serving=False)
    return _run(extractor, data, max_bytes, encoding)


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
    extractor = extractor_for(suffix)
    if extractor is not None and _isolate(extractor):
        return _extract_isolated(extractor, data, max_bytes, encoding, serving=serving,
                                 seconds=seconds)
    return _extract(data, suffix, "", max_bytes, encoding)


def _extract(data: bytes, suffix: str, name: str, max_bytes: int,
             encoding: str | None = None) -> Extracted:
    """In this process, whatever the format."""
    extractor = extractor_for(suffix, name)
    if extractor is None:
        raise Skipped("unsupported type")
    return _run(extractor, data, max_bytes, encoding)


def _run(extractor: Extractor, data: bytes, max_bytes: int, encoding: str | None) -> Extracted:
    extraction = _call(extractor.extract, data, max_bytes, encoding)
    return _stamped(extractor, extraction, extractor.current_version())


def _call(fn, data: bytes, max_bytes: int, encoding: str | None) -> Extraction:
    if len(data) > max_bytes:
        raise Skipped("too large")
    extraction = fn(data, encoding=encoding, budget=_budget())
    if not isinstance(extraction, Extraction):
        raise TypeError(f"an extractor returned {type(extraction).__name__}, not an Extraction")
    if not extraction.text.strip():
        raise Skipped("empty")
    return extraction


def _stamped(extractor: Extractor, e: Extraction, version: str) -> Extracted:
    return Extracted(e.text, e.title, extractor.source_class, extractor.name, version,
                     tuple(e.page_starts), e.encoding)


def _isolate(extractor: Extractor) -> bool:
    return extractor.isolated and not isolation.in_child()  # in a child already: parse here


def _extract_isolated(extractor: Extractor, data: bytes, max_bytes: int, encoding: str | None,
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
    fn, version = extractor.extract, extractor.version
    try:
        plain = isolation.run_in_worker(
            _extract_plain, _ref(fn), None if isinstance(version, str) else _ref(version),
            data, max_bytes, encoding, timeout=seconds, memory_bytes=EXTRACT_MEMORY_BYTES,
            passthrough=(Exceeded, Skipped), imports=(*extractor.imports, fn.__module__))
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
        extraction, child_version = _from_plain(plain)
        return _stamped(extractor, extraction,
                        version if isinstance(version, str) else child_version)
    except (TypeError, ValueError, KeyError):  # a child the file compromised, or a defect
        raise Skipped("extraction crashed") from None


def _ref(fn) -> list[str]:
    return [fn.__module__, fn.__qualname__]


def _extract_plain(fn_ref: list, version_ref: list | None, data: bytes, max_bytes: int,
                   encoding: str | None) -> dict:
    """In the child: the extraction and the version of the library that made it (the parent
    need not import the library), as plain data (no pickle crosses back)."""
    def resolve(ref):
        return getattr(importlib.import_module(ref[0]), ref[1])

    e = _call(resolve(fn_ref), data, max_bytes, encoding)
    return {"text": e.text, "title": e.title, "page_starts": list(e.page_starts),
            "encoding": e.encoding,
            "version": resolve(version_ref)() if version_ref is not None else None}


def _from_plain(plain) -> tuple[Extraction, str | None]:
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
    return (Extraction(body, text(plain["title"], True), tuple(starts),
                       text(plain["encoding"], True)), text(plain["version"], True))


def warm_up() -> None:
    """Extract a small file of every isolated built-in format, once, where calls will run (a
    worker, the fork server): the libraries' lazy imports, compiled patterns and caches are
    then ready for every call (or inherited by every child) instead of being built by the
    first. Built-ins only: the fork server never loads plugins for this."""
    samples = [(PDF, _warm_pdf())]
    try:
        import docx

        document = docx.Document()
        document.add_heading("Warm", level=1)
        document.add_paragraph("up")
        document.add_table(rows=1, cols=2).cell(0, 0).text = "cell"
        samples.append((DOCX, _saved(document.save)))
    except Exception:
        pass
    try:
        import pptx

        deck = pptx.Presentation()
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = "Warm"
        slide.placeholders[1].text = "up"
        samples.append((PPTX, _saved(deck.save)))
    except Exception:
        pass
    try:
        import openpyxl

        book = openpyxl.Workbook()
        book.active.append(["warm", 1, 2.5])
        samples.append((XLSX, _saved(book.save)))
    except Exception:
        pass
    for extractor, data in samples:
        try:
            _run(extractor, data, MAX_FILE_BYTES, None)
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
