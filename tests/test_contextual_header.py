"""The document title heads every chunk (adr/0035-contextual-title-header.md), and the
embedder's ``max_length`` is recorded so queries are embedded at the documents' length.

Real files, real ingest into SQLite (and LanceDB for the embedder tests), real searches.
"""

import hashlib
import io
import json
import sqlite3

import numpy as np
import pytest
from datasette.app import Datasette

from groundkit_datasette import registry as gk_registry
from groundkit_datasette.indexing.chunking import chunk_text
from groundkit_datasette.indexing.ingest import Indexer, ingest
from groundkit_datasette.errors import EmbedderError, EmbedderMismatch
from groundkit_datasette.hookspecs import hookimpl
from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.retrieval.models import SearchRequest

from .conftest import manifest
from .pdf_support import make_pdf

# A body long enough for several chunks at chunk_size 200; the title word "zephyrine" is
# in no body line, so only the header can make a body chunk match it.
BODY = [
    f"Paragraph {i} is about tidal barrages, turbines and the estuary they sit in, "
    f"with figure {i} for the annual output." for i in range(8)
]


def _html(title: str) -> str:
    paragraphs = "".join(f"<p>{p}</p>" for p in BODY)
    return f"<html><head><title>{title}</title></head><body>{paragraphs}</body></html>"


def _pdf_with_title(title: str) -> bytes:
    import pypdf

    writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(io.BytesIO(make_pdf([BODY[:4], BODY[4:]]))))
    writer.add_metadata({"/Title": title})
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def _docx_with_core_title(path, title: str) -> None:
    import docx

    document = docx.Document()
    document.core_properties.title = title
    document.add_heading("Estuary", level=1)  # a heading that is not the title
    for p in BODY:
        document.add_paragraph(p)
    document.save(path)


def _front_matter(title: str) -> str:
    return f"---\ntitle: {title}\n---\n\n" + "\n\n".join(BODY) + "\n"


def _chunks(index_dir, name):
    conn = sqlite3.connect(index_dir / f"{name}.sqlite3")
    try:
        return conn.execute(
            "SELECT d.source, c.chunk_id, c.heading, c.content, c.start_offset, c.end_offset "
            "FROM chunks c JOIN documents d USING (document_id) ORDER BY d.source, c.chunk_index"
        ).fetchall()
    finally:
        conn.close()


def _manifest(index_dir, name):
    return manifest(index_dir / f"{name}.sqlite3")


@pytest.fixture
def titled_corpus(tmp_path):
    root = tmp_path / "titled"
    root.mkdir()
    (root / "page.html").write_text(_html("Zephyrine Handbook"), encoding="utf-8")
    (root / "paper.pdf").write_bytes(_pdf_with_title("Zephyrine Survey"))
    (root / "notes.md").write_text(_front_matter("Zephyrine Notes"), encoding="utf-8")
    _docx_with_core_title(root / "report.docx", "Zephyrine Report")
    return root


def test_a_title_word_finds_every_chunk_of_html_pdf_front_matter_and_docx(titled_corpus, tmp_path):
    """Before the header, only a chunk whose own text held the title could match it: an
    HTML, PDF, front-matter or DOCX-properties title reached no chunk at all."""
    index_dir = tmp_path / "index"
    ingest([titled_corpus], collection="titled", index_dir=index_dir, embedder="none",
           chunk_size=200, chunk_overlap=0)
    rows = _chunks(index_dir, "titled")
    by_source = {}
    for source, chunk_id, heading, content, *_ in rows:
        by_source.setdefault(source, []).append((chunk_id, heading, content))
    assert set(by_source) == {"page.html", "paper.pdf", "notes.md", "report.docx"}
    assert all(len(chunks) > 1 for chunks in by_source.values())
    assert {h for _c, h, _t in by_source["page.html"]} == {"Zephyrine Handbook"}
    assert {h for _c, h, _t in by_source["paper.pdf"]} == {"Zephyrine Survey"}
    assert {h for _c, h, _t in by_source["notes.md"]} == {"Zephyrine Notes"}
    assert {h for _c, h, _t in by_source["report.docx"]} == {"Zephyrine Report > Estuary"}
    with Collection.open("titled", index_dir=index_dir) as col:
        hits = col.search(SearchRequest(query="zephyrine", top_k=50)).hits
        found = {h.chunk_id for h in hits}
        for source, chunks in by_source.items():
            body = [cid for cid, _h, text in chunks if "zephyrine" not in text.lower()]
            assert body, source  # chunks whose own text lacks the title word
            assert set(body) <= found, source
        # The citation is the chunk's own text: the header is not in content, and it verifies.
        for hit in hits:
            assert "Zephyrine" not in hit.content or hit.source == "notes.md"
            assert col.fetch_chunk(hit.chunk_id).verification.status == "verified"
            assert "zephyrine" in hit.matched_terms


