"""The browsable UI: real pages in a real browser (Debian's Chromium driven by Playwright),
plus the HTML pages' status codes and escaping through Datasette's test client.

The browser tests use plain sync functions: Playwright's sync API cannot run inside
an asyncio loop, so the server runs in a thread of its own.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest
from datasette.app import Datasette
from playwright.sync_api import expect, sync_playwright

from groundkit_datasette import datasette_plugin as gk_plugin
from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.surfaces.pages import QueryTerms, citation_text, highlight

from .browser_support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    REPO,
    LiveServer,
    artifacts_dir,
    README_SHOTS,
    axe_violations,
    horizontal_overflow,
    mark_png,
    page_problems,
)
from .conftest import write_corpus

XSS_NOTE = "Beware of <script>alert(1)</script> pasted into meeting notes.\n"
PHONE = {"width": 375, "height": 812}


# -- building and serving collections -------------------------------------------------


def build(tmp_path: Path, names=("energy",)) -> SimpleNamespace:
    corpus = write_corpus(tmp_path / "corpus")
    (corpus / "notes" / "meeting.txt").write_text(XSS_NOTE, encoding="utf-8")
    index_dir = tmp_path / "index"
    index_dir.mkdir()
    for name in names:
        ingest([corpus], collection=name, index_dir=index_dir, embedder="none")
    return SimpleNamespace(corpus=corpus, index_dir=index_dir)


def make_ds(built, names=("energy",), databases=None) -> Datasette:
    metadata = {"plugins": {"groundkit": {"base_dir": str(built.corpus)}}}
    if databases:
        metadata["databases"] = databases
    paths = [str(built.index_dir / f"{n}.sqlite3") for n in names]
    return Datasette(files=[], immutables=paths, metadata=metadata)


def chunk_id_for(db_path: Path, needle: str) -> str:
    conn = sqlite3.connect(f"file:{db_path}?immutable=1", uri=True)
    try:
        return conn.execute(
            "SELECT chunk_id FROM chunks WHERE content LIKE ?", (f"%{needle}%",)
        ).fetchone()[0]
    finally:
        conn.close()


@pytest.fixture
def built(tmp_path):
    return build(tmp_path)


@pytest.fixture
def ds(built):
    return make_ds(built)


@pytest.fixture
def live(ds, built):
    with LiveServer(ds) as server:
        server.corpus = built.corpus
        yield server


# -- the browser ----------------------------------------------------------------------


class _ArtifactsReport:
    """Names the screenshot directory in pytest's summary, even under -q."""

    def pytest_terminal_summary(self, terminalreporter):
        terminalreporter.write_line(f"groundkit browser screenshots: {artifacts_dir()}")


@pytest.fixture
def browser(request):
    # Per test, not per session: while Playwright's sync API is alive its event loop
    # counts as running, which would break the async client tests in this module.
    # A missing browser fails the run: CI installs it (.ci/run), so it must be there.
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run scripts/setup-test-system"
    if not request.config.pluginmanager.has_plugin("groundkit-artifacts"):
        request.config.pluginmanager.register(_ArtifactsReport(), "groundkit-artifacts")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def context(browser):
    ctx = browser.new_context(viewport={"width": 1024, "height": 768})
    yield ctx
    ctx.close()


@pytest.fixture
def page(context):
    page = context.new_page()
    dialogs, refused = [], []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    # The pages' Content-Security-Policy (adr/0011) must not block anything they ship.
    page.on("console", lambda m: "Content Security Policy" in m.text and refused.append(m.text))
    page.dialogs = dialogs
    yield page
    assert refused == []


def shot(page, name: str, full_page: bool = True) -> Path:
    path = artifacts_dir() / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def assert_accessible(page):
    assert page_problems(page) == []


def badge(page):
    return page.locator(".gk-badge")


# -- tests in the browser --------------------------------------------------------------


