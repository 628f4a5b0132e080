"""A PDF citation drawn on its page: the page rendered by pdfium, the cited span highlighted.

Read-only like every operation (adr/0027): the source is read under the base directory by
the rules a citation's check uses, rendered in memory, and the PNG kept only in a bounded
in-memory LRU; nothing is written anywhere.

The cited span is a range of the text pypdf extracted at ingest (``indexing/extract.py``:
one ``page.extract_text()`` per page, pages joined by ``PDF_PAGE_SEPARATOR``). pdfium has
its own text of each page, with its own character indices and boxes, so the span is mapped
from one to the other: whitespace aside, the span's characters are found in pdfium's text
in the same order (the k-th occurrence for the k-th occurrence), line by line where the two
libraries order lines differently. A character pdfium does not have is not highlighted.

Nothing is drawn unless pypdf, the same version, extracts the cited text at the cited offsets
again (the test ``fetch_chunk``'s verdict makes): a changed source gets ``SourceChanged``,
never a highlight over other text.

pdfium runs only in child processes (``indexing/isolation.py``), with a memory limit and
the request's deadline, at which they are killed; the page count is read first, so a document
over MAX_PAGES is refused before pypdf parses its pages (adr/0052).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import PurePosixPath

from ..indexing.extract import (PDF_PAGE_SEPARATOR, Exceeded, ExtractionBusy, Skipped,
                                  extract_bytes)
from ..indexing.isolation import ChildFailed, ChildOutOfMemory, ChildTimeout, run_isolated
from ..errors import ChunkNotFound, NoPageImage, PageImageTooLarge, RenderTimeout, SourceChanged

log = logging.getLogger("groundkit")

# -- the bounds (docs/api.md#page-images) ---------------------------------------------------

MAX_SOURCE_BYTES = 64 * 1024 * 1024  # the ingest limit (extract.MAX_FILE_BYTES)
MAX_PAGES = 1000                     # pages in the document (pdfium's count, read first)
PAGE_WIDTH_PX = 1000                 # every page image is this wide
MAX_SCALE = 4.0                      # a tiny page is not blown up further than this
MAX_PAGE_PIXELS = 4_000_000          # width x height; a very tall page is refused
RENDER_SECONDS = 20.0                # from the request to the PNG, queueing included
MAX_RENDERS = 2                      # page images produced at once (one pdfium child each)
BACKSTOP_SECONDS = 1.0               # past the deadline, answer even if the worker has not
MAX_QUEUED = 4                       # more waiting for one; beyond that, "busy"
RENDER_MEMORY_BYTES = 512 * 1024 * 1024  # a pdfium child's address space beyond its start
MAX_PAGES_SHOWN = 3                  # page images on one chunk page
CACHE_BYTES = 32 * 1024 * 1024       # the LRU's total PNG bytes
CACHE_ENTRIES = 256

HIGHLIGHT = (255, 214, 0)     # the cited span's fill, blended
HIGHLIGHT_ALPHA = 0.6
OUTLINE = (176, 72, 0)        # and its outline, 2 px, so it shows on any background

_NOT_PDF = "this chunk is not from a PDF: it has no page image"
_NOT_CITED = "that page is not part of this citation"
_CHANGED = ("the source file changed since it was ingested and the cited text is no longer at "
            "its place: its pages are not shown")
_EXTRACTED_DIFFERENTLY = ("the source is no longer extracted the way it was when cited: "
                          "its pages are not shown")
_UNREADABLE = "pdfium cannot read this PDF: its pages are not shown"
_UNRENDERABLE = "pdfium could not draw this page within its limits: it has no page image"
_TIMED_OUT = "the page image was not ready within {:g} seconds"


@dataclass(frozen=True)
class Box:
    """A rectangle in page space (PDF points, origin bottom left): left, bottom, right, top."""

    left: float
    bottom: float
    right: float
    top: float


@dataclass(frozen=True)
class PageImage:
    png: bytes
    width: int
    height: int
    page: int
    # pdfium character indices of the cited span on this page, and the merged line boxes
    # (page space) and rectangles (pixels: x0, y0, x1, y1) drawn over them.
    char_indices: tuple[int, ...]
    boxes: tuple[Box, ...]
    rects: tuple[tuple[int, int, int, int], ...]


# -- mapping pypdf offsets to pdfium characters -------------------------------------------


def _visible(text: str, start: int = 0, end: int | None = None) -> tuple[str, list[int]]:
    """``text[start:end]`` without whitespace, and each kept character's index in ``text``."""
    end = len(text) if end is None else end
    kept = [(i, c) for i, c in enumerate(text[start:end], start) if not c.isspace()]
    return "".join(c for _, c in kept), [i for i, _ in kept]