def test_titles_the_extractors_give(titled_corpus):
    """The PDF's /Title and a Markdown front matter's title: none before this change."""
    from groundkit_datasette.indexing.extract import extract_bytes

    assert extract_bytes((titled_corpus / "paper.pdf").read_bytes(), ".pdf").title == "Zephyrine Survey"
    assert extract_bytes((titled_corpus / "notes.md").read_bytes(), ".md").title == "Zephyrine Notes"
    # An H1 stays the title of a Markdown file that has both.
    both = "---\ntitle: Front\n---\n\n# Heading One\n\ntext\n".encode()
    assert extract_bytes(both, ".md").title == "Heading One"
    assert extract_bytes(b"---\ntitle: [unclosed\n---\n\ntext\n", ".md").title is None


MARKDOWN = """# Solar power

Photovoltaic panels turn sunlight into electricity. Efficiency depends on the cell
material and the angle of the panel towards the sun.

## Storage

Batteries store surplus energy for the night. Lithium-ion cells dominate home storage.

### Home

Wall units hold ten kilowatt hours.
"""


def test_markdown_whose_h1_is_the_title_chunks_as_before():
    """No duplicate: the eval corpora ("# title" first) keep their chunks and figures."""
    from groundkit_datasette.indexing.chunking import contextual_heading

    plain = chunk_text(MARKDOWN, source_class="markdown", chunk_size=120, chunk_overlap=0)
    titled = chunk_text(MARKDOWN, source_class="markdown", chunk_size=120, chunk_overlap=0,
                        title="Solar power")
    assert titled == plain
    assert [c.heading for c in titled][-1] == "Solar power > Storage > Home"
    # Text before the first heading gets the title; case and spacing do not make a duplicate.
    preamble = "Intro line before the heading.\n\n" + MARKDOWN
    first = chunk_text(preamble, source_class="markdown", chunk_size=120, chunk_overlap=0,
                       title="Solar power")
    assert first[0].heading == "Solar power" and first[1].heading == "Solar power"
    assert contextual_heading("solar  POWER", "Solar power > Storage") == "Solar power > Storage"
    assert contextual_heading("Solar", "Solar power") == "Solar > Solar power"
    assert contextual_heading(None, "A > B") == "A > B"
    assert contextual_heading("   ", "") == ""
    long_title = " ".join(["word"] * 100)
    assert len(contextual_heading(long_title, "")) <= 200


def test_eval_style_markdown_gives_the_same_chunk_ids_with_and_without_the_header(tmp_path):
    """The chunk rows of titled Markdown (eval's "# title" files) are identical either way."""
    root = tmp_path / "md"
    root.mkdir()
    for i in range(3):
        (root / f"d{i}.md").write_text(f"# Title {i}\n\n" + "\n\n".join(BODY), encoding="utf-8")
    ingest([root], collection="old", index_dir=tmp_path / "a", embedder="none", chunk_size=200,
           chunk_overlap=0, title_header=False)
    ingest([root], collection="new", index_dir=tmp_path / "b", embedder="none", chunk_size=200,
           chunk_overlap=0)
    assert _chunks(tmp_path / "a", "old") == _chunks(tmp_path / "b", "new")