def test_search_open_a_hit_and_watch_its_citation_drift(live, page):
    solar = live.corpus / "solar.md"

    page.goto(live.url + "/-/groundkit")
    expect(page.get_by_role("heading", level=1)).to_have_text("Collections")
    expect(page.locator(".gk-card")).to_contain_text("5 documents")
    assert_accessible(page)
    shot(page, "collections")

    page.get_by_role("link", name="energy", exact=True).first.click()
    expect(page).to_have_url(re.compile(r"/energy/-/groundkit$"))
    expect(page.get_by_role("heading", level=1)).to_have_text("energy")
    assert_accessible(page)
    shot(page, "status")

    page.get_by_label("Query").fill("battery storage")
    page.get_by_role("button", name="Search").click()
    expect(page).to_have_url(re.compile(r"/energy/-/groundkit/search\?q=battery\+storage"))
    hits = page.locator(".gk-hit")
    expect(hits.first).to_contain_text("solar.md")
    expect(hits.first).to_contain_text("Solar power > Storage")
    expect(hits.first.locator("mark").first).to_have_text("Storage")
    marks = hits.first.locator("mark").all_inner_texts()
    assert "Batteries" in marks  # stem match: battery ~ batteries
    # The mode selector says why dense search is off; so does the rerank toggle.
    expect(page.locator("#gk-mode option[value=dense]")).to_be_disabled()
    expect(page.locator("#gk-mode-help")).to_contain_text("without embeddings")
    expect(page.locator("#gk-rerank")).to_be_disabled()
    expect(page.locator("#gk-rerank-help")).to_contain_text("no reranker")
    assert_accessible(page)
    shot(page, "search")

    hits.first.locator("h3 a").click()
    expect(page).to_have_url(re.compile(r"/energy/-/groundkit/chunks/c_[0-9a-f]{24}$"))
    expect(badge(page)).to_have_text(re.compile("verified"))
    expect(page.locator("mark.gk-cited")).to_contain_text("Batteries store surplus energy")
    expect(page.locator("pre.gk-source-text")).to_contain_text("Photovoltaic panels")
    permalink = page.locator("#gk-permalink").input_value()
    assert permalink == page.url
    assert page.locator("#gk-citation").input_value().startswith("solar.md:6-8 [c_")
    copy = page.get_by_role("button", name="Copy citation")
    expect(copy).to_be_visible()  # shown by the script only
    copy.click()
    expect(page.locator("#gk-copy-status")).not_to_be_empty()
    assert_accessible(page)
    shot(page, "chunk-verified")

    # Lines inserted above the span: the text still exists, further down.
    original = solar.read_text(encoding="utf-8")
    moved = original.replace("## Storage", "Inverters turn direct current into mains power.\n"
                             "They sit between the panels and the house.\n\n## Storage", 1)
    solar.write_text(moved, encoding="utf-8")
    page.reload()
    expect(badge(page)).to_have_text(re.compile("drifted"))
    expect(page.locator(".gk-reason")).to_contain_text("has moved")
    start = moved.index("## Storage")
    end = start + len("## Storage\n\nBatteries store surplus energy for the night. "
                      "Lithium-ion cells dominate home storage.")
    line_start, line_end = moved.count("\n", 0, start) + 1, moved.count("\n", 0, end - 1) + 1
    relocated = page.locator(".gk-relocated")
    expect(relocated).to_contain_text(f"lines {line_start}–{line_end}")
    expect(relocated).to_contain_text(f"characters {start}–{end}")
    assert_accessible(page)
    shot(page, "chunk-drifted-relocated")

    # The cited words themselves changed: drifted, nowhere to re-anchor.
    solar.write_text(original.replace("Batteries store", "Flywheels store"), encoding="utf-8")
    page.reload()
    expect(badge(page)).to_have_text(re.compile("drifted"))
    expect(page.locator(".gk-reason")).to_contain_text("no longer in the source")
    expect(page.locator(".gk-relocated")).to_have_count(0)
    expect(page.locator("mark.gk-cited")).to_contain_text("Batteries store")  # as indexed
    shot(page, "chunk-drifted")

    solar.unlink()
    page.reload()
    expect(badge(page)).to_have_text(re.compile("unresolvable"))
    expect(page.locator(".gk-reason")).to_have_text("source file not found")
    assert str(live.corpus) not in page.content()
    shot(page, "chunk-unresolvable")


def test_datasette_pages_link_to_the_groundkit_pages(live, page):
    page.goto(live.url + "/energy/documents")
    page.locator("details.actions-menu-links summary").click()
    # A link on Datasette 0.65, a menu item (role="menuitem") on 1.0.
    page.locator("details.actions-menu-links a", has_text="Search this collection").click()
    expect(page).to_have_url(re.compile(r"/energy/-/groundkit/search$"))
    expect(page.get_by_role("heading", level=1)).to_have_text("Search energy")

    page.goto(live.url + "/-/groundkit")
    box = page.get_by_role("searchbox", name="Search energy")
    box.fill("wind")
    box.press("Enter")
    page.locator(".gk-hit h3 a").first.click()
    chunk_url = page.url
    page.get_by_role("link", name="the chunk's row").click()
    expect(page).to_have_url(re.compile(r"/energy/chunks\?chunk_id=c_"))
    page.get_by_role("link", name=re.compile(r"^c_[0-9a-f]{24}$")).first.click()
    expect(page).to_have_url(chunk_url)
    page.get_by_role("link", name="its document's row").click()
    expect(page).to_have_url(re.compile(r"/energy/documents/d_"))
    expect(page.locator("body")).to_contain_text("notes/wind.txt")


