import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from groundkit_datasette.indexing.chunking import Chunk, chunk_text, find_headings

SOURCE_CLASSES = ["markdown", "rst", "text", "code", "html", "pdf"]

_words = st.sampled_from(
    [
        "alpha", "beta.", "gamma,", "delta?", "Ω", "naïve", "e\u0301te\u0301",
        "👩\u200d💻", "👍🏽", "🇫🇷", "漢字かな交じり文。", "中文句子！", "עברית",
        "العربية", "x" * 180, "https://example.com/" + "a" * 90, "#", "##",
        "-", "=", "`", "*", "\u00a0", "\u200b", "\u2028", "\x1c",
    ]
)
_space = st.sampled_from([" ", "  ", "\t", "\n", "\r\n", "\n\n", "\r\n\r\n", "\n \n", "\f"])
_lines = st.one_of(
    st.builds(lambda n, w: "#" * n + " " + w, st.integers(1, 7), _words),
    st.builds(lambda w, u: f"{w}\n{u * 5}", _words, st.sampled_from("=-~^")),
    st.sampled_from(["```", "~~~", "```python", "    # indented", "---", "* * *", "::"]),
    st.text(min_size=1, max_size=40),
).map(lambda line: "\n" + line + "\n")
_pieces = st.one_of(_words, _words, _words, _space, _space, _lines)
documents = st.one_of(
    st.lists(_pieces, max_size=30), st.lists(_pieces, min_size=30, max_size=300)
).map("".join)


def _check(text: str, chunks: list[Chunk], size: int, overlap: int) -> None:
    covered = bytearray(len(text))
    for i, c in enumerate(chunks):
        assert c.index == i
        assert 0 <= c.start < c.end <= len(text)
        assert c.text == text[c.start : c.end]
        assert c.text.strip(), "whitespace-only chunk"
        assert not text[c.start].isspace() and not text[c.end - 1].isspace()
        assert len(c.text) <= size
        assert c.line_start == text.count("\n", 0, c.start) + 1
        assert c.line_end == text.count("\n", 0, c.end - 1) + 1
        for j in range(c.start, c.end):
            covered[j] = 1
    for prev, cur in zip(chunks, chunks[1:]):
        assert cur.start > prev.start and cur.end > prev.end
        assert prev.end - cur.start <= overlap
    # Nothing is in more than two chunks.
    for a, c in zip(chunks, chunks[2:]):
        assert c.start >= a.end
    for i, ch in enumerate(text):
        if not ch.isspace():
            assert covered[i], f"char {i} {ch!r} not covered"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=documents,
    source_class=st.sampled_from(SOURCE_CLASSES),
    size=st.integers(50, 250),
    overlap_frac=st.floats(0, 0.49),
)
def test_structured_documents(text, source_class, size, overlap_frac):
    overlap = min(int(size * overlap_frac), (size - 1) // 2)
    chunks = chunk_text(text, source_class=source_class, chunk_size=size, chunk_overlap=overlap)
    _check(text, chunks, size, overlap)
    starts = [h.start for h in find_headings(text, source_class)]
    for c in chunks:
        assert not any(c.start < h < c.end for h in starts), "chunk crosses a heading"
        if source_class == "pdf":
            assert "\f" not in c.text, "chunk crosses a page"


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(max_size=2000),
    source_class=st.sampled_from(SOURCE_CLASSES),
    size=st.integers(50, 200),
    overlap=st.integers(0, 24),
)
def test_arbitrary_text(text, source_class, size, overlap):
    chunks = chunk_text(text, source_class=source_class, chunk_size=size, chunk_overlap=overlap)
    _check(text, chunks, size, overlap)


@settings(max_examples=50, deadline=None)
@given(text=documents)
def test_deterministic(text):
    a = chunk_text(text, source_class="markdown", chunk_size=80, chunk_overlap=20)
    b = chunk_text(text, source_class="markdown", chunk_size=80, chunk_overlap=20)
    assert a == b


MD = """Preamble text.

# Guide

Intro paragraph.

## Install

Use pip.

```sh
# not a heading
pip install groundkit
```

### From source

Clone and build.

Setext Title
============

Body one.

Sub part
--------

Body two.
"""