def _nth(haystack: str, needle: str, n: int) -> int:
    """Start of the ``n``-th (0-based) occurrence of ``needle``, overlapping ones counted; -1."""
    pos = -1
    for _ in range(n + 1):
        pos = haystack.find(needle, pos + 1)
        if pos < 0:
            return -1
    return pos


def _occurrences_before(haystack: str, needle: str, end: int) -> int:
    count, pos = 0, haystack.find(needle)
    while 0 <= pos < end:
        count += 1
        pos = haystack.find(needle, pos + 1)
    return count


def map_span(page_text: str, start: int, end: int, pdfium_text: str) -> list[int]:
    """pdfium character indices of ``page_text[start:end]`` (page-local pypdf offsets)."""
    q, q_index = _visible(page_text)
    p, p_index = _visible(pdfium_text)
    lo = next((k for k, i in enumerate(q_index) if i >= start), len(q_index))
    hi = next((k for k, i in enumerate(q_index) if i >= end), len(q_index))
    if lo >= hi:
        return []
    if q == p:  # the usual case: both libraries read the same characters in the same order
        return p_index[lo:hi]

    def place(a: int, b: int) -> list[int] | None:
        needle = q[a:b]
        at = _nth(p, needle, _occurrences_before(q, needle, a))
        if at < 0 and p.count(needle) == 1:
            at = p.find(needle)
        return p_index[at : at + len(needle)] if at >= 0 else None

    whole = place(lo, hi)
    if whole is not None:
        return whole
    # Line by line: pdfium may order a page's lines (or columns) differently.
    out: list[int] = []
    line_start = lo
    for k in range(lo, hi + 1):
        at_break = k == hi or "\n" in page_text[q_index[k - 1] + 1 : q_index[k]] if k > lo else False
        if k == hi or at_break:
            found = place(line_start, k)
            if found is not None:
                out += found
            line_start = k
    return sorted(set(out))


def line_boxes(textpage, indices: list[int]) -> list[Box]:
    """The characters' boxes merged into one box per run on a line (pdfium's tight boxes)."""
    boxes: list[Box] = []
    for i in sorted(indices):
        left, bottom, right, top = textpage.get_charbox(i)
        if right <= left or top <= bottom:
            continue  # a generated character (a space, a line break) has no box
        box = Box(left, bottom, right, top)
        if boxes and _same_line(boxes[-1], box):
            b = boxes[-1]
            boxes[-1] = Box(min(b.left, left), min(b.bottom, bottom),
                            max(b.right, right), max(b.top, top))
        else:
            boxes.append(box)
    return boxes


def _same_line(a: Box, b: Box) -> bool:
    overlap = min(a.top, b.top) - max(a.bottom, b.bottom)
    return overlap > 0.5 * min(a.top - a.bottom, b.top - b.bottom) and b.left >= a.left - 1


def _pdfium_text(textpage) -> str:
    import pypdfium2.raw as raw

    return "".join(chr(raw.FPDFText_GetUnicode(textpage, i) or 0xFFFD)
                   for i in range(textpage.count_chars()))


# -- PNG ------------------------------------------------------------------------------------


def _chunk(kind: bytes, body: bytes) -> bytes:
    return (len(body).to_bytes(4, "big") + kind + body
            + zlib.crc32(kind + body).to_bytes(4, "big"))