def test_search_and_citation_work_without_javascript(browser, live):
    ctx = browser.new_context(java_script_enabled=False)
    try:
        page = ctx.new_page()
        page.goto(live.url + "/energy/-/groundkit")
        page.get_by_label("Query").fill("turbines")
        page.get_by_label("Query").press("Enter")
        expect(page).to_have_url(re.compile(r"search\?q=turbines"))
        expect(page.locator(".gk-hit mark").first).to_have_text(re.compile("turbines", re.I))
        page.locator(".gk-hit h3 a").first.click()
        expect(badge(page)).to_have_text(re.compile("verified"))
        # The citation is there to select by hand; the copy buttons need the script.
        assert page.locator("#gk-citation").input_value().startswith("notes/")
        expect(page.locator(".gk-copy-button").first).to_be_hidden()
        shot(page, "chunk-no-javascript")
    finally:
        ctx.close()


def test_phone_width_has_no_horizontal_scroll(browser, live):
    ctx = browser.new_context(viewport=PHONE, is_mobile=True)
    try:
        page = ctx.new_page()
        page.goto(live.url + "/energy/-/groundkit/search?q=storage+batteries+energy")
        expect(page.locator(".gk-hit").first).to_be_visible()
        assert horizontal_overflow(page) <= 1
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"] + 1
        shot(page, "search-375px")
        for path in ("/-/groundkit", "/energy/-/groundkit"):
            page.goto(live.url + path)
            assert horizontal_overflow(page) <= 1, path
        page.goto(live.url + "/energy/-/groundkit/search?q=storage")
        page.locator(".gk-hit h3 a").first.click()
        expect(badge(page)).to_be_visible()
        assert horizontal_overflow(page) <= 1
        shot(page, "chunk-375px")
    finally:
        ctx.close()


def test_keyboard_focus_is_visible(live, page):
    page.goto(live.url + "/energy/-/groundkit/search?q=wind")
    page.locator("#gk-q").focus()
    for _ in range(8):  # through the form, into the results
        # A select shows its focus on Datasette's wrapper around it.
        style = page.evaluate(
            "() => { let el = document.activeElement;"
            " if (el.tagName === 'SELECT') el = el.closest('.select-wrapper') || el;"
            " const s = getComputedStyle(el);"
            " return [document.activeElement.tagName, s.outlineStyle, s.outlineWidth]; }")
        if style[0] != "BODY":
            assert style[1] != "none" and style[2] != "0px", style
        page.keyboard.press("Tab")


def test_document_markup_is_shown_as_text_never_run(live, page):
    page.goto(live.url + "/energy/-/groundkit/search?q=alert")
    snippet = page.locator(".gk-snippet").first
    expect(snippet).to_contain_text("<script>alert(1)</script>")
    expect(snippet.locator("mark")).to_have_text("alert")
    page.locator(".gk-hit h3 a").first.click()
    expect(page.locator("mark.gk-cited")).to_contain_text("<script>alert(1)</script>")
    assert page.dialogs == []


def card_names(page) -> list[str]:
    """The collection cards' names, read through the DOM: Datasette 1.0's <navigation-search>
    element sets its own ``matches`` property, which breaks Playwright's CSS engine here."""
    return page.evaluate("() => [...document.querySelectorAll('.gk-card h2')].map(e => e.innerText)")


def test_a_forbidden_collection_is_invisible(browser, tmp_path):
    built = build(tmp_path, names=("energy", "secret"))
    ds = make_ds(built, names=("energy", "secret"),
                 databases={"secret": {"allow": {"id": "alice"}}})
    secret_chunk = chunk_id_for(built.index_dir / "secret.sqlite3", "Batteries")
    with LiveServer(ds) as live:
        ctx = browser.new_context()
        try:
            page = ctx.new_page()
            page.goto(live.url + "/-/groundkit")
            names = card_names(page)
            assert names == ["energy"]
            assert "secret" not in page.content()
            for path in ("/secret/-/groundkit", "/secret/-/groundkit/search?q=batteries",
                         f"/secret/-/groundkit/chunks/{secret_chunk}"):
                response = page.goto(live.url + path)
                assert response.status == 404, path
                expect(page.locator(".gk-error")).to_contain_text("collection not found")
                assert "Batteries" not in page.content()
            missing = page.goto(live.url + "/nosuch/-/groundkit")
            assert missing.status == 404
            shot(page, "forbidden-404")

            ctx.add_cookies([{"name": "ds_actor", "url": live.url,
                              "value": ds.sign({"a": {"id": "alice"}}, "actor")}])
            page.goto(live.url + "/-/groundkit")
            assert card_names(page) == ["energy", "secret"]
            response = page.goto(live.url + f"/secret/-/groundkit/chunks/{secret_chunk}")
            assert response.status == 200
            expect(badge(page)).to_have_text(re.compile("verified"))
        finally:
            ctx.close()