def test_markdown_heading_paths():
    chunks = chunk_text(MD, source_class="markdown", chunk_size=1000, chunk_overlap=0)
    by_heading = {c.heading: c.text for c in chunks}
    assert list(by_heading) == [
        "",
        "Guide",
        "Guide > Install",
        "Guide > Install > From source",
        "Setext Title",
        "Setext Title > Sub part",
    ]
    assert by_heading[""] == "Preamble text."
    assert "# not a heading" in by_heading["Guide > Install"]
    assert by_heading["Guide > Install > From source"] == "### From source\n\nClone and build."


def test_no_chunk_crosses_a_heading():
    chunks = chunk_text(MD, source_class="markdown", chunk_size=60, chunk_overlap=10)
    heading_starts = [h.start for h in find_headings(MD, "markdown")]
    assert heading_starts
    for c in chunks:
        assert not any(c.start < h < c.end for h in heading_starts), c
    _check(MD, chunks, 60, 10)


def test_hash_in_fenced_code_is_not_a_heading():
    text = "# Top\n\n~~~~\n# comment\n## another\n~~~~\n\nafter\n"
    assert [h.title for h in find_headings(text, "markdown")] == ["Top"]
    chunks = chunk_text(text, source_class="markdown")
    assert len(chunks) == 1 and chunks[0].heading == "Top"


def test_markdown_details():
    text = "---\ntitle: x\n---\n#hashtag\n#   Closed ##  \n    # indented code\n- item\n---\n"
    heads = find_headings(text, "markdown")
    assert [(h.level, h.title) for h in heads] == [(1, "Closed")]


def test_rst_titles():
    text = "=====\n Doc\n=====\n\nIntro.\n\nPart A\n------\n\nText a.\n\nSub\n~~~\n\nText.\n\nPart B\n------\n\nb.\n"
    heads = find_headings(text, "rst")
    assert [(h.level, h.title) for h in heads] == [(1, "Doc"), (2, "Part A"), (3, "Sub"), (2, "Part B")]
    chunks = chunk_text(text, source_class="rst", chunk_size=200, chunk_overlap=0)
    assert [c.heading for c in chunks] == ["Doc", "Doc > Part A", "Doc > Part A > Sub", "Doc > Part B"]
    assert chunks[0].text.startswith("=====\n Doc")


def test_pdf_pages_are_boundaries():
    text = "page one words\n\f\npage two words"
    chunks = chunk_text(text, source_class="pdf", chunk_size=500, chunk_overlap=50)
    assert [c.text for c in chunks] == ["page one words", "page two words"]


def test_prefers_paragraphs_then_sentences():
    para = "One sentence here. Another sentence follows. "
    text = (para * 3).strip() + "\n\n" + (para * 3).strip()
    chunks = chunk_text(text, source_class="text", chunk_size=150, chunk_overlap=0)
    assert [c.text for c in chunks] == [(para * 3).strip()] * 2
    long = (para * 10).strip()
    chunks = chunk_text(long, source_class="text", chunk_size=100, chunk_overlap=0)
    assert all(c.text.endswith(".") for c in chunks)


def test_code_prefers_blank_lines():
    fn = "def f{}(x):\n    y = x + 1\n    return y\n"
    text = "\n".join(fn.format(i) for i in range(10))
    chunks = chunk_text(text, source_class="code", chunk_size=100, chunk_overlap=0)
    for c in chunks:
        assert c.text.startswith("def f") and c.text.endswith("return y")


def test_overlap_snaps_to_word_start():
    text = " ".join(f"word{i:03d}" for i in range(200))
    chunks = chunk_text(text, source_class="text", chunk_size=100, chunk_overlap=30)
    assert len(chunks) > 1
    for prev, cur in zip(chunks, chunks[1:]):
        assert 0 < prev.end - cur.start <= 30
        assert text[cur.start - 1] == " "


def test_hard_cut_keeps_combining_marks():
    text = "e\u0301" * 200
    chunks = chunk_text(text, source_class="text", chunk_size=51, chunk_overlap=0)
    for c in chunks:
        assert c.text[0] == "e"
    _check(text, chunks, 51, 0)


def test_empty_and_whitespace():
    assert chunk_text("", source_class="text") == []
    assert chunk_text(" \n\t\r\n ", source_class="markdown") == []


@pytest.mark.parametrize(
    "size,overlap",
    [(49, 0), (0, 0), (100, -1), (100, 50), (100, 60), (100.0, 10), (True, 0), (100, None)],
)
def test_bad_settings(size, overlap):
    with pytest.raises(ValueError):
        chunk_text("text", source_class="text", chunk_size=size, chunk_overlap=overlap)
