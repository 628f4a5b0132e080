"""A PDF citation drawn on its page: the page rendered by pdfium, the cited span highlighted.

Read-only like every operation (adr/0027): the source is read under the base directory by
the rules a citation's check uses, rendered in memory, and the PNG kept only in a bounded
in-memory LRU; nothing is written anywhere.

The cited span is a range of the text pypdf extracted at ingest (``collection/extract.py``:
one ``page.extract_text()`` per page, pages joined by ``PDF_PAGE_SEPARATOR``). pdfium has
its own text of each page, with its own character indices and boxes, so the span is mapped
from one to the other: whitespace aside, the span's characters are found in pdfium's text
in the same order (the k-th occurrence for the k-th occurrence), line by line where the two
libraries order lines differently. A character pdfium does not have is not highlighted.

Nothing is drawn unless pypdf, the same version, extracts the cited text at the cited offsets
again (the test ``fetch_chunk``'s verdict makes): a changed source gets ``SourceChanged``,
never a highlight over other text.
"""

from __future__ import annotations

import hashlib
import threading
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import PurePosixPath

from ..collection.extract import PDF_PAGE_SEPARATOR, Skipped, extract_bytes
from ..errors import ChunkNotFound, NoPageImage, PageImageTooLarge, RenderTimeout, SourceChanged
from .citations import _TOO_LARGE, _Unresolvable, _read_bounded, _resolve_source

# -- the bounds (docs/api.md#page-images) ---------------------------------------------------

MAX_SOURCE_BYTES = 64 * 1024 * 1024  # the ingest limit (extract.MAX_FILE_BYTES)
MAX_PAGES = 1000                     # pages in the document (pypdf re-reads all of them)
PAGE_WIDTH_PX = 1000                 # every page image is this wide
MAX_SCALE = 4.0                      # a tiny page is not blown up further than this
MAX_PAGE_PIXELS = 4_000_000          # width x height; a very tall page is refused
RENDER_SECONDS = 20.0                # from the request to the PNG, queueing included
MAX_QUEUED = 4                       # renders waiting at once; more get "busy"
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


# -- rendering --------------------------------------------------------------------------------


def render_page(data: bytes, page_text: str, start: int, end: int, page: int) -> PageImage:
    """Page ``page`` (1-based) of the PDF ``data``, with ``page_text[start:end]`` highlighted.

    ``page_text`` is pypdf's text of that page, as ingest extracted it."""
    import pypdfium2 as pdfium

    doc = pdfium.PdfDocument(data)
    try:
        if len(doc) > MAX_PAGES:
            raise PageImageTooLarge(f"the document has more than {MAX_PAGES} pages")
        pdf_page = doc[page - 1]
        textpage = pdf_page.get_textpage()
        indices = map_span(page_text, start, end, _pdfium_text(textpage))
        boxes = line_boxes(textpage, indices)
        width_pt, height_pt = pdf_page.get_size()  # as shown: /Rotate already applied
        if width_pt <= 0 or height_pt <= 0:
            raise PageImageTooLarge("the page has no area to render")
        scale = min(MAX_SCALE, PAGE_WIDTH_PX / width_pt)
        if (width_pt * scale) * (height_pt * scale) > MAX_PAGE_PIXELS:
            raise PageImageTooLarge(
                f"the page is too tall to render within {MAX_PAGE_PIXELS:,} pixels")
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
        return PageImage(encode_png(pixels), width, height, page, tuple(indices), tuple(boxes),
                         tuple(rects))
    finally:
        doc.close()


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
# pdfium is not thread-safe: one render at a time, on this one thread.
_RENDERER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="groundkit-pdfium")
_queued = 0
_queued_lock = threading.Lock()


def cited_pages(chunk) -> list[int]:
    """The pages a chunk page shows images of: its pages, at most MAX_PAGES_SHOWN."""
    if chunk.page_start is None or not str(chunk.source).lower().endswith(".pdf"):
        return []
    last = chunk.page_end if chunk.page_end is not None else chunk.page_start
    return list(range(chunk.page_start, min(last, chunk.page_start + MAX_PAGES_SHOWN - 1) + 1))


def chunk_page_image(collection, chunk_id: str, page: int, hidden_documents=()) -> PageImage:
    """Page ``page`` of the PDF chunk ``chunk_id`` cites, the span highlighted (blocking).

    A chunk of a document in ``hidden_documents`` is not found, in a missing chunk's words."""
    from .models import FetchChunkRequest

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
        real_base, path = _resolve_source(collection.base_dir, source)
        data = _read_bounded(path, real_base)
    except _Unresolvable as exc:
        if exc.reason == _TOO_LARGE:
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
    try:
        extracted = extract_bytes(data, PurePosixPath(source).suffix)
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
    image = render_page(data, text, local_start, local_end, page)
    CACHE.put(key, image)
    return image


async def render_bounded(fn, *args) -> PageImage:
    """``fn(*args)`` on the pdfium thread, within RENDER_SECONDS (queueing included)."""
    import asyncio
    import time

    global _queued
    with _queued_lock:
        if _queued >= MAX_QUEUED:
            raise RenderBusy("too many page images are being rendered; retry shortly")
        _queued += 1
    deadline = time.monotonic() + RENDER_SECONDS

    def job():
        global _queued
        try:
            if time.monotonic() > deadline:
                return None  # its caller has given up: do not spend the time
            return fn(*args)
        finally:
            with _queued_lock:
                _queued -= 1

    future = asyncio.get_running_loop().run_in_executor(_RENDERER, job)
    try:
        result = await asyncio.wait_for(asyncio.shield(future), timeout=RENDER_SECONDS)
    except asyncio.TimeoutError:
        raise RenderTimeout(
            f"the page image was not ready within {RENDER_SECONDS:g} seconds") from None
    if result is None:
        raise RenderTimeout(f"the page image was not ready within {RENDER_SECONDS:g} seconds")
    return result


class RenderBusy(Exception):
    """Past MAX_QUEUED: answered 503 with Retry-After, like a busy search."""
