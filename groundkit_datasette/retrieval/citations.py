"""Re-check a citation against its source file, read-only.

A citation is a chunk row: its source (relative to the base directory),
the extractor that produced the text, character offsets and the text.
Verification re-reads the file, re-extracts it with the same extractor and
compares the span. Reasons are shown to callers, so they never name a
filesystem path.

The arguments are trusted to come from a collection's chunk row: a
verified result returns text around the span, so callers must not pass a
request's own source and content through unchecked.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from ..indexing import safe_read
from .models import Relocation, Verification
from .stale import StaleCheck, plain_relative, sources_changed  # noqa: F401 (StaleCheck, sources_changed: exported)

# The ingest limit (indexing/extract.py MAX_FILE_BYTES), not imported from there: a search never
# needs the extractors' imports (tests/test_citations.py checks the two agree).
MAX_FILE_BYTES = 64 * 1024 * 1024


__all__ = ["Relocation", "SourceUnavailable", "StaleCheck", "Verification", "current_source",
           "line_of", "sources_changed", "verify_citation"]

_OUTSIDE = "source is outside the base directory"
SOURCE_NOT_FOUND = "source file not found"
_UNREADABLE = "source file unreadable"
SOURCE_TOO_LARGE = "source file too large"
_NOT_EXTRACTABLE = "source can no longer be extracted"
_EXTRACTED_DIFFERENTLY = "source is no longer extracted the way it was when cited"


class Unresolvable(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


SourceUnavailable = Unresolvable  # public name: ``reason`` is safe to show


def current_source(
    *, source: str, source_class: str, extractor: str, extractor_version: str,
    base_dir: Path | None, encoding: str | None = None,
):
    """The source re-read and re-extracted exactly as at ingest (an ``Extracted``).

    Raises :class:`SourceUnavailable` with a reason safe to show (never a path).
    """
    if base_dir is None:
        raise Unresolvable("no base directory configured")
    real_base, path = resolve_source(Path(base_dir), source)
    from ..indexing.extract import extractor_available  # here: a search never needs extract

    if not extractor_available(extractor, extractor_version):
        raise Unresolvable(f"extractor {extractor} version {extractor_version} is not available")
    data = read_bounded(path, real_base)
    return _reextract(data, source, source_class, extractor, extractor_version, encoding)


def verify_citation(
    *,
    source: str,
    source_class: str,
    extractor: str,
    extractor_version: str,
    start: int,
    end: int,
    content: str,
    base_dir: Path | None,
    context_chars: int = 400,
    encoding: str | None = None,
) -> Verification:
    """Whether ``content`` still sits at ``[start:end)`` of the re-extracted source.

    ``encoding`` is the codec recorded at ingest: the source is decoded with it, not with
    whatever the extractor would choose for today's bytes. None (older collections) lets
    the extractor choose, as it did then.
    """
    try:
        text = current_source(
            source=source, source_class=source_class, extractor=extractor,
            extractor_version=extractor_version, base_dir=base_dir, encoding=encoding,
        ).text
    except Unresolvable as exc:
        return _unresolvable(exc.reason)
    return _compare(text, start, end, content, max(0, int(context_chars)))


def _unresolvable(reason: str) -> Verification:
    return Verification(status="unresolvable", reason=reason)


# --------------------------------------------------------------------------
# Finding and reading the file


def resolve_source(base_dir: Path, source: str) -> tuple[Path, Path]:
    """The real base and the real path of ``source``, refused unless it stays under the base."""
    if not plain_relative(source):
        raise Unresolvable(_OUTSIDE)
    real_base = _real_base(base_dir)
    try:
        # Non-strict first: a link leading outside is refused whether or not
        # its target exists, so the answer reveals nothing about outside files.
        real = (real_base / source).resolve(strict=False)
    except (OSError, RuntimeError):  # symlink loops
        raise Unresolvable(_UNREADABLE) from None
    if not _inside(real, real_base):
        raise Unresolvable(_OUTSIDE)
    return real_base, real


def _real_base(base_dir: Path) -> Path:
    try:
        real_base = base_dir.resolve(strict=True)
    except (OSError, RuntimeError):
        raise Unresolvable("base directory not found") from None
    if not real_base.is_dir():
        raise Unresolvable("base directory not found")
    return real_base


def _inside(path: Path, base: Path) -> bool:
    return path != base and path.is_relative_to(base)


def read_bounded(path: Path, real_base: Path) -> bytes:
    """The file ``path`` (just resolved inside ``real_base``) read by ingest's rule
    (indexing/safe_read.py): reached from a descriptor of the base with no link followed
    (a link here appeared since the resolution), opened without blocking (a FIFO must not
    hang the server), a regular file by ``fstat``, at most MAX_FILE_BYTES."""
    try:
        with safe_read.Base(real_base) as tree:
            fd, info = tree.open(path.relative_to(real_base).as_posix(), follow=False)
            try:
                _check_opened_inside(fd, real_base)
                return safe_read.read_fd(fd, info, MAX_FILE_BYTES)
            finally:
                os.close(fd)
    except safe_read.Refused as refused:
        raise Unresolvable(_REFUSED.get(refused.reason, _UNREADABLE)) from None
    except OSError:  # the base itself could not be opened again
        raise Unresolvable(_UNREADABLE) from None


_REFUSED = {safe_read.NOT_FOUND: SOURCE_NOT_FOUND, safe_read.TOO_LARGE: SOURCE_TOO_LARGE}


def _check_opened_inside(fd: int, real_base: Path) -> None:
    """Where /proc exists, confirm the file actually opened is under the base: a second
    check behind the link-free open (the base itself renamed or re-linked meanwhile)."""
    if safe_read.opened_inside(fd, real_base) is False:
        raise Unresolvable(_OUTSIDE)


def _reextract(
    data: bytes, source: str, source_class: str, extractor: str, extractor_version: str,
    encoding: str | None = None,
) -> str:
    from ..indexing.extract import Exceeded, ExtractionBusy, Skipped, extract_bytes

    # The suffix comes from the recorded source, as at ingest (not from a link's target).
    # ``serving``: PDFs and packages are parsed in a child with the serving time limit, at most
    # SERVE_EXTRACTIONS at once in this process (indexing/extract.py, adr/0050).
    try:
        extracted = extract_bytes(data, PurePosixPath(source).suffix, encoding=encoding,
                                  serving=True)
    except Exceeded as exc:  # a budget, the time or the memory limit: said as it is
        raise Unresolvable(f"{_NOT_EXTRACTABLE}: {exc.reason}") from None
    except ExtractionBusy as exc:
        raise Unresolvable(str(exc)) from None
    except Skipped:
        raise Unresolvable(_NOT_EXTRACTABLE) from None
    except Exception:  # malformed input can fail in a parser in many ways
        raise Unresolvable(_NOT_EXTRACTABLE) from None
    if (
        extracted.extractor != extractor
        or extracted.extractor_version != extractor_version
        or extracted.source_class != source_class
    ):
        raise Unresolvable(_EXTRACTED_DIFFERENTLY)
    return extracted


# --------------------------------------------------------------------------
# Comparing


def _compare(text: str, start, end, content: str, context_chars: int) -> Verification:
    if not isinstance(content, str):
        content = ""  # nothing to match or relocate: drifts
    in_range = _is_int(start) and _is_int(end) and 0 <= start < end <= len(text)
    if in_range and content and text[start:end] == content:
        return Verification(
            status="verified",
            reason="the cited span matches the source",
            source_text=text[start:end],
            context_before=text[max(0, start - context_chars) : start],
            context_after=text[end : end + context_chars],
            indexed_text="matches_source",
        )
    anchor = min(max(start, 0), len(text)) if _is_int(start) else 0
    relocated = _relocate(text, content, anchor) if content else None
    if relocated is not None:
        # Re-anchored: the current text at the new location, with its context. The chunk's
        # own offsets and content stay as indexed; ``indexed_text`` says which is which.
        a, b = relocated.start_offset, relocated.end_offset
        return Verification(
            status="drifted",
            reason="the cited span no longer matches the source; its text has moved",
            relocated=relocated,
            source_text=text[a:b],
            context_before=text[max(0, a - context_chars) : a],
            context_after=text[b : b + context_chars],
            indexed_text="moved_in_source",
        )
    elif in_range:
        reason = "the cited span no longer matches the source; its text is no longer in the source"
    else:
        reason = (
            "the cited offsets are outside the current source; "
            "its text is no longer in the source"
        )
    return Verification(status="drifted", reason=reason, indexed_text="not_in_source")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _relocate(text: str, content: str, anchor: int) -> Relocation | None:
    """The occurrence of ``content`` nearest ``anchor``, found in linear time."""
    after = text.find(content, anchor)
    # Last occurrence starting before the anchor (overlapping ones included).
    before = text.rfind(content, 0, anchor + len(content) - 1)
    candidates = [p for p in (before, after) if p >= 0]
    if not candidates:
        return None
    best = min(candidates, key=lambda p: (abs(p - anchor), p))
    new_end = best + len(content)
    return Relocation(
        start_offset=best,
        end_offset=new_end,
        line_start=line_of(text, best),
        line_end=line_of(text, new_end - 1),
        # Non-overlapping count: str.count is linear; overlapping repeats are rare in prose.
        occurrences=text.count(content),
    )


def line_of(text: str, offset: int) -> int:
    """1-based line holding ``offset``, counted as the chunker does."""
    return text.count("\n", 0, offset) + 1