def _open_more(page):
    """Open every "N more in this document" group (Datasette's script closes other details)."""
    page.evaluate("() => document.querySelectorAll('.gk-more details').forEach(d => d.open = true)")


@pytest.mark.parametrize("width", [1280, 375])
def test_every_groundkit_page_passes_axe_at_desktop_and_phone_width(browser, live, width):
    """axe-core finds no serious or critical violation on any groundkit page, in each state a
    reader meets (grouped hits opened, a second page, a cited chunk, an error), and the phone
    width never scrolls sideways. The CSP stays on: the fixture's page fails on any refusal."""
    ctx = browser.new_context(viewport={"width": width, "height": 900}, is_mobile=width < 500)
    refused = []
    try:
        page = ctx.new_page()
        page.on("console", lambda m: "Content Security Policy" in m.text and refused.append(m.text))
        checked = []

        def check(label):
            assert axe_violations(page) == [], (width, label)
            assert page_problems(page) == [], (width, label)
            assert horizontal_overflow(page) <= 1, (width, label)
            checked.append(label)

        page.goto(live.url + "/-/groundkit")
        check("collections")
        page.goto(live.url + "/energy/-/groundkit")
        expect(page.locator("#gk-ingest-heading")).to_be_visible()
        check("collection")
        shot(page, f"status-{width}px")
        page.goto(live.url + "/energy/-/groundkit/search?q=storage+energy+power&top_k=3&group=1")
        expect(page.locator(".gk-more summary").first).to_be_visible()
        _open_more(page)
        check("search, grouped")
        shot(page, f"search-grouped-{width}px")
        page.get_by_role("link", name="Next page").click()
        expect(page.locator(".gk-rank").first).to_have_text("4.")
        check("search, page 2")
        page.goto(live.url + "/energy/-/groundkit/search?q=storage")
        page.locator(".gk-hit a.gk-document").first.click()
        expect(page.locator(".gk-doc-cited")).to_have_count(1)
        check("document, cited chunk")
        shot(page, f"document-{width}px")
        page.goto(live.url + "/energy/-/groundkit/search?q=storage")
        page.locator(".gk-hit h3 a").first.click()
        expect(badge(page)).to_be_visible()
        check("chunk")
        page.goto(live.url + "/energy/-/groundkit/verify-quote?quote=Batteries+store+surplus+energy")
        expect(page.locator("h1")).to_be_visible()
        check("verify quote")
        for path in ("/energy/-/groundkit/documents/d_00000000000000000000",
                     "/energy/-/groundkit/search?q=wind&offset=9999", "/nosuch/-/groundkit"):
            page.goto(live.url + path)
            expect(page.locator(".gk-error")).to_be_visible()
            check(path)
        assert len(checked) == 10
    finally:
        ctx.close()
    assert refused == []


