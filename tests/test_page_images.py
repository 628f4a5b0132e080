"""PDF citations drawn on their page: the chunk page's page image, its mapping from the
indexed text to pdfium's characters, its checks (permissions, Host, source changed) and its
bounds. Real PDFs (tests/pdf_support.py), real ingest, a real Datasette app, real pdfium."""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import numpy as np
import pypdfium2 as pdfium
import pytest
from datasette.app import Datasette

from groundkit_datasette.indexing.extract import Skipped, extract_bytes
from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.retrieval import page_render
from groundkit_datasette.retrieval.page_render import (
    PAGE_WIDTH_PX, PageImageCache, PageImage, chunk_page_image, map_span, page_texts,
)

from .conftest import snapshot
from .pdf_support import make_pdf, pdf_stream, write_pdf

REPORT = [
    ["Field report: the north array",
     "Mirrors were cleaned on Tuesday and again on Friday.",
     "Output rose by twelve percent after the cleaning.",
     "The inverter log shows no faults this week."],
    ["Maintenance notes",
     "Turbine blades need inspection before the storm season.",
     "Output rose by twelve percent after the cleaning.",
     "Order two spare gearboxes for the west ridge."],
]


def decode_png(data: bytes) -> np.ndarray:
    """Our encoder's PNGs (8-bit RGB, filter 0) back to pixels: a reader independent of it
    would need Pillow, which the package does not depend on."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        assert zlib.crc32(kind + body) == int.from_bytes(data[pos + 8 + length:pos + 12 + length], "big")
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height = int.from_bytes(header[:4], "big"), int.from_bytes(header[4:8], "big")
    assert header[8:10] == bytes([8, 2])
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, width * 3 + 1)
    assert not raw[:, 0].any()  # filter type 0 on every row
    return raw[:, 1:].reshape(height, width, 3)


def highlighted(pixels: np.ndarray, box) -> bool | None:
    """Whether the paper inside a pixel box (x0, y0, x1, y1) is under the highlight: True
    when no pixel is white paper and many are yellow (red high, blue low), False when none
    is yellow, None for anything in between (which the tests treat as a failure)."""
    x0, y0, x1, y1 = (int(round(v)) for v in box)
    area = pixels[y0:y1 + 1, x0:x1 + 1].reshape(-1, 3).astype(int)
    assert len(area), box
    white = (area > 235).all(axis=1).mean()
    yellow = ((area[:, 0] > 200) & (area[:, 2] < 150)).mean()
    if white == 0 and yellow > 0.3:
        return True
    if yellow == 0:
        return False
    return None


def word_boxes(pdf: bytes, page: int, word: str, occurrence: int = 0) -> list[tuple]:
    """pdfium's own boxes of ``word`` on ``page`` (found by pdfium's search, not our mapping)."""
    doc = pdfium.PdfDocument(pdf)
    try:
        textpage = doc[page - 1].get_textpage()
        searcher = textpage.search(word, match_case=True, match_whole_word=True)
        for _ in range(occurrence + 1):
            found = searcher.get_next()
        index, count = found
        return [textpage.get_charbox(i) for i in range(index, index + count)]
    finally:
        doc.close()


def to_pixels(box, pdf: bytes, page: int):
    """A page-space box in the image's pixels: the page is PAGE_WIDTH_PX wide, y from the top."""
    doc = pdfium.PdfDocument(pdf)
    try:
        width, height = doc[page - 1].get_size()
    finally:
        doc.close()
    scale = PAGE_WIDTH_PX / width
    left, bottom, right, top = box
    return (left * scale, (height - top) * scale, right * scale, (height - bottom) * scale)