def encode_png(pixels) -> bytes:
    """An RGB ``uint8`` array (height, width, 3) as a PNG (8-bit truecolour, no filter)."""
    import numpy as np

    height, width, _ = pixels.shape
    rows = np.zeros((height, width * 3 + 1), dtype=np.uint8)
    rows[:, 1:] = pixels.reshape(height, width * 3)
    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 6)) + _chunk(b"IEND", b""))


def _draw(pixels, rects) -> None:
    import numpy as np

    height, width, _ = pixels.shape
    fill = np.array(HIGHLIGHT, dtype=np.float32)
    edge = np.array(OUTLINE, dtype=np.uint8)
    for x0, y0, x1, y1 in rects:
        x0, y0 = max(0, x0 - 2), max(0, y0 - 2)
        x1, y1 = min(width, x1 + 2), min(height, y1 + 2)
        if x1 <= x0 or y1 <= y0:
            continue
        area = pixels[y0:y1, x0:x1].astype(np.float32)
        # Multiply-like: dark text stays dark, paper turns yellow.
        blended = area * (1 - HIGHLIGHT_ALPHA) + area * (fill / 255.0) * HIGHLIGHT_ALPHA
        pixels[y0:y1, x0:x1] = blended.clip(0, 255).astype(np.uint8)
        pixels[y0:y0 + 2, x0:x1] = edge
        pixels[y1 - 2:y1, x0:x1] = edge
        pixels[y0:y1, x0:x0 + 2] = edge
        pixels[y0:y1, x1 - 2:x1] = edge


# -- rendering, in a child process ----------------------------------------------------------
#
# pdfium reads the source file, which anyone who can put a file in the corpus wrote: a page can
# take minutes (nested soft masks) or gigabytes to draw. So pdfium only ever runs in a child
# (indexing/isolation.py) with an address-space limit and the request's deadline; at the
# deadline the child is killed and its slot is free at once (adr/0052).


def _count_pages_in_child(data: bytes) -> int:
    """The document's page count as pdfium reads it: the cross-reference table and the page
    tree's /Count, no page parsed (about a millisecond for 3,000 pages)."""
    import pypdfium2 as pdfium

    doc = pdfium.PdfDocument(data)
    try:
        return len(doc)
    finally:
        doc.close()


def _render_in_child(data: bytes, page_text: str, start: int, end: int, page: int,
                     bounds: dict) -> dict:
    """The pdfium part of :func:`render_page`, as plain data (run by ``run_isolated``).

    ``bounds`` are the caller's: the child is a fresh process, blind to settings made since."""
    import pypdfium2 as pdfium

    max_pages, max_pixels = bounds["pages"], bounds["pixels"]
    doc = pdfium.PdfDocument(data)
    try:
        if len(doc) > max_pages:
            raise PageImageTooLarge(f"the document has more than {max_pages} pages")
        pdf_page = doc[page - 1]
        textpage = pdf_page.get_textpage()
        indices = map_span(page_text, start, end, _pdfium_text(textpage))
        boxes = line_boxes(textpage, indices)
        width_pt, height_pt = pdf_page.get_size()  # as shown: /Rotate already applied
        if width_pt <= 0 or height_pt <= 0:
            raise PageImageTooLarge("the page has no area to render")
        scale = min(bounds["scale"], bounds["width"] / width_pt)
        if (width_pt * scale) * (height_pt * scale) > max_pixels:
            raise PageImageTooLarge(
                f"the page is too tall to render within {max_pixels:,} pixels")
        bitmap = pdf_page.render(scale=scale, rev_byteorder=True, fill_color=(255, 255, 255, 255))
        pixels = bitmap.to_numpy()[:, :, :3].copy()
        convert = bitmap.get_posconv(pdf_page)
        rects = []
        for b in boxes:
            corners = [convert.to_bitmap(x, y) for x in (b.left, b.right) for y in (b.bottom, b.top)]
            xs, ys = [c[0] for c in corners], [c[1] for c in corners]
            rects.append((min(xs), min(ys), max(xs), max(ys)))
        _draw(pixels, rects)
        height, width, _ = pixels.shape
        return {"png": encode_png(pixels), "width": int(width), "height": int(height),
                "char_indices": [int(i) for i in indices],
                "boxes": [[float(b.left), float(b.bottom), float(b.right), float(b.top)]
                          for b in boxes],
                "rects": [[int(v) for v in r] for r in rects]}
    finally:
        doc.close()