@pytest.mark.parametrize("width", [1280, 375])
def test_a_pdf_citation_shows_its_page_and_passes_axe(browser, tmp_path, width):
    """The chunk page of a PDF citation loads its page image under the pages' CSP (same
    origin), passes axe at desktop and phone width, and so do the image's own error page and
    the chunk page once the source changed (which then says why no page is shown)."""
    from .pdf_support import make_pdf

    built = build(tmp_path)
    (built.corpus / "handbook.pdf").write_bytes(make_pdf(HANDBOOK))
    ingest([built.corpus], collection="energy", index_dir=built.index_dir, embedder="none")
    chunk_id = chunk_id_for(built.index_dir / "energy.sqlite3", "crash during ingest")
    ctx = browser.new_context(viewport={"width": width, "height": 900}, is_mobile=width < 500)
    refused = []
    try:
        page = ctx.new_page()
        page.on("console", lambda m: "Content Security Policy" in m.text and refused.append(m.text))
        with LiveServer(make_ds(built)) as live:
            page.goto(live.url + f"/energy/-/groundkit/chunks/{chunk_id}")
            image = page.locator("img.gk-page-image")
            expect(image).to_have_attribute("alt", "Page 1 of handbook.pdf, the cited text highlighted")
            image.scroll_into_view_if_needed()
            page.wait_for_function(
                "() => { const i = document.querySelector('img.gk-page-image');"
                " return i.complete && i.naturalWidth === 1000; }")
            assert axe_violations(page) == [] and page_problems(page) == []
            assert horizontal_overflow(page) <= 1
            # The image is no wider than the column it sits in.
            assert page.evaluate("document.querySelector('img.gk-page-image').getBoundingClientRect().width") <= width
            shot(page, f"chunk-pdf-{width}px")
            response = page.goto(live.url + f"/energy/-/groundkit/chunks/{chunk_id}/pages/2.png")
            assert response.status == 404
            expect(page.locator(".gk-error")).to_contain_text("not part of this citation")
            assert axe_violations(page) == [] and page_problems(page) == []
            # Page 2 dropped: the cited text on page 1 is where it was, so it is still drawn.
            (built.corpus / "handbook.pdf").write_bytes(make_pdf(HANDBOOK[:1]))
            page.goto(live.url + f"/energy/-/groundkit/chunks/{chunk_id}")
            expect(badge(page)).to_have_text(re.compile("verified"))
            page.wait_for_function(
                "() => { const i = document.querySelector('img.gk-page-image');"
                " return i.complete && i.naturalWidth === 1000; }")
            # The cited words changed: the page is not drawn on, and the page says why.
            reworded = [[line.replace("crash", "fault") for line in HANDBOOK[0]]]
            (built.corpus / "handbook.pdf").write_bytes(make_pdf(reworded))
            page.goto(live.url + f"/energy/-/groundkit/chunks/{chunk_id}")
            expect(page.locator(".gk-page-note")).to_contain_text("The page is not shown")
            expect(page.locator("img.gk-page-image")).to_have_count(0)
            assert axe_violations(page) == [] and page_problems(page) == []
    finally:
        ctx.close()
    assert refused == []


def test_a_hit_opens_its_document_at_the_cited_chunk(live, page):
    page.goto(live.url + "/energy/-/groundkit/search?q=batteries")
    hit = page.locator(".gk-hit").first
    expect(hit.locator("h3 a")).to_have_text("Solar power > Storage")
    hit.locator("a.gk-document").click()
    expect(page).to_have_url(re.compile(r"/energy/-/groundkit/documents/d_[0-9a-f]{20}\?chunk=c_[0-9a-f]{24}#c_"))
    expect(page.get_by_role("heading", level=1)).to_have_text("Solar power")
    cited = page.locator(".gk-doc-cited")
    expect(cited).to_contain_text("Batteries store surplus energy")
    expect(cited.locator("mark.gk-cited")).to_be_visible()
    assert page.evaluate("() => document.querySelector(':target') === document.querySelector('.gk-doc-cited')")
    expect(badge(page)).to_have_text(re.compile("unchanged"))
    # The table of contents leads to each section's chunk.
    page.locator(".gk-toc").get_by_role("link", name="Costs").click()
    expect(page).to_have_url(re.compile(r"#c_[0-9a-f]{24}$"))
    expect(page.locator(".gk-doc-chunk:target")).to_contain_text("Panel prices fell")
    assert_accessible(page)
    # The source changed, then vanished: the document says so, and still shows the indexed text.
    solar = live.corpus / "solar.md"
    solar.write_text(solar.read_text(encoding="utf-8") + "\nA new line.\n", encoding="utf-8")
    page.reload()
    expect(badge(page)).to_have_text(re.compile("changed"))
    solar.unlink()
    page.reload()
    expect(badge(page)).to_have_text(re.compile("missing"))
    expect(page.locator(".gk-doc-text")).to_contain_text("Photovoltaic panels")
    # And to the raw rows in Datasette.
    page.get_by_role("link", name="its chunks' rows").click()
    expect(page).to_have_url(re.compile(r"/energy/chunks\?document_id=d_"))
    expect(page.locator("body")).to_contain_text("Lithium-ion")


