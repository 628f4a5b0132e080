"""What the extraction dispatcher (``indexing/extract.py``) and a format's extractor agree on.

An extractor is registered through the ``register_extractors`` hook as an :class:`Extractor`:
its name and version (recorded per document, compared when a citation is checked), the
suffixes and file names it claims, the source class its text is chunked as, and a function
``extract(data, *, encoding, budget) -> Extraction``. The dispatcher chooses the extractor,
applies the size limit, runs it (in an isolation worker when ``isolated``, adr/0050) and
stamps the document's identity; the function turns bytes into text and nothing else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

__all__ = ["Budget", "Exceeded", "Extracted", "Extraction", "Extractor", "Skipped",
           "SOURCE_CLASSES", "collapse", "over", "reraise_memory"]

# How the chunker reads a text (indexing/chunking.py): headings for "markdown" and "rst",
# page breaks for "pdf", code-sized sections for "code"; the rest is prose.
SOURCE_CLASSES = frozenset({"text", "markdown", "rst", "html", "pdf", "code"})


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


@dataclass(frozen=True)
class Extraction:
    """What an extractor function returns; the dispatcher adds the extractor's identity."""

    text: str
    title: str | None = None
    page_starts: tuple[int, ...] = ()
    encoding: str | None = None


@dataclass(frozen=True)
class Extractor:
    """One format as a plugin registers it (``register(Extractor(...))``).

    ``version`` is a string or a function returning one (ImportError: the library it names
    is missing); bump it whenever the text for any input changes, since a citation is only
    checked by the same name and version. ``isolated`` runs ``extract`` in an isolation
    worker (it must then be a top-level function of an importable module); ``imports`` are
    the modules that worker imports first, outside the call's memory limit.
    """

    name: str
    version: str | Callable[[], str]
    suffixes: tuple[str, ...]
    source_class: str
    extract: Callable[..., Extraction]
    file_names: tuple[str, ...] = ()
    isolated: bool = False
    imports: tuple[str, ...] = ()

    def current_version(self) -> str:
        return self.version() if callable(self.version) else self.version


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


def over(limit: int, what: str) -> Exceeded:
    return Exceeded(f"exceeds the extraction budget: {limit:,} {what}")


class Budget:
    """What one file may cost and has cost so far; ``Exceeded`` as soon as a count passes its
    bound. The dispatcher sets the bounds (extract.py, adr/0050); an extractor counts."""

    __slots__ = ("text", "cells", "rows", "elements", "max_text", "max_cells", "max_rows",
                 "max_elements", "max_members", "max_pages", "max_unpacked")

    def __init__(self, *, max_text: int, max_cells: int, max_rows: int, max_elements: int,
                 max_members: int, max_pages: int, max_unpacked: int) -> None:
        self.text = self.cells = self.rows = self.elements = 0
        self.max_text, self.max_cells, self.max_rows = max_text, max_cells, max_rows
        self.max_elements, self.max_members = max_elements, max_members
        self.max_pages, self.max_unpacked = max_pages, max_unpacked

    def add_text(self, n: int) -> None:
        self.text += n
        if self.text > self.max_text:
            raise over(self.max_text, "characters of text")

    def add_cells(self, n: int) -> None:
        self.cells += n
        if self.cells > self.max_cells:
            raise over(self.max_cells, "cells")

    def add_row(self) -> None:
        self.rows += 1
        if self.rows > self.max_rows:
            raise over(self.max_rows, "rows")

    def add_elements(self, n: int) -> None:
        self.elements += n
        if self.elements > self.max_elements:
            raise over(self.max_elements, "XML elements")


def reraise_memory(exc: Exception) -> None:
    """Out of memory is not a malformed file: it is raised as such, so that the child's memory
    limit is named. libxml2 (lxml, under python-docx and python-pptx) reports a failed
    allocation as a parse error whose code says so (ERR_NO_MEMORY)."""
    if isinstance(exc, MemoryError):
        raise MemoryError() from None
    if type(exc).__module__.startswith("lxml") and getattr(exc, "code", None) == _LXML_NO_MEMORY:
        raise MemoryError() from None


_LXML_NO_MEMORY = 2  # lxml.etree.ErrorTypes.ERR_NO_MEMORY
_SPACE_RUN = re.compile(r"\s+")


def collapse(s: str) -> str:
    """Whitespace runs as one space, ends trimmed."""
    return _SPACE_RUN.sub(" ", s).strip()
