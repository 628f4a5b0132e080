"""Structure-aware chunking with exact character offsets.

Every chunk is a slice of the document text (``text[start:end]``), so a
citation can later be checked by re-extracting the source and comparing
the same slice. Cuts are chosen greedily inside a window of
``chunk_size`` characters, preferring the strongest structural boundary
available: section > paragraph > sentence > line > word > character.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_left
from dataclasses import dataclass

__all__ = [
    "Chunk",
    "Heading",
    "MIN_CHUNK_SIZE",
    "chunk_text",
    "contextual_heading",
    "find_headings",
    "validate_chunk_settings",
]

MIN_CHUNK_SIZE = 50

# Joins the elements of a heading path ("Title > Section > Subsection").
PATH_SEPARATOR = " > "
# A title longer than this is cut (at a space) before it heads every chunk of its document.
MAX_HEADER_TITLE_CHARS = 200

# A paragraph or sentence boundary earlier than this fraction of the
# window is ignored in favour of a weaker one further on, so a short
# heading line does not become a chunk of its own.
_MIN_FILL_DIVISOR = 8

# How far past the window end a boundary pattern may look to see the
# whole whitespace run around the cut.
_SLACK = 64


@dataclass(frozen=True)
class Chunk:
    index: int
    start: int
    end: int
    line_start: int
    line_end: int
    heading: str
    text: str


@dataclass(frozen=True)
class Heading:
    start: int  # offset of the heading's first line (overline for rst)
    level: int
    title: str


def validate_chunk_settings(chunk_size: int, chunk_overlap: int) -> None:
    for name, value in (("chunk_size", chunk_size), ("chunk_overlap", chunk_overlap)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer")
    if chunk_size < MIN_CHUNK_SIZE:
        raise ValueError(f"chunk_size must be at least {MIN_CHUNK_SIZE} characters")
    if chunk_overlap < 0:
        raise ValueError("chunk_overlap must not be negative")
    if 2 * chunk_overlap >= chunk_size:
        raise ValueError("chunk_overlap must be less than half of chunk_size")


def chunk_text(
    text: str,
    *,
    source_class: str,
    chunk_size: int = 1000,
    chunk_overlap: int = 100,
    title: str | None = None,
) -> list[Chunk]:
    """Split ``text`` into ordered chunks; see the module docstring.

    Unknown ``source_class`` values are chunked as plain prose. With ``title`` (the
    document's extracted title), every chunk's heading is its contextual header: see
    :func:`contextual_heading`.
    """
    validate_chunk_settings(chunk_size, chunk_overlap)
    if not text:
        return []
    levels = _CODE_LEVELS if source_class == "code" else _PROSE_LEVELS
    spans: list[tuple[int, int, str]] = []
    for sec_start, sec_end, heading in _sections(text, source_class):
        m = _NON_SPACE.search(text, sec_start, sec_end)
        if m is None:
            continue
        s = m.start()
        e = sec_end
        while text[e - 1].isspace():
            e -= 1
        for a, b in _split_section(text, s, e, chunk_size, chunk_overlap, levels):
            spans.append((a, b, heading))

    newlines = [m.start() for m in _NEWLINE.finditer(text)]
    return [
        Chunk(
            index=i,
            start=a,
            end=b,
            line_start=bisect_left(newlines, a) + 1,
            line_end=bisect_left(newlines, b - 1) + 1,
            heading=contextual_heading(title, heading),
            text=text[a:b],
        )
        for i, (a, b, heading) in enumerate(spans)
    ]


def contextual_heading(title: str | None, path: str) -> str:
    """A chunk's header: the document title in front of its heading path, once.

    ``"Title > Section"`` for a chunk under "Section" of a document titled "Title"; just
    ``"Title"`` for a chunk under no heading (HTML, PDF, text before the first heading). The
    path is returned as it is when there is no title, or when its first element already is
    the title (compared with whitespace collapsed and case folded), as for a Markdown file
    whose ``# Title`` gives the document its title. A title over
    ``MAX_HEADER_TITLE_CHARS`` is cut at a space. See adr/0035-contextual-title-header.md.
    """
    title = " ".join((title or "").split())
    if not title:
        return path
    folded, flat = title.casefold(), " ".join(path.split()).casefold()
    if flat == folded or flat.startswith(folded + PATH_SEPARATOR):
        return path
    if len(title) > MAX_HEADER_TITLE_CHARS:
        cut = title.rfind(" ", 0, MAX_HEADER_TITLE_CHARS + 1)
        title = title[: cut if cut > 0 else MAX_HEADER_TITLE_CHARS]
    return title + PATH_SEPARATOR + path if path else title


# --------------------------------------------------------------------------
# Sections


def find_headings(text: str, source_class: str) -> tuple[Heading, ...]:
    """Headings in document order (Markdown and reStructuredText only)."""
    global _last_headings
    last = _last_headings
    if last[0] is text and last[1] == source_class:
        return last[2]
    if source_class == "markdown":
        found = tuple(_markdown_headings(text))
    elif source_class == "rst":
        found = tuple(_rst_headings(text))
    else:
        return ()
    _last_headings = (text, source_class, found)
    return found


# The last text's headings: extraction (the title) and chunking (the sections) both ask for
# the same document's, one after the other. Held by identity; it keeps that one text alive.
_last_headings: tuple = (None, None, ())


def _sections(text: str, source_class: str) -> list[tuple[int, int, str]]:
    if source_class == "pdf":
        # Pages are hard boundaries so a chunk never straddles two pages.
        out = []
        pos = 0
        while True:
            ff = text.find("\f", pos)
            if ff == -1:
                out.append((pos, len(text), ""))
                return out
            out.append((pos, ff, ""))
            pos = ff + 1
    headings = find_headings(text, source_class)
    if not headings:
        return [(0, len(text), "")]
    starts: list[tuple[int, str]] = []
    if headings[0].start > 0:
        starts.append((0, ""))
    stack: list[tuple[int, str]] = []
    for h in headings:
        while stack and stack[-1][0] >= h.level:
            stack.pop()
        stack.append((h.level, h.title))
        starts.append((h.start, PATH_SEPARATOR.join(t for _, t in stack if t)))
    ends = [s for s, _ in starts[1:]] + [len(text)]
    return [(s, e, path) for (s, path), e in zip(starts, ends)]


_MD_CANDIDATE = re.compile(
    r"^ {0,3}(?:(#{1,6})(?=[ \t\r]|$)|(`{3,}|~{3,})|(?:=+|-+)[ \t\r]*$)", re.M
)
_MD_FRONT_OPEN = re.compile(r"---[ \t]*\r?\n")
_MD_FRONT_CLOSE = re.compile(r"^(?:---|\.\.\.)[ \t]*\r?$", re.M)
_ATX_CLOSING = re.compile(r"(?:^|[ \t]+)#+[ \t]*$")
_NOT_SETEXT_TITLE = re.compile(
    r"(?:[-*+](?:[ \t]|$)|\d{1,9}[.)](?:[ \t]|$)|>|#{1,6}(?:[ \t]|$)|`{3}|~{3}"
    r"|=+$|-+$|(?:\*[ \t]*){3,}$|(?:_[ \t]*){3,}$)"
)


def _markdown_headings(text: str) -> list[Heading]:
    pos0 = 0
    if _MD_FRONT_OPEN.match(text):
        close = _MD_FRONT_CLOSE.search(text, text.index("\n") + 1)
        if close is not None:
            pos0 = close.end()
    headings: list[Heading] = []
    fence: tuple[str, int] | None = None
    for m in _MD_CANDIDATE.finditer(text, pos0):
        ls = m.start()
        le = text.find("\n", ls)
        if le == -1:
            le = len(text)
        marker = m.group(2)
        if fence is not None:
            if (
                marker
                and marker[0] == fence[0]
                and len(marker) >= fence[1]
                and not text[m.end(2) : le].strip()
            ):
                fence = None
            continue
        if marker:
            if marker[0] == "`" and "`" in text[m.end(2) : le]:
                continue  # inline code span, not a fence
            fence = (marker[0], len(marker))
            continue
        if m.group(1):
            title = _ATX_CLOSING.sub("", text[m.end(1) : le].strip())
            headings.append(Heading(ls, len(m.group(1)), title.strip()))
            continue
        # Setext underline: the single line above becomes the heading.
        if ls <= pos0:
            continue
        ps = text.rfind("\n", 0, ls - 1) + 1
        if ps < pos0 or (headings and headings[-1].start == ps):
            continue
        prev = text[ps : ls - 1].rstrip("\r")
        stripped = prev.strip()
        if not stripped or prev.startswith("\t") or len(prev) - len(prev.lstrip(" ")) >= 4:
            continue
        if _NOT_SETEXT_TITLE.match(stripped):
            continue
        level = 1 if text[m.start() : le].strip()[0] == "=" else 2
        headings.append(Heading(ps, level, stripped))
    return headings


# Underline candidates: one repeated ASCII punctuation character from column 0.
_RST_ADORNMENT = re.compile(r"^([!-/:-@\[-`{-~])\1*[ \t]*\r?$", re.M)


def _display_width(s: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)


def _rst_headings(text: str) -> list[Heading]:
    headings: list[Heading] = []
    styles: list[tuple[str, bool]] = []
    for m in _RST_ADORNMENT.finditer(text):
        ls = m.start()
        if ls == 0:
            continue
        adornment = text[ls : m.end()].rstrip()
        ts = text.rfind("\n", 0, ls - 1) + 1
        title_line = text[ts : ls - 1].rstrip("\r")
        title = title_line.strip()
        if not title or _RST_ADORNMENT.fullmatch(title_line) or (headings and headings[-1].start == ts):
            continue
        width = _display_width(title)
        if len(adornment) < width and len(adornment) < 4:
            continue
        overline = False
        start = ts
        if ts > 0:
            os_ = text.rfind("\n", 0, ts - 1) + 1
            above = text[os_ : ts - 1].rstrip()
            if above == adornment:
                overline = True
                start = os_
                if os_ > 0:
                    bs = text.rfind("\n", 0, os_ - 1) + 1
                    if text[bs : os_ - 1].strip():
                        continue
            elif above:
                continue  # a title must follow a blank line
        if not overline and title_line[0].isspace():
            continue
        if headings and headings[-1].start >= start:
            continue
        style = (adornment[0], overline)
        if style not in styles:
            styles.append(style)
        headings.append(Heading(start, styles.index(style) + 1, title))
    return headings


# --------------------------------------------------------------------------
# Splitting a section


_NEWLINE = re.compile("\n")
_NON_SPACE = re.compile(r"\S")
_WORD_START = re.compile(r"(?<!\S)\S")
_BLANK_LINE = re.compile(r"\n[^\S\n]*\n")
_LAST_SPACE = re.compile(r"(?s).*\s")
_SENTENCE_END = re.compile(
    r"[.!?\u2026][\"'\u201d\u2019\u00bb)\]]*(?=\s)"
    r"|[\u3002\uff01\uff1f\uff61][\"'\u201d\u2019\u300d\u300f)\uff09]*"
)


def _run_start(text: str, pos: int, lower: int) -> int:
    while pos > lower and text[pos - 1].isspace():
        pos -= 1
    return pos


def _cut_paragraph(text: str, lower: int, hi: int, end: int) -> int:
    best = -1
    for m in _BLANK_LINE.finditer(text, lower, min(hi + _SLACK, end)):
        if m.start() > hi:
            break
        b = _run_start(text, m.start(), lower)
        if b > lower:
            best = b
    return best


def _cut_sentence(text: str, lower: int, hi: int, end: int) -> int:
    best = -1
    for m in _SENTENCE_END.finditer(text, lower, min(hi + 1, end)):
        b = m.end()
        if b > hi:
            break
        if b > lower:
            best = b
    return best


def _cut_line(text: str, lower: int, hi: int, end: int) -> int:
    nl = text.rfind("\n", lower, hi + 1)
    if nl == -1:
        return -1
    b = _run_start(text, nl, lower)
    return b if b > lower else -1


def _cut_word(text: str, lower: int, hi: int, end: int) -> int:
    # Greedy ".*" backtracks from the window end: finds the last space in C.
    m = _LAST_SPACE.match(text, lower, hi + 1)
    if m is None:
        return -1
    b = _run_start(text, m.end() - 1, lower)
    return b if b > lower else -1


_PROSE_LEVELS = (_cut_paragraph, _cut_sentence, _cut_line, _cut_word)
_CODE_LEVELS = (_cut_paragraph, _cut_line, _cut_word)


def _glued_to_previous(ch: str) -> bool:
    """True for characters that must not start a chunk (marks, joiners)."""
    cp = ord(ch)
    return (
        unicodedata.combining(ch) != 0
        or unicodedata.category(ch) in ("Mn", "Mc", "Me")
        or cp == 0x200D
        or 0xFE00 <= cp <= 0xFE0F
        or 0x1F3FB <= cp <= 0x1F3FF
        or 0xE0020 <= cp <= 0xE007F
        or 0xE0100 <= cp <= 0xE01EF
    )


def _hard_cut(text: str, floor: int, hi: int) -> int:
    """Cut at ``hi``, backing off so a mark or joiner stays with its base."""
    b = hi
    while b - 1 > floor and (_glued_to_previous(text[b]) or text[b - 1] == "\u200d"):
        b -= 1
    if b - 1 == floor and (_glued_to_previous(text[b]) or text[b - 1] == "\u200d"):
        return hi  # nothing but marks: any cut splits a cluster
    return b


def _split_section(
    text: str, s: int, e: int, size: int, overlap: int, levels
) -> list[tuple[int, int]]:
    """Spans covering ``text[s:e]`` (both ends non-space)."""
    out: list[tuple[int, int]] = []
    min_fill = max(1, size // _MIN_FILL_DIVISOR)
    q = s  # start of the chunk being built (non-space)
    nxt = s  # first character not yet covered by any chunk
    end_before = s  # end of the chunk before the previous one
    while True:
        if e - q <= size:
            out.append((q, e))
            return out
        hi = q + size
        lower = max(nxt, q + min_fill)
        b = -1
        for level in levels:
            b = level(text, lower, hi, e)
            if b > 0:
                break
        if b <= 0:
            b = _hard_cut(text, nxt, hi)
        end = b
        while text[end - 1].isspace():
            end -= 1
        out.append((q, end))

        m = _NON_SPACE.search(text, b, e)
        nxt = m.start()  # exists: text[e - 1] is non-space and b < e
        new_q = nxt
        if overlap:
            lo = max(end - overlap, q + 1, end_before)
            if lo < end:
                w = _WORD_START.search(text, lo, end)
                if w is not None:
                    new_q = w.start()
        if new_q + size <= nxt:
            new_q = nxt  # a huge whitespace gap: overlap would add nothing new
        end_before = end
        q = new_q