def test_grouped_hits_open_and_pages_follow_on(live, page):
    page.goto(live.url + "/energy/-/groundkit/search")
    page.get_by_label("Query").fill("power energy storage")
    page.get_by_label("Hits per page").fill("3")
    page.get_by_label("Group hits by document").check()
    page.get_by_role("button", name="Search").click()
    more = page.locator(".gk-more details").first
    expect(more.locator("summary")).to_have_text(re.compile(r"^\d+ more in this document$"))
    expect(more.locator(".gk-hit").first).to_be_hidden()
    more.locator("summary").click()
    expect(more.locator(".gk-hit").first).to_be_visible()
    first_page = page.locator(".gk-rank").all_text_contents()
    page.get_by_role("link", name="Next page").click()
    expect(page).to_have_url(re.compile(r"offset=3"))
    expect(page.get_by_label("Group hits by document")).to_be_checked()
    second = page.locator(".gk-rank").all_text_contents()
    assert set(second).isdisjoint(first_page) and min(int(r[:-1]) for r in second) == 4
    page.get_by_role("link", name="Previous page").click()
    assert page.locator(".gk-rank").all_text_contents() == first_page


# The demo collection's PDF: an operator's handbook, two pages of about 2,500 characters, so a
# page holds several chunks and the cited one is a part of it.
HANDBOOK = [
    ["Operating groundkit: a handbook for the people who run it",
     "",
     "1. Before the first ingest",
     "Choose one index directory per machine and keep it on a local disk.",
     "The collections in it are single SQLite files with a LanceDB folder",
     "beside each; back them up as files, while no ingest is running.",
     "Give the service account read access to the sources and nothing more.",
     "",
     "2. After a crash during ingest",
     "A crash during ingest leaves the published collection as it was:",
     "ingest writes a private copy and renames it into place only at the end.",
     "Run the same ingest command again. Files whose content hash is unchanged",
     "are skipped, so the second run only redoes the work the crash cut short.",
     "If the copy was left behind, the next run removes it before it starts.",
     "Check the result with groundkit status: generation, documents, chunks.",
     "",
     "3. When a citation drifts",
     "A drifted citation means the source file changed after it was ingested.",
     "The chunk page shows where the cited text moved to, if it still exists.",
     "Re-ingest the folder to bring the collection up to date with the files.",
     "Answers quoted before the change can be checked again with verify_quote."],
    ["4. Serving to colleagues",
     "Publish behind a TLS proxy and configure OIDC or static tokens first.",
     "Access lists beside a document limit who may read it on every surface:",
     "search, the document and chunk pages, the JSON API and MCP alike.",
     "",
     "5. Keeping answers honest",
     "Every hit carries its source, its lines and its pages. Quote from the",
     "chunk page, which re-reads the source now, rather than from memory.",
     "A weak match is labelled as one: prefer hits that share the query's words."],
]
def _demo_corpus(root: Path) -> Path:
    """Like what ``make demo`` ingests (the README, docs/ and the ADRs the pages cite), plus
    a PDF handbook so a citation can be shown on its page."""
    from .pdf_support import make_pdf

    root.mkdir(parents=True)
    shutil.copy(REPO / "README.md", root / "README.md")
    shutil.copytree(REPO / "docs", root / "docs", ignore=shutil.ignore_patterns("*.png"))
    (root / "adr").mkdir()
    for adr in ("0002-publish-by-rename.md", "0010-datasette-pages-follow-reingest.md",
                "0023-verify-quote-and-stale-hits.md", "0024-paging-grouping-documents.md"):
        shutil.copy(REPO / "adr" / adr, root / "adr" / adr)
    (root / "handbook.pdf").write_bytes(make_pdf(HANDBOOK))
    return root


