"""What the zip-based document formats share (Office OOXML, OpenDocument, EPUB): the container
opened within its budget, members streamed through expat and counted before any library parses
them, and the Markdown-shaped outline their text is written as.

Their headings, slides (``# Slide 3``) and sheets (``# Sheet "Q3"``) become ATX headings, so
the chunker's heading paths name where a citation is, and a body line that would read as
Markdown structure is escaped with a backslash. Each records its own version and the library's,
so a citation is only checked by the same code (adr/0020-office-and-ebook-text.md).
"""

from __future__ import annotations

import io
import re
import zipfile
from typing import Callable
from xml.etree import ElementTree
from xml.parsers import expat

from .base import Budget, Extraction, Skipped, collapse, over, reraise_memory

__all__ = ["DC", "FORMAT_EXTRACTOR_VERSION", "Outline", "forbid_entities", "library_version",
           "packaged", "q", "read_xml", "scan_member", "SCAN_BYTES"]

# Bump whenever an Office/e-book extractor's output changes for any input (the library's own
# version is recorded beside it).
FORMAT_EXTRACTOR_VERSION = "1"
DC = "http://purl.org/dc/elements/1.1/"  # Dublin Core: ODF and EPUB titles
# Decompressed bytes fed to expat at a time; the budget is checked between feeds.
SCAN_BYTES = 64 * 1024


def library_version(module: str) -> str:
    """``<ours>/<library>-<its version>``; ImportError if the library is missing."""
    lib = __import__(module)
    return f"{FORMAT_EXTRACTOR_VERSION}/{module}-{lib.__version__}"


# A line that the Markdown heading finder would read as structure: an ATX marker, a fence,
# or a setext underline (which would also turn the line above it into a heading).
_MARKDOWN_STRUCTURE = re.compile(r" {0,3}(?:#|`{3}|~{3}|=+[ \t]*$|-+[ \t]*$)")


class Outline:
    """Blocks of Markdown-shaped text: headings and escaped paragraphs, blank-line separated."""

    def __init__(self) -> None:
        self.blocks: list[str] = []
        self.first_heading: str | None = None

    def heading(self, level: int, title: str) -> None:
        title = collapse(title)
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
            cells = [collapse(c) for c in row]
            while cells and not cells[-1]:
                cells.pop()
            if any(cells):
                lines.append(" | ".join(cells))
        if lines:
            self.paragraph("\n".join(lines))

    def text(self) -> str:
        return "\n\n".join(self.blocks)


def _open_zip(data: bytes, what: str, budget: Budget) -> zipfile.ZipFile:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = archive.infolist()
        unpacked = sum(info.file_size for info in members)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError):
        raise Skipped(f"unreadable {what}") from None
    if unpacked > budget.max_unpacked:
        archive.close()
        raise Skipped("too large")  # a zip bomb, or simply a huge document
    if len(members) > budget.max_members:
        archive.close()
        raise over(budget.max_members, "members")
    return archive


Reader = Callable[[bytes, zipfile.ZipFile, Budget], "tuple[Outline, str | None]"]


def packaged(data: bytes, budget: Budget, name: str, read: Reader, version: Callable[[], str],
             *, scan_first: bool = False, heading_title: bool = False) -> Extraction:
    """One package read by ``read(data, archive, budget)`` into an outline and a title.

    ``scan_first``: the library parses whichever parts it chooses, whole, so every member is
    counted first, streamed, and a part that inflates stops at the budget unparsed.
    ``heading_title``: without a title of its own the document is titled by its first heading
    (a slide or sheet label is no title for the file)."""
    archive = _open_zip(data, name, budget)
    try:
        version()
    except ImportError:
        archive.close()
        raise Skipped(f"{name} support not installed") from None
    try:
        if scan_first:
            for info in archive.infolist():
                scan_member(archive, info, budget)
        outline, title = read(data, archive, budget)
    except Skipped:
        raise
    except Exception as exc:  # malformed packages surface as almost any exception type
        reraise_memory(exc)
        raise Skipped(f"unreadable {name}") from None
    finally:
        archive.close()
    text = outline.text()
    if len(text) > budget.max_text:
        raise over(budget.max_text, "characters of text")
    if not text.strip():
        raise Skipped("empty")
    if title is None and heading_title:
        title = outline.first_heading
    return Extraction(text, title)


class EntitiesForbidden(ValueError):
    """A spreadsheet part declares entities: openpyxl refused those (through defusedxml)."""


def forbid_entities(*_args):
    raise EntitiesForbidden()


def scan_member(archive, info, budget: Budget, html: bool = False,
                forbid: bool = False) -> None:
    """Stream one member through expat, counting its elements and character data (entities
    expanded) against ``budget``, without building anything. Where the bytes stop being XML
    (a picture, a malformed part) the count stops, as an XML parser would; an HTML chapter
    (``html``) counts its remaining bytes as text instead, since the HTML extractor reads on
    and gives at most a character per byte. External entities are never fetched; ``forbid``
    refuses entity declarations."""
    parser = expat.ParserCreate()
    parser.buffer_text = True
    counts = [0, 0]  # elements, characters

    def start(_name, _attrs):
        counts[0] += 1

    def text(data):
        counts[1] += len(data)

    parser.StartElementHandler = start
    parser.CharacterDataHandler = text
    if forbid:
        parser.EntityDeclHandler = forbid_entities
    with archive.open(info) as member:
        read = 0
        while True:
            chunk = member.read(SCAN_BYTES)
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


def read_xml(archive, name: str, budget: Budget, forbid: bool = False):
    """Parse one member, counted against ``budget`` first (expat resolves no external entities
    and caps entity expansion); None if the package has no such member."""
    try:
        info = archive.getinfo(name)
    except KeyError:
        return None
    scan_member(archive, info, budget, forbid=forbid)
    return ElementTree.fromstring(archive.read(info))


def q(ns: str, tag: str) -> str:
    """ElementTree's ``{namespace}tag``."""
    return f"{{{ns}}}{tag}"