@pytest.fixture
def pdf_corpus(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pdf = make_pdf(REPORT)
    (corpus / "report.pdf").write_bytes(pdf)
    (corpus / "notes.md").write_text("# Notes\n\nThe gearbox order went out on Monday.\n",
                                     encoding="utf-8")
    secret = make_pdf([["Board minutes", "The acquisition of the west ridge farm is agreed."]])
    (corpus / "board.pdf").write_bytes(secret)
    (corpus / "board.pdf.acl.json").write_text(json.dumps({"users": ["alice"]}), encoding="utf-8")
    index_dir = tmp_path / "index"
    index_dir.mkdir()
    # Small chunks: the second page's repeated sentence is its own chunk.
    ingest([corpus], collection="plant", index_dir=index_dir, embedder="none",
           chunk_size=60, chunk_overlap=0)
    page_render.CACHE = PageImageCache()
    return corpus, index_dir, pdf


def make_ds(index_dir: Path, corpus: Path, **settings) -> Datasette:
    return Datasette(files=[], immutables=[str(index_dir / "plant.sqlite3")],
                     metadata={"plugins": {"groundkit": {"base_dir": str(corpus), **settings}}})


def chunk_with(index_dir: Path, needle: str, page: int | None = None) -> str:
    import sqlite3

    conn = sqlite3.connect(f"file:{index_dir / 'plant.sqlite3'}?immutable=1", uri=True)
    try:
        rows = conn.execute("SELECT chunk_id, page_start FROM chunks WHERE content LIKE ? "
                            "ORDER BY page_start", (f"%{needle}%",)).fetchall()
    finally:
        conn.close()
    return next(cid for cid, p in rows if page is None or p == page)


def image_path(chunk_id: str, page: int) -> str:
    return f"/plant/-/groundkit/chunks/{chunk_id}/pages/{page}.png"


async def test_the_highlight_falls_on_the_cited_words(pdf_corpus):
    """The second page repeats a first-page sentence: the chunk on page 2 is drawn on page 2,
    over pdfium's own boxes of its words, and not over the words around it."""
    corpus, index_dir, pdf = pdf_corpus
    ds = make_ds(index_dir, corpus)
    chunk_id = chunk_with(index_dir, "Output rose", page=2)
    r = await ds.client.get(image_path(chunk_id, 2))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "image/png"
    assert r.headers["cache-control"] == "private, no-cache"
    pixels = decode_png(r.content)
    assert pixels.shape[1] == PAGE_WIDTH_PX
    for word in ("Output", "twelve", "cleaning"):
        boxes = word_boxes(pdf, 2, word)
        assert all(highlighted(pixels, to_pixels(b, pdf, 2)) is True for b in boxes), word
    for word in ("Turbine", "gearboxes", "Maintenance"):  # other lines of the page
        assert all(highlighted(pixels, to_pixels(b, pdf, 2)) is False for b in word_boxes(pdf, 2, word)), word
    # The characters drawn are, whitespace aside, exactly the chunk's text.
    col_image = await _image_object(ds, chunk_id, 2)
    doc = pdfium.PdfDocument(pdf)
    try:
        textpage = doc[1].get_textpage()
        drawn = "".join(textpage.get_text_range(i, 1) for i in col_image.char_indices)
    finally:
        doc.close()
    content = (await ds.client.get(f"/plant/-/groundkit/chunks/{chunk_id}.json")).json()["chunk"]["content"]
    assert re.sub(r"\s", "", drawn) == re.sub(r"\s", "", content)
    # Page 1 holds the same sentence; its image shows page 1's chunk there, not page 2's.
    first = chunk_with(index_dir, "Output rose", page=1)
    if first != chunk_id:
        p1 = decode_png((await ds.client.get(image_path(first, 1))).content)
        assert all(highlighted(p1, to_pixels(b, pdf, 1)) is True for b in word_boxes(pdf, 1, "twelve"))


async def _image_object(ds, chunk_id, page) -> PageImage:
    from groundkit_datasette.surfaces.service import registry_for

    col = await registry_for(ds).get("plant", None)
    return chunk_page_image(col, chunk_id, page)


def test_map_span_finds_the_kth_occurrence_and_reordered_lines():
    page = "alpha beta\ngamma beta\ndelta"
    pdfium_text = "alpha beta\r\ngamma beta\r\ndelta"
    start = page.index("beta", 6)  # the second "beta"
    got = map_span(page, start, start + 4, pdfium_text + "x")  # texts differ: no fast path
    assert "".join(pdfium_text[i] for i in got) == "beta" and got[0] == pdfium_text.index("beta", 6)
    # pdfium reads the two lines the other way round (a rotated page does).
    page = "Second page here\nTurbine blades need inspection."
    pdfium_text = "Turbine blades need inspection.\r\nSecond page here"
    got = map_span(page, 0, len(page), pdfium_text)
    assert re.sub(r"\s", "", "".join(pdfium_text[i] for i in got)) == re.sub(r"\s", "", pdfium_text)
    # A character pdfium does not have is left out, not guessed.
    assert map_span("abc", 0, 3, "xyz") == []


def test_a_rotated_page_is_highlighted_where_its_words_are_shown():
    pdf = make_pdf([["Sideways text on a turned page", "and a second line below it"]],
                   rotate={0: 90})
    extracted = extract_bytes(pdf, ".pdf")
    _, text = page_texts(extracted.text, extracted.page_starts)[0]
    start = text.index("second")
    image = page_render.render_page(pdf, text, start, start + len("second line"), 1)
    pixels = decode_png(image.png)
    assert image.width > image.height  # shown turned, as a viewer shows it
    doc = pdfium.PdfDocument(pdf)
    try:
        page = doc[0]
        bitmap = page.render(scale=image.width / page.get_size()[0])
        convert = bitmap.get_posconv(page)
        def shown(box):
            xs, ys = zip(*(convert.to_bitmap(x, y) for x in box[::2] for y in box[1::2]))
            return min(xs), min(ys), max(xs), max(ys)

        assert all(highlighted(pixels, shown(b)) is True for b in word_boxes(pdf, 1, "second"))
        assert all(highlighted(pixels, shown(b)) is False for b in word_boxes(pdf, 1, "Sideways"))
    finally:
        doc.close()


async def test_the_chunk_page_shows_the_page_and_nothing_is_written(pdf_corpus, tmp_path):
    corpus, index_dir, _pdf = pdf_corpus
    before = snapshot(tmp_path)
    ds = make_ds(index_dir, corpus)
    chunk_id = chunk_with(index_dir, "Turbine blades")
    r = await ds.client.get(f"/plant/-/groundkit/chunks/{chunk_id}")
    assert r.status_code == 200
    src = f"/plant/-/groundkit/chunks/{chunk_id}/pages/2.png"
    assert f'src="{src}"' in r.text and 'alt="Page 2 of report.pdf, the cited text highlighted"' in r.text
    assert (await ds.client.get(src)).status_code == 200
    cached = len(page_render.CACHE)
    assert cached == 1 and page_render.CACHE.size > 0
    assert (await ds.client.get(src)).status_code == 200
    assert len(page_render.CACHE) == cached  # served from memory
    assert snapshot(tmp_path) == before  # no file anywhere under the corpus or the index
    # A chunk of a Markdown file has no page image (and its page says nothing about one).
    md = chunk_with(index_dir, "gearbox order")
    assert "gk-page-image" not in (await ds.client.get(f"/plant/-/groundkit/chunks/{md}")).text
    r = await ds.client.get(image_path(md, 1))
    assert r.status_code == 404 and r.json()["error"] == "no_page_image"


async def test_a_changed_or_missing_source_is_said_not_drawn(pdf_corpus):
    corpus, index_dir, pdf = pdf_corpus
    ds = make_ds(index_dir, corpus)
    chunk_id = chunk_with(index_dir, "Turbine blades")
    # Another page edited, every offset kept: the citation still verifies, so it is drawn.
    edited = [[line.replace("Friday", "Monday") for line in REPORT[0]], REPORT[1]]
    (corpus / "report.pdf").write_bytes(make_pdf(edited))
    chunk = (await ds.client.get(f"/plant/-/groundkit/chunks/{chunk_id}.json")).json()
    assert chunk["verification"]["status"] == "verified"
    assert (await ds.client.get(image_path(chunk_id, 2))).status_code == 200
    changed = make_pdf([REPORT[0], ["Maintenance notes", "Something else entirely now."]])
    (corpus / "report.pdf").write_bytes(changed)
    r = await ds.client.get(image_path(chunk_id, 2))
    assert r.status_code == 409 and r.json()["error"] == "source_changed"
    assert "changed since it was ingested" in r.json()["detail"]
    page = await ds.client.get(f"/plant/-/groundkit/chunks/{chunk_id}")
    assert "gk-page-image" not in page.text and "The page is not shown" in page.text
    (corpus / "report.pdf").unlink()
    r = await ds.client.get(image_path(chunk_id, 2))
    assert r.status_code == 409 and r.json()["detail"].startswith("source file not found")
    assert str(corpus) not in r.text and "Traceback" not in r.text
    # Back as ingested: drawn again.
    (corpus / "report.pdf").write_bytes(pdf)
    assert (await ds.client.get(image_path(chunk_id, 2))).status_code == 200


async def test_a_reader_who_may_not_read_the_document_gets_what_a_hidden_chunk_gets(pdf_corpus):
    corpus, index_dir, _pdf = pdf_corpus
    ds = make_ds(index_dir, corpus)
    secret = chunk_with(index_dir, "acquisition")
    missing = "c_" + "0" * 24
    hidden_page = await ds.client.get(f"/plant/-/groundkit/chunks/{secret}.json")
    assert hidden_page.status_code == 404
    for chunk_id in (secret, missing):
        r = await ds.client.get(image_path(chunk_id, 1))
        assert r.status_code == 404
        assert r.json()["error"] == "chunk_not_found" and r.json()["detail"] == "chunk not found"
    alice = {"ds_actor": ds.sign({"a": {"id": "alice"}}, "actor")}
    r = await ds.client.get(image_path(secret, 1), cookies=alice)
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    # A collection the reader may not view: as if it did not exist.
    closed = Datasette(files=[], immutables=[str(index_dir / "plant.sqlite3")], metadata={
        "databases": {"plant": {"allow": {"id": "alice"}}},
        "plugins": {"groundkit": {"base_dir": str(corpus)}}})
    r = await closed.client.get(image_path(secret, 1))
    assert r.status_code == 404 and r.json()["error"] == "collection_not_found"


async def test_the_boundary_checks_the_host_and_the_policy_allows_the_image(pdf_corpus):
    corpus, index_dir, _pdf = pdf_corpus
    ds = make_ds(index_dir, corpus)
    chunk_id = chunk_with(index_dir, "Turbine blades")
    r = await ds.client.get(image_path(chunk_id, 2), headers={"host": "evil.example"})
    assert r.status_code == 403 and "host_not_allowed" in r.text
    page = await ds.client.get(f"/plant/-/groundkit/chunks/{chunk_id}")
    policy = page.headers["content-security-policy"]
    assert re.search(r"img-src 'self'", policy)  # the image is served same-origin
    r = await ds.client.get(image_path(chunk_id, 2))
    assert r.headers["x-content-type-options"] == "nosniff"
    # A published server answers the image only with a token, like the page.
    published = make_ds(index_dir, corpus, allow_remote_access=True)
    r = await published.client.get(image_path(chunk_id, 2))
    assert r.status_code == 401


@pytest.mark.parametrize("bound,value,status,kind,words", [
    ("MAX_SOURCE_BYTES", 100, 413, "page_image_too_large", "larger than"),
    ("MAX_PAGES", 1, 413, "page_image_too_large", "more than 1 pages"),
    ("MAX_PAGE_PIXELS", 1000, 413, "page_image_too_large", "too tall"),
    ("RENDER_SECONDS", 0, 422, "render_timeout", "not ready within"),
])
async def test_past_a_bound_the_answer_is_413_or_422(pdf_corpus, monkeypatch, bound, value,
                                                     status, kind, words):
    corpus, index_dir, _pdf = pdf_corpus
    ds = make_ds(index_dir, corpus)
    chunk_id = chunk_with(index_dir, "Turbine blades")
    monkeypatch.setattr(page_render, bound, value)
    r = await ds.client.get(image_path(chunk_id, 2))
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"] == kind and words in body["detail"] and body["request_id"]
    assert str(corpus) not in r.text and "Traceback" not in r.text
    # A person who opened the address in a tab gets a page saying so.
    r = await ds.client.get(image_path(chunk_id, 2), headers={"accept": "text/html,*/*"})
    assert r.status_code == status and "<h1>Page image</h1>" in r.text and words in r.text
    assert 'href="/plant/-/groundkit/chunks/' in r.text


async def test_pages_outside_the_citation_and_bad_addresses(pdf_corpus):
    corpus, index_dir, _pdf = pdf_corpus
    ds = make_ds(index_dir, corpus)
    chunk_id = chunk_with(index_dir, "Turbine blades")
    r = await ds.client.get(image_path(chunk_id, 1))
    assert r.status_code == 404 and r.json()["detail"] == "that page is not part of this citation"
    for page in ("0", "-1", "x", "1234567", "%31"):
        r = await ds.client.get(f"/plant/-/groundkit/chunks/{chunk_id}/pages/{page}.png")
        assert r.status_code == 422 and r.json()["detail"].startswith("page: must be"), page
    r = await ds.client.get(image_path("not-a-chunk", 1))
    assert r.status_code == 422 and r.json()["error"] == "malformed_request"
    r = await ds.client.get(f"/a.b/-/groundkit/chunks/{chunk_id}/pages/1.png")
    assert r.status_code == 400


def test_the_cache_is_bounded_by_bytes_and_entries():
    cache = PageImageCache(max_bytes=100, max_entries=3)

    def image(n):
        return PageImage(b"x" * n, 1, 1, 1, (), (), ())

    for key in "abc":
        cache.put(key, image(30))
    assert len(cache) == 3 and cache.size == 90
    cache.get("a")  # used: "b" is now the oldest
    cache.put("d", image(30))
    assert cache.get("b") is None and cache.get("a") is not None and len(cache) == 3
    cache.put("e", image(80))
    assert cache.size <= 100 and cache.get("e") is not None
    cache.put("huge", image(101))  # larger than the whole cache: not kept
    assert cache.get("huge") is None


async def test_pdf_hits_are_told_apart_by_their_pages(pdf_corpus):
    """A PDF has no headings: its hits are titled by page, not all by the file's name."""
    corpus, index_dir, _pdf = pdf_corpus
    ds = make_ds(index_dir, corpus)
    r = await ds.client.get("/plant/-/groundkit/search?q=output+rose+twelve+percent&top_k=2")
    titles = re.findall(r'<h3[^>]*>.*?<a [^>]*>([^<]+)</a>', r.text, re.S)
    assert sorted(titles) == ["report.pdf, page 1", "report.pdf, page 2"], titles


# -- hostile PDFs: a page that renders for hours, one that needs gigabytes, 1,001 pages ----


def nested_pdf(depth: int, *, masks: bool) -> bytes:
    """One page of two text lines over ``depth`` levels of forms, each drawing the next twice.

    ``masks``: each level fills a square through a soft mask that is the next level, so pdfium
    draws 2**depth masks one after another in little memory (depth 16 took 16 s here, depth 19
    115 s at 29 MB: depth 24 would take about an hour). Without: plain nested form XObjects,
    which pdfium expands when it loads the page (depth 20 took 2.7 GB here). pypdf reads the
    text and ignores soft masks; it stops following forms after 5,000 invocations."""
    objects: list[bytes] = [b"<< /Type /Catalog /Pages 2 0 R >>", b"",
                            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    inner = None
    for _level in range(depth + 1):
        if masks:
            group = b"/Type /XObject /Subtype /Form /BBox [0 0 612 792] " \
                    b"/Group << /S /Transparency /CS /DeviceGray >>"
            if inner is None:
                form = add(pdf_stream(group, b"0 0 100 100 re f"))
            else:
                form = add(pdf_stream(group + b" /Resources << /ExtGState << /G %d 0 R >> >>" % inner,
                                   b"/G gs 0 0 100 100 re f /G gs 0 0 100 100 re f"))
            inner = add(b"<< /Type /ExtGState /SMask << /Type /Mask /S /Luminosity /G %d 0 R >> >>"
                        % form)
        else:
            form = b"/Type /XObject /Subtype /Form /BBox [0 0 612 792]"
            inner = add(pdf_stream(form, b"0 0 1 1 re f") if inner is None else pdf_stream(
                form + b" /Resources << /XObject << /X %d 0 R >> >>" % inner, b"/X Do /X Do"))
    draw = b"q /G gs 0 0 100 100 re f Q" if masks else b"q /X Do Q"
    content = add(pdf_stream(b"", b"BT /F1 12 Tf 18 TL 72 720 Td (A page that is slow to draw) Tj "
                                b"T* (and hard to stop) Tj ET " + draw))
    resource = b"/ExtGState << /G %d 0 R >>" % inner if masks else b"/XObject << /X %d 0 R >>" % inner
    page = add(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
               b"/Resources << /Font << /F1 3 0 R >> %s >> >>" % (content, resource))
    objects[1] = b"<< /Type /Pages /Kids [%d 0 R] /Count 1 >>" % page
    return write_pdf(objects, 1)


@pytest.fixture
def hostile_corpus(tmp_path):
    """report.pdf, and beside it a page that renders for about an hour, one that needs
    gigabytes of memory, and a document of 1,001 pages."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "report.pdf").write_bytes(make_pdf(REPORT))
    (corpus / "slow.pdf").write_bytes(nested_pdf(24, masks=True))
    (corpus / "huge.pdf").write_bytes(nested_pdf(20, masks=False))
    (corpus / "long.pdf").write_bytes(make_pdf([[f"Folio {n} of the long register"]
                                                for n in range(1, 1002)]))
    index_dir = tmp_path / "index"
    index_dir.mkdir()
    ingest([corpus], collection="plant", index_dir=index_dir, embedder="none",
           chunk_size=60, chunk_overlap=0)
    page_render.CACHE = PageImageCache()
    return corpus, index_dir


def pdfium_children() -> list[int]:
    """The live children of this process's fork server: the pdfium (or parser) children."""
    from groundkit_datasette.indexing.isolation import server_pid

    server = server_pid()
    if server is None:
        return []
    children = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # not a process, or one that just ended
        if int(fields[1]) == server and fields[0] != "Z":
            children.append(int(entry.name))
    return children


async def until(condition, what: str, limit: float = 120.0):
    """Wait (generously) for ``condition()`` to be true; its value. A sync point, not a timing."""
    import asyncio
    import time

    give_up = time.monotonic() + limit
    while not (value := condition()):
        assert time.monotonic() < give_up, f"never happened: {what}"
        await asyncio.sleep(0.02)
    return value


async def test_a_slow_page_times_out_is_killed_and_does_not_hold_up_other_pages(
        hostile_corpus, monkeypatch):
    """Issue 33.5: a render past the deadline answers render_timeout, its pdfium child is
    killed (no process left), and an ordinary page asked for meanwhile is drawn at once."""
    import asyncio

    corpus, index_dir = hostile_corpus
    monkeypatch.setattr(page_render, "RENDER_SECONDS", 6.0)  # 20x an ordinary page here
    ds = make_ds(index_dir, corpus)
    slow = asyncio.ensure_future(ds.client.get(image_path(_chunk_of(index_dir, "slow.pdf"), 1)))
    await until(lambda: pdfium_children() or slow.done(), "the slow page in a pdfium child")
    r = await ds.client.get(image_path(chunk_with(index_dir, "Turbine blades"), 2))
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    assert not slow.done()  # drawn while the slow page was still being rendered
    rendering = await until(pdfium_children, "the slow page's pdfium child")
    assert len(rendering) == 1  # the slow page's; the ordinary page's children are gone
    r = await slow
    assert r.status_code == 422 and r.json()["error"] == "render_timeout", r.text
    assert "not ready within 6 seconds" in r.json()["detail"]
    assert not any(Path(f"/proc/{pid}").exists() for pid in rendering)  # killed and reaped
    assert pdfium_children() == []


async def test_a_timed_out_render_frees_its_slot_and_past_the_slots_the_answer_is_busy(
        hostile_corpus, monkeypatch):
    """Every slot taken by a slow page: the next request is busy (503); at the deadline the
    slow pages' children are killed and the slots are free at once, not when pdfium is done."""
    import asyncio

    corpus, index_dir = hostile_corpus
    monkeypatch.setattr(page_render, "RENDER_SECONDS", 6.0)
    # None waiting: a request with a child was admitted, so two children mean no slot is left.
    monkeypatch.setattr(page_render, "MAX_QUEUED", 0)
    ds = make_ds(index_dir, corpus)
    slow_page = image_path(_chunk_of(index_dir, "slow.pdf"), 1)
    ordinary = image_path(chunk_with(index_dir, "Turbine blades"), 2)
    slow = [asyncio.ensure_future(ds.client.get(slow_page)) for _ in range(page_render.MAX_RENDERS)]
    await until(lambda: len(pdfium_children()) == page_render.MAX_RENDERS
                or any(s.done() for s in slow), "every slow page in a pdfium child")
    r = await ds.client.get(ordinary)
    assert r.status_code == 503 and r.json()["error"] == "server_busy"
    assert r.headers["retry-after"] == "1"
    assert not any(s.done() for s in slow)
    for r in await asyncio.gather(*slow):
        assert r.status_code == 422 and r.json()["error"] == "render_timeout"
    assert pdfium_children() == []
    assert (await ds.client.get(ordinary)).status_code == 200


async def test_a_page_that_needs_gigabytes_is_stopped_at_the_memory_limit(hostile_corpus):
    corpus, index_dir = hostile_corpus
    ds = make_ds(index_dir, corpus)
    r = await ds.client.get(image_path(_chunk_of(index_dir, "huge.pdf"), 1))
    assert r.status_code == 404 and r.json()["error"] == "no_page_image", r.text
    assert "could not draw this page within its limits" in r.json()["detail"]
    assert "Traceback" not in r.text and str(corpus) not in r.text
    assert pdfium_children() == []
    assert (await ds.client.get(image_path(chunk_with(index_dir, "Turbine blades"), 2))
            ).status_code == 200


def _chunk_of(index_dir: Path, source: str) -> str:
    import sqlite3

    conn = sqlite3.connect(f"file:{index_dir / 'plant.sqlite3'}?immutable=1", uri=True)
    try:
        return conn.execute("SELECT c.chunk_id FROM chunks c JOIN documents d USING (document_id) "
                            "WHERE d.source = ? ORDER BY c.start_offset", (source,)).fetchone()[0]
    finally:
        conn.close()


async def test_a_document_over_max_pages_is_refused_before_pypdf_reads_its_pages(
        hostile_corpus):
    """The page count comes from the page tree's /Count, not from extracting every page.
    Shown by a file whose pages no longer hold their text: a full parse would find the
    citation gone (409 source_changed); the answer is the page bound, before any parse."""
    corpus, index_dir = hostile_corpus
    ds = make_ds(index_dir, corpus)
    chunk_id = _chunk_of(index_dir, "long.pdf")
    r = await ds.client.get(image_path(chunk_id, 1))
    assert r.status_code == 413 and r.json()["error"] == "page_image_too_large"
    assert r.json()["detail"] == "the document has more than 1000 pages"
    long_pdf = corpus / "long.pdf"
    blanked = long_pdf.read_bytes().replace(b") Tj", b") Tx")  # same length: xref still right
    assert blanked != long_pdf.read_bytes()
    with pytest.raises(Skipped, match="no text layer"):
        extract_bytes(blanked, ".pdf")  # what a full parse would now say
    long_pdf.write_bytes(blanked)
    r = await ds.client.get(image_path(chunk_id, 1))
    assert r.status_code == 413 and r.json()["error"] == "page_image_too_large", r.text
    assert pdfium_children() == []