def test_readme_screenshots(browser, tmp_path):
    """The README's screenshots, from a collection ingested with the default embedder (dense
    and hybrid available): hybrid search, a document, a PDF citation on its page, the
    collection page. Each is saved marked (``mark_png``) under the artifacts directory;
    GROUNDKIT_README_SCREENSHOTS=1 also writes them to docs/screenshots, which CI does."""
    corpus = _demo_corpus(tmp_path / "demo")
    index_dir = tmp_path / "index"
    report = ingest([corpus], collection="groundkit", index_dir=index_dir)  # default embedder
    assert report.chunks_embedded == report.chunks_written > 0
    ds = Datasette(files=[], immutables=[str(index_dir / "groundkit.sqlite3")],
                   metadata={"plugins": {"groundkit": {"base_dir": str(corpus)}}})
    shots = {}
    with LiveServer(ds) as live:
        ctx = browser.new_context(viewport={"width": 1100, "height": 1000})
        refused = []
        try:
            page = ctx.new_page()
            page.on("console", lambda m: "Content Security Policy" in m.text and refused.append(m.text))

            def take(name, full_page=False, clip=None):
                assert axe_violations(page) == [], name
                assert_accessible(page)
                shots[name] = page.screenshot(full_page=full_page, clip=clip)

            page.goto(live.url + "/groundkit/-/groundkit/search?q=crash+during+ingest&top_k=5")
            expect(page.locator("#gk-mode")).to_have_value("hybrid")
            expect(page.locator(".gk-hit").first).to_be_visible()
            assert "unavailable" not in page.locator(".gk-search-form").inner_text()
            components = page.locator(".gk-hit").first.inner_text()
            assert "bm25" in components and "dense" in components
            expect(page.locator(".gk-hit mark").first).to_be_visible()
            take("search")

            # A Markdown hit's document: headings as contents, the cited chunk marked.
            page.locator(".gk-hit", has_text=".md, lines").first.locator("a.gk-document").click()
            expect(page.locator(".gk-doc-cited")).to_have_count(1)
            expect(page.locator(".gk-toc a").first).to_be_visible()
            expect(badge(page)).to_have_text(re.compile("unchanged"))
            page.evaluate("window.scrollTo(0, 0)")
            take("document")

            page.goto(live.url + "/groundkit/-/groundkit/search?q=crash+during+ingest"
                      "&source=handbook.pdf&mode=hybrid&top_k=3")
            expect(page.locator(".gk-hit").first).to_contain_text("page 1")
            page.locator(".gk-hit h3 a").first.click()
            expect(badge(page)).to_have_text(re.compile("verified"))
            image = page.locator("img.gk-page-image")
            expect(image).to_have_count(1)
            image.scroll_into_view_if_needed()
            page.wait_for_function(
                "() => { const i = document.querySelector('img.gk-page-image');"
                " return i.complete && i.naturalWidth > 0; }")
            assert page.evaluate("document.querySelector('img.gk-page-image').naturalWidth") == 1000
            page.evaluate("window.scrollTo(0, 0)")
            # From the top of the page down to the middle of the page image: the verdict, the
            # cited text and the highlighted lines of the handbook.
            box = image.bounding_box()
            height = min(page.evaluate("document.documentElement.scrollHeight"),
                         box["y"] + box["height"] * 0.55)
            take("pdf-citation", full_page=True, clip={"x": 0, "y": 0, "width": 1100, "height": height})

            page.goto(live.url + "/groundkit/-/groundkit")
            expect(page.locator("#gk-ingest-heading")).to_be_visible()
            assert "all-MiniLM-L6-v2" in page.content()
            take("collection")
        finally:
            ctx.close()
    assert refused == []
    assert set(shots) == set(README_SHOTS)
    target = REPO / "docs" / "screenshots"
    write_readme = os.environ.get("GROUNDKIT_README_SCREENSHOTS") == "1"
    for name, data in shots.items():
        assert len(data) < 400 * 1024, (name, len(data))
        marked = mark_png(data)
        (artifacts_dir() / f"readme-{name}.png").write_bytes(marked)
        if write_readme:
            target.mkdir(parents=True, exist_ok=True)
            (target / f"{name}.png").write_bytes(marked)


# -- the same pages through Datasette's test client ---------------------------------------


@pytest.mark.parametrize(
    "path,status,detail",
    [
        ("/energy/-/groundkit/search?q=", 422, "query: String should have at least 1 character"),
        ("/energy/-/groundkit/search?q=wind&top_k=99", 422, "top_k"),
        ("/energy/-/groundkit/search?q=wind&top_k=lots", 422, "top_k"),
        ("/energy/-/groundkit/search?q=wind&mode=dense", 400, "embeddings"),
        ("/energy/-/groundkit/search?q=wind&mode=fuzzy", 422, "mode"),
        ("/energy/-/groundkit/search?q=wind&rerank=1", 501, "reranker"),
        ("/nosuch/-/groundkit/search?q=wind", 404, "collection not found"),
        ("/nosuch/-/groundkit", 404, "collection not found"),
        ("/a.b/-/groundkit", 400, "collection name"),
        ("/energy/-/groundkit/chunks/c_000000000000000000000000", 404, "not found"),
        ("/energy/-/groundkit/chunks/not-a-chunk", 422, "chunk_id"),
    ],
)
async def test_errors_are_shown_inline_with_their_status(ds, built, path, status, detail):
    r = await ds.client.get(path)
    assert r.status_code == status, r.text
    error = re.search(r'<div class="message-error gk-error" role="alert">(.*?)</div>', r.text, re.S)
    assert error and detail.lower() in error.group(1).lower()
    assert r.headers["x-request-id"] in r.text
    assert "Traceback" not in r.text and str(built.corpus) not in r.text
    assert "/tmp" not in r.text
    if status in (400, 422, 501) and "/search" in path:
        assert 'id="gk-q"' in r.text  # the form stays, to correct the request