def _page_image(value, page: int, max_pixels: int) -> PageImage:
    """The child's answer checked and rebuilt: a child pdfium ran in may have been subverted
    by the file, so a malformed answer is a failed render, never trusted."""
    try:
        png, width, height = value["png"], value["width"], value["height"]
        indices = value["char_indices"]
        boxes = [Box(*(float(v) for v in _numbers(b, 4))) for b in value["boxes"]]
        rects = [tuple(_numbers(r, 4, (int,))) for r in value["rects"]]
        if (not isinstance(png, bytes) or not png.startswith(b"\x89PNG\r\n\x1a\n")
                or not isinstance(indices, list)
                or not all(type(v) is int for v in (width, height, *indices))
                or not 0 < width * height <= max_pixels):
            raise ValueError
    except (KeyError, TypeError, ValueError):
        raise ChildFailed() from None
    return PageImage(png, width, height, page, tuple(indices), tuple(boxes), tuple(rects))


def _numbers(values, n: int, kinds=(int, float)) -> list:
    if (not isinstance(values, list) or len(values) != n
            or not all(type(v) in kinds for v in values)):
        raise ValueError
    return values


def _in_child(fn, *args, deadline: float):
    """``fn(*args)`` in a pdfium child, killed at ``deadline`` (time.monotonic)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise RenderTimeout(_TIMED_OUT.format(RENDER_SECONDS))
    try:
        return run_isolated(fn, *args, timeout=left, memory_bytes=RENDER_MEMORY_BYTES,
                            passthrough=(PageImageTooLarge,))
    except ChildTimeout:
        raise RenderTimeout(_TIMED_OUT.format(RENDER_SECONDS)) from None
    except ChildOutOfMemory:
        raise PageImageTooLarge(f"the page needs more than "
                                f"{RENDER_MEMORY_BYTES // (1024 * 1024)} MiB to render") from None


def page_count(data: bytes, deadline: float | None = None) -> int:
    """The PDF's page count, read by pdfium in a child without parsing any page.

    Raises ``ChildFailed`` when pdfium cannot open the document."""
    deadline = time.monotonic() + RENDER_SECONDS if deadline is None else deadline
    count = _in_child(_count_pages_in_child, data, deadline=deadline)
    if type(count) is not int or count < 0:
        raise ChildFailed()
    return count


def render_page(data: bytes, page_text: str, start: int, end: int, page: int,
                deadline: float | None = None) -> PageImage:
    """Page ``page`` (1-based) of the PDF ``data``, with ``page_text[start:end]`` highlighted.

    ``page_text`` is pypdf's text of that page, as ingest extracted it. pdfium runs in a
    child process (``RENDER_MEMORY_BYTES``, killed at ``deadline``, by default RENDER_SECONDS
    from now); a page it cannot read or draw is ``NoPageImage``."""
    deadline = time.monotonic() + RENDER_SECONDS if deadline is None else deadline
    try:
        bounds = {"pages": MAX_PAGES, "pixels": MAX_PAGE_PIXELS, "width": PAGE_WIDTH_PX,
                  "scale": MAX_SCALE}
        value = _in_child(_render_in_child, data, page_text, start, end, page, bounds,
                          deadline=deadline)
        return _page_image(value, page, bounds["pixels"])
    except ChildFailed:  # a crash, a pdfium error, a malformed answer (timeouts are answered)
        log.warning("page image: pdfium's child failed on page %d of a PDF", page)
        raise NoPageImage(_UNRENDERABLE) from None


def page_texts(extracted_text: str, page_starts: tuple[int, ...]) -> list[tuple[int, str]]:
    """(start offset, text) of every page of an extracted PDF's text."""
    out = []
    for n, begin in enumerate(page_starts):
        stop = (page_starts[n + 1] - len(PDF_PAGE_SEPARATOR) if n + 1 < len(page_starts)
                else len(extracted_text))
        out.append((begin, extracted_text[begin:stop]))
    return out


