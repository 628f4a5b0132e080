"""Search hits a person can tell apart: titled by their section, the document beneath,
Markdown shown as readable text (escaped), weak matches marked as weak."""

from __future__ import annotations

import re
from types import SimpleNamespace

from groundkit_datasette.surfaces.pages import WEAK_SCORE_RATIO, plain_text, weak_reason

from .test_paging import built, ds  # noqa: F401  (fixtures: the paging corpus, bm25 and hybrid)


def test_markdown_syntax_is_dropped_and_every_word_kept():
    md = ("## Storage\n\nBatteries store **surplus** energy; see [the guide](https://x.example/a)"
          " and `ingest.py`.\n\n- one item\n* two *items* in snake_case_name\n1. first\n"
          "> quoted <b>bold</b>\n```python\ncode here\n```\n![a chart](c.png)\n---\n")
    assert plain_text(md, "docs/a.md") == (
        "Storage\nBatteries store surplus energy; see the guide and ingest.py.\none item\n"
        "two items in snake_case_name\nfirst\nquoted <b>bold</b>\ncode here\na chart")
    # Text that is not Markdown keeps its characters: a # in a .txt is a word.
    assert plain_text("# not a heading\n- still text", "notes/a.txt") == "# not a heading\n- still text"


def _hit(score, components, matched=("storage",)):
    return SimpleNamespace(score=score, components=components, matched_terms=list(matched))


def test_weak_means_no_keyword_match_or_far_below_the_best():
    hybrid = SimpleNamespace(mode="hybrid", reranked=False, top_score=0.03)
    assert weak_reason(_hit(0.01, {"dense": {}}, matched=()), hybrid) == "no keyword match"
    assert weak_reason(_hit(0.01, {"dense": {}, "bm25": {}}), hybrid) is None
    # A dense hit holding a query word is a keyword match too, though no BM25 list ranked it.
    dense = SimpleNamespace(mode="dense", reranked=False, top_score=0.9)
    assert weak_reason(_hit(0.5, {"dense": {}}), dense) is None
    assert weak_reason(_hit(0.5, {"dense": {}}, matched=()), dense) == "no keyword match"
    bm25 = SimpleNamespace(mode="bm25", reranked=False, top_score=8.0)
    assert weak_reason(_hit(8.0 * WEAK_SCORE_RATIO * 0.9, {"bm25": {}}), bm25)
    assert weak_reason(_hit(8.0 * WEAK_SCORE_RATIO * 1.1, {"bm25": {}}), bm25) is None
    # Reranker scores are not on BM25's scale: no ratio rule there.
    reranked = SimpleNamespace(mode="bm25", reranked=True, top_score=8.0)
    assert weak_reason(_hit(0.1, {"bm25": {}}), reranked) is None


async def test_hits_are_titled_by_section_with_the_document_beneath(ds):
    r = await ds.client.get("/many/-/groundkit/search?q=battery+cells+cycles+costs&mode=bm25")
    assert r.status_code == 200
    titles = re.findall(r'<h3 class="gk-hit-title"><span class="gk-rank">\d+\.</span> <a [^>]+>([^<]+)</a>',
                        r.text)
    book = [t for t in titles if t.startswith("Battery book")]
    assert len(book) >= 3 and len(set(book)) == len(book)  # one document's hits differ
    assert "Battery book 0 &gt; Cells" in titles or any("&gt; Cells" in t for t in titles)
    assert re.search(r'<a class="gk-document" href="/many/-/groundkit/documents/d_[^"]+">Battery book', r.text)
    snippets = re.findall(r'<p class="gk-snippet">(.*?)</p>', r.text, re.S)
    assert snippets and not any("##" in s or s.lstrip().startswith("#") for s in snippets)


async def test_hybrid_hits_without_a_keyword_match_are_marked_weak(ds):
    r = await ds.client.get("/mixed/-/groundkit/search?q=identical+tie&mode=hybrid&top_k=30")
    assert r.status_code == 200
    items = re.findall(r'<li class="gk-hit( gk-hit-weak)?">(.*?)</li>', r.text, re.S)
    weak = [body for flag, body in items if flag]
    strong = [body for flag, body in items if not flag]
    assert weak and strong
    assert all("Weak match: no keyword match." in b and "bm25 rank" not in b for b in weak)
    assert all("bm25 rank" in b for b in strong)