async def test_every_page_answers_and_the_search_form_is_shareable(ds):
    for path in ("/-/groundkit", "/energy/-/groundkit", "/energy/-/groundkit/search"):
        r = await ds.client.get(path)
        assert r.status_code == 200, path
        assert r.text.count("<h1") == 1
    r = await ds.client.get("/energy/-/groundkit/search?q=wind&top_k=2&mode=bm25&source=notes/")
    assert r.status_code == 200
    assert 'method="get"' in r.text and 'value="wind"' in r.text and 'value="notes/"' in r.text
    assert '<option value="bm25" selected>' in r.text
    assert r.text.count('class="gk-hit"') <= 2 and "solar.md" not in r.text


async def test_rendered_html_escapes_document_content(ds):
    r = await ds.client.get("/energy/-/groundkit/search?q=alert")
    assert r.status_code == 200
    assert "&lt;script&gt;<mark>alert</mark>(1)&lt;/script&gt;" in r.text
    assert "<script>alert(1)" not in r.text
    chunk = re.search(r'href="(/energy/-/groundkit/chunks/c_[0-9a-f]{24})"', r.text).group(1)
    r = await ds.client.get(chunk)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text
    assert "<script>alert(1)" not in r.text
    # A query is echoed into the form escaped, too.
    r = await ds.client.get('/energy/-/groundkit/search?q="><img src=x onerror=alert(2)>')
    assert "<img src=x" not in r.text and "&lt;img src=x" in r.text


async def test_datasette_tables_link_to_the_groundkit_pages(ds, built, tmp_path):
    assert hasattr(gk_plugin, "table_actions") and hasattr(gk_plugin, "render_cell"), (
        "register ui_hooks in groundkit_datasette/datasette_plugin/__init__.py")
    r = await ds.client.get("/energy/documents")
    assert re.search(r'<a href="/energy/-/groundkit/search"[^>]*>\s*Search this collection\s*</a>',
                     r.text)
    chunk_id = chunk_id_for(built.index_dir / "energy.sqlite3", "Batteries")
    link = f'href="/energy/-/groundkit/chunks/{chunk_id}"'
    assert link in (await ds.client.get("/energy/chunks")).text
    row = await ds.client.get(f"/energy/chunks?chunk_id={chunk_id}")
    assert link in row.text
    rowid = re.search(r'href="/energy/chunks/(\d+)"', row.text).group(1)
    assert link in (await ds.client.get(f"/energy/chunks/{rowid}")).text

    # A database that merely looks similar gets no links.
    plain = tmp_path / "plain.db"
    conn = sqlite3.connect(plain)
    conn.execute("CREATE TABLE chunks (id INTEGER PRIMARY KEY, chunk_id TEXT)")
    conn.execute("CREATE TABLE documents (document_id TEXT PRIMARY KEY)")
    conn.execute("INSERT INTO chunks (chunk_id) VALUES (?)", (chunk_id,))
    conn.commit()
    conn.close()
    other = Datasette(files=[], immutables=[str(plain)])
    assert "groundkit/chunks" not in (await other.client.get("/plain/chunks")).text
    assert "Search this collection" not in (await other.client.get("/plain/documents")).text


def test_highlight_escapes_then_marks_words_and_stems():
    out = highlight("Use <b>batteries</b> & a Battery pack", QueryTerms("battery"))
    assert str(out) == "Use &lt;b&gt;<mark>batteries</mark>&lt;/b&gt; &amp; a <mark>Battery</mark> pack"
    assert str(highlight("the cat", QueryTerms("the"))) == "the cat"  # stop words stay plain
    long = "word " * 200 + "turbines spin " + "word " * 200
    snippet = str(highlight(long, QueryTerms("turbine"), limit=120))
    assert "<mark>turbines</mark>" in snippet
    assert snippet.startswith("…") and snippet.endswith("…") and len(snippet) < 200


def test_plain_text_citation():
    chunk = SimpleNamespace(source="docs/a.md", line_start=3, line_end=9, page_start=None,
                            page_end=None, chunk_id="c_" + "0" * 24, heading="Intro > Setup")
    assert citation_text(chunk) == 'docs/a.md:3-9 [c_000000000000000000000000] "Intro > Setup"'
    chunk.page_start, chunk.page_end, chunk.heading, chunk.line_end = 2, 2, "", 3
    assert citation_text(chunk) == "docs/a.md:3 (p. 2) [c_000000000000000000000000]"