class _Fixed:
    """Deterministic vectors from a text's hash: tells which texts were embedded."""

    provider = "test"
    model_name = "fixed-header"
    dimensions = 8

    def __init__(self):
        self.embedded = []

    def embed(self, texts):
        self.embedded.extend(texts)
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for row, text in enumerate(texts):
            digest = hashlib.sha256(text.encode()).digest()
            out[row] = np.frombuffer(digest[:8], dtype=np.uint8) + 1.0
            out[row] /= np.linalg.norm(out[row])
        return out


def test_an_existing_collection_is_rechunked_once_and_only_changed_chunks_re_embedded(tmp_path):
    """A collection from before the header (its chunker record lacks it) is re-chunked on
    the next ingest; chunks whose header is unchanged keep their vectors; the run after
    that publishes nothing."""
    root = tmp_path / "mixed"
    root.mkdir()
    (root / "page.html").write_text(_html("Zephyrine Handbook"), encoding="utf-8")
    (root / "titled.md").write_text("# Solar\n\n" + "\n\n".join(BODY), encoding="utf-8")
    embedder = _Fixed()

    class Plugin:
        @staticmethod
        @hookimpl
        def register_embedders(register):
            register("fixed-header", lambda: embedder)

    gk_registry.pm.register(Plugin, name="fixed-header-test")
    try:
        index_dir = tmp_path / "index"
        options = dict(collection="mixed", index_dir=index_dir, embedder="fixed-header",
                       chunk_size=200, chunk_overlap=0)
        ingest([root], title_header=False, **options)  # the chunks of before the header
        before = _chunks(index_dir, "mixed")
        assert json.loads(_manifest(index_dir, "mixed")["chunker"]) == {"chunk_size": 200, "chunk_overlap": 0}
        html_chunks = sum(1 for r in before if r[0] == "page.html")
        embedder.embedded.clear()

        report = ingest([root], **options)
        after = _chunks(index_dir, "mixed")
        assert report.updated == 2 and report.published
        assert json.loads(_manifest(index_dir, "mixed")["chunker"])["header"] == "title > headings"
        # Markdown under its "# Solar": the same rows; HTML: new headers, so new ids and vectors.
        assert [r for r in after if r[0] == "titled.md"] == [r for r in before if r[0] == "titled.md"]
        assert all(r[2] == "Zephyrine Handbook" for r in after if r[0] == "page.html")
        assert [r[3:] for r in after] == [r[3:] for r in before]  # content and offsets exact
        assert report.chunks_embedded == html_chunks
        assert all(t.startswith("Zephyrine Handbook\n\n") for t in embedder.embedded)

        again = ingest([root], **options)
        assert again.unchanged == 2 and not again.published and again.chunks_embedded == 0
    finally:
        gk_registry.pm.unregister(name="fixed-header-test")


# -- max_length ------------------------------------------------------------------------


class _Truncating:
    """Embeds the first ``max_length`` words only, as a real model truncates word pieces."""

    provider = "test"
    model_name = "truncating"
    dimensions = 8

    def __init__(self, max_length: int = 6):
        self.max_length = max_length

    def embed(self, texts):
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split()[: self.max_length]:
                out[row, hashlib.sha256(word.encode()).digest()[0] % self.dimensions] += 1.0
            out[row] /= max(float(np.linalg.norm(out[row])), 1e-9)
        return out

    def embed_query(self, text):
        return self.embed([text])[0]


class _TruncatingPlugin:
    @staticmethod
    @hookimpl
    def register_embedders(register):
        register("truncating", _Truncating)


@pytest.fixture
def truncating(tmp_path):
    from groundkit_datasette.retrieval import rankers

    gk_registry.pm.register(_TruncatingPlugin, name="truncating-test")
    rankers._embedders.clear()
    yield
    rankers._embedders.clear()
    gk_registry.pm.unregister(name="truncating-test")


def _long_corpus(tmp_path):
    root = tmp_path / "long"
    root.mkdir(exist_ok=True)
    (root / "a.txt").write_text(" ".join(BODY), encoding="utf-8")
    return root