# -- one citation's page, checked, cached and bounded ---------------------------------------


class PageImageCache:
    """The last rendered pages, bounded by bytes and entries; in memory only."""

    def __init__(self, max_bytes: int = CACHE_BYTES, max_entries: int = CACHE_ENTRIES):
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._items: OrderedDict[tuple, PageImage] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
            return item

    def put(self, key, item: PageImage) -> None:
        if len(item.png) > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= len(old.png)
            self._items[key] = item
            self._bytes += len(item.png)
            while self._bytes > self.max_bytes or len(self._items) > self.max_entries:
                _, dropped = self._items.popitem(last=False)
                self._bytes -= len(dropped.png)

    def __len__(self):
        return len(self._items)

    @property
    def size(self) -> int:
        return self._bytes


CACHE = PageImageCache()
# Page images produced at once: each worker's pdfium runs in its own child, killed at the
# request's deadline, so a hostile page holds a worker no longer than RENDER_SECONDS.
_RENDERER = ThreadPoolExecutor(max_workers=MAX_RENDERS, thread_name_prefix="groundkit-page-image")
_admitted = 0  # requests producing or waiting for a page image
_admitted_lock = threading.Lock()


def cited_pages(chunk) -> list[int]:
    """The pages a chunk page shows images of: its pages, at most MAX_PAGES_SHOWN."""
    if chunk.page_start is None or not str(chunk.source).lower().endswith(".pdf"):
        return []
    last = chunk.page_end if chunk.page_end is not None else chunk.page_start
    return list(range(chunk.page_start, min(last, chunk.page_start + MAX_PAGES_SHOWN - 1) + 1))


def chunk_page_image(collection, chunk_id: str, page: int, hidden_documents=(),
                     deadline: float | None = None) -> PageImage:
    """Page ``page`` of the PDF chunk ``chunk_id`` cites, the span highlighted (blocking).

    A chunk of a document in ``hidden_documents`` is not found, in a missing chunk's words.
    pdfium's children are killed at ``deadline`` (``time.monotonic()``; by default
    RENDER_SECONDS from now): past it, ``RenderTimeout``."""
    # Imported here, not at the top: every pdfium child imports this module, and does not
    # need them (pydantic's models cost a child ~55 ms).
    from .citations import SOURCE_TOO_LARGE, Unresolvable, read_bounded, resolve_source
    from .models import FetchChunkRequest

    deadline = time.monotonic() + RENDER_SECONDS if deadline is None else deadline

    FetchChunkRequest(chunk_id=chunk_id)
    rows = collection.query(
        """SELECT c.document_id, c.start_offset, c.end_offset, c.page_start, c.page_end,
                  c.content, d.source, d.source_class, d.extractor, d.extractor_version,
                  d.file_hash
           FROM chunks c JOIN documents d USING (document_id) WHERE c.chunk_id = ?""",
        (chunk_id,))
    if not rows or rows[0][0] in set(hidden_documents):
        raise ChunkNotFound("chunk not found")
    (_doc, start, end, page_start, page_end, content, source, source_class, extractor,
     extractor_version, file_hash) = rows[0]
    if source_class != "pdf" or page_start is None:
        raise NoPageImage(_NOT_PDF)
    if not page_start <= page <= (page_end or page_start):
        raise NoPageImage(_NOT_CITED)
    if collection.base_dir is None:
        raise SourceChanged("no base directory configured: the source cannot be read")
    try:
        real_base, path = resolve_source(collection.base_dir, source)
        data = read_bounded(path, real_base)
    except Unresolvable as exc:
        if exc.reason == SOURCE_TOO_LARGE:
            raise PageImageTooLarge(f"the source file is larger than "
                                    f"{MAX_SOURCE_BYTES // (1024 * 1024)} MiB") from None
        raise SourceChanged(f"{exc.reason}: its pages are not shown") from None
    if len(data) > MAX_SOURCE_BYTES:
        raise PageImageTooLarge(f"the source file is larger than "
                                f"{MAX_SOURCE_BYTES // (1024 * 1024)} MiB")
    # The file may have changed elsewhere: what counts, as for fetch_chunk's verdict, is
    # whether the cited text is still at its offsets (checked below on a cache miss).
    digest = hashlib.sha256(data).hexdigest()
    key = (str(collection.path), collection.generation, digest, chunk_id, page, PAGE_WIDTH_PX)
    cached = CACHE.get(key)
    if cached is not None:
        return cached
    # The page count before any full parse: pdfium reads the page tree's /Count, in a child
    # (it is parsing an untrusted file), so a 3,000-page document is refused before pypdf
    # reads its pages. A /Count that lies is caught after extraction, below.
    try:
        pages = page_count(data, deadline)
    except ChildFailed:
        raise (SourceChanged(_CHANGED) if digest != file_hash
               else NoPageImage(_UNREADABLE)) from None
    if pages > MAX_PAGES:
        raise PageImageTooLarge(f"the document has more than {MAX_PAGES} pages")
    try:  # in a child, as fetch_chunk's re-extraction, within what is left of the deadline
        extracted = extract_bytes(data, PurePosixPath(source).suffix, serving=True,
                                  seconds=deadline - time.monotonic())
    except ExtractionBusy as exc:
        raise RenderBusy(str(exc)) from None
    except Exceeded as exc:
        if exc.kind == "time":
            raise RenderTimeout(_TIMED_OUT.format(RENDER_SECONDS)) from None
        raise PageImageTooLarge(f"the source cannot be re-extracted: {exc.reason}") from None
    except Skipped:
        raise SourceChanged(_EXTRACTED_DIFFERENTLY) from None
    if (extracted.extractor, extracted.extractor_version) != (extractor, extractor_version):
        raise SourceChanged(_EXTRACTED_DIFFERENTLY)
    if extracted.text[start:end] != content:
        raise SourceChanged(_CHANGED if digest != file_hash else _EXTRACTED_DIFFERENTLY)
    if len(extracted.page_starts) > MAX_PAGES:
        raise PageImageTooLarge(f"the document has more than {MAX_PAGES} pages")
    page_begin, text = page_texts(extracted.text, extracted.page_starts)[page - 1]
    local_start = max(0, start - page_begin)
    local_end = min(len(text), end - page_begin)
    image = render_page(data, text, local_start, local_end, page, deadline)
    CACHE.put(key, image)
    return image


async def render_bounded(fn) -> PageImage:
    """``fn(deadline)`` on a page-image worker, answered within RENDER_SECONDS of now
    (queueing included). MAX_RENDERS run at once, MAX_QUEUED more wait, beyond that
    ``RenderBusy``. ``fn`` passes the deadline on to pdfium's children, which are killed at
    it: a timed-out render frees its worker at once instead of rendering on."""
    import asyncio

    global _admitted
    with _admitted_lock:
        if _admitted >= MAX_RENDERS + MAX_QUEUED:
            raise RenderBusy("too many page images are being rendered; retry shortly")
        _admitted += 1
    deadline = time.monotonic() + RENDER_SECONDS

    def job():
        global _admitted
        try:
            if time.monotonic() >= deadline:
                return None  # its caller has given up: do not spend the time
            return fn(deadline)
        finally:
            with _admitted_lock:
                _admitted -= 1

    future = asyncio.get_running_loop().run_in_executor(_RENDERER, job)
    try:
        # The worker answers RenderTimeout itself once its child is killed and reaped at the
        # deadline; this is a backstop for the work around the children (reading and
        # re-extracting the source), a little later so it does not race the worker's answer.
        result = await asyncio.wait_for(asyncio.shield(future),
                                        timeout=RENDER_SECONDS + BACKSTOP_SECONDS)
    except asyncio.TimeoutError:
        # The worker ends on its own; its late answer is not wanted now.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        raise RenderTimeout(_TIMED_OUT.format(RENDER_SECONDS)) from None
    if result is None:
        raise RenderTimeout(_TIMED_OUT.format(RENDER_SECONDS))
    return result


class RenderBusy(Exception):
    """Past MAX_QUEUED: answered 503 with Retry-After, like a busy search."""