def test_max_length_is_recorded_and_queries_are_embedded_at_it(truncating, tmp_path):
    """A collection embedded at max_length 3 is queried at 3, not at the default (6)."""
    from groundkit_datasette.retrieval.rankers import query_embedder

    root = _long_corpus(tmp_path)
    index_dir = tmp_path / "index"
    ingest([root], collection="long", index_dir=index_dir, embedder="truncating",
           embedder_options={"max_length": 3})
    assert _manifest(index_dir, "long")["embedding_max_length"] == "3"
    with Collection.open("long", index_dir=index_dir) as col:
        assert col.embedding_max_length == 3
        assert query_embedder(col).max_length == 3
        hits = col.search(SearchRequest(query="paragraph 0 is about tidal barrages", mode="dense")).hits
        assert hits
    # A re-ingest without the option keeps the collection's length; another one is refused.
    (root / "b.txt").write_text("Another file about estuaries and their turbines.", encoding="utf-8")
    report = ingest([root], collection="long", index_dir=index_dir, embedder="truncating")
    assert report.added == 1 and _manifest(index_dir, "long")["embedding_max_length"] == "3"
    with pytest.raises(EmbedderError, match="max_length 3; refusing to add vectors embedded at 6"):
        Indexer("long", index_dir=index_dir, embedder="truncating",
                embedder_options={"max_length": 6}).ingest([root])


def test_a_server_embedder_at_another_max_length_is_reported(truncating, tmp_path):
    """The configured embedder at another length answers 409 embedder_mismatch, not wrong hits."""
    root = _long_corpus(tmp_path)
    index_dir = tmp_path / "index"
    ingest([root], collection="long", index_dir=index_dir, embedder="truncating",
           embedder_options={"max_length": 3})
    with Collection.open("long", index_dir=index_dir, embedder=_Truncating(max_length=6)) as col:
        with pytest.raises(EmbedderMismatch, match="max_length 6.*max_length 3"):
            col.search(SearchRequest(query="tidal barrages", mode="dense"))

    async def run():
        def server(length):
            config = {"base_dir": str(root), "embedder": "truncating",
                      "embedder_options": {"max_length": length}}
            return Datasette(files=[], immutables=[str(index_dir / "long.sqlite3")],
                             metadata={"plugins": {"groundkit": config}})

        body = json.dumps({"query": "tidal barrages", "mode": "dense"})
        headers = {"content-type": "application/json"}
        r = await server(6).client.post("/long/-/groundkit/search.json", content=body, headers=headers)
        assert r.status_code == 409 and r.json()["error"] == "embedder_mismatch"
        assert str(index_dir) not in r.text
        r = await server(3).client.post("/long/-/groundkit/search.json", content=body, headers=headers)
        assert r.status_code == 200 and r.json()["mode"] == "dense"

    import asyncio

    asyncio.run(run())


def test_a_collection_without_the_record_keeps_working_at_the_default(truncating, tmp_path):
    """Collections from before the record: queried at the embedder's default, no error."""
    from groundkit_datasette.retrieval.rankers import query_embedder

    root = _long_corpus(tmp_path)
    index_dir = tmp_path / "index"
    ingest([root], collection="long", index_dir=index_dir, embedder="truncating")
    path = index_dir / "long.sqlite3"
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DELETE FROM groundkit_manifest WHERE key = 'embedding_max_length'")
    conn.close()
    with Collection.open("long", index_dir=index_dir) as col:
        assert col.embedding_max_length is None
        assert query_embedder(col).max_length == 6
        assert col.search(SearchRequest(query="tidal barrages", mode="dense")).hits
    # Its next ingest assumes the default: a different length is refused, the default is fine.
    with pytest.raises(EmbedderError, match="max_length 6"):
        Indexer("long", index_dir=index_dir, embedder="truncating",
                embedder_options={"max_length": 3}).ingest([root])
    ingest([root], collection="long", index_dir=index_dir, embedder="truncating")
