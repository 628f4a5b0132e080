import shutil

import pytest
from pydantic import ValidationError

from groundkit_datasette.retrieval.collection import Collection, list_collections
from groundkit_datasette.errors import (
    ChunkNotFound,
    CollectionNotFound,
    DenseUnavailable,
    EmbedderMismatch,
    InvalidCollectionName,
    InvalidRequest,
    RerankNotConfigured,
)
from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.retrieval.models import MAX_QUERY_CHARS, MAX_TOP_K, SearchRequest

from .conftest import snapshot, write_corpus


@pytest.fixture(scope="module")
def dense_index(tmp_path_factory):
    """One real collection with real all-MiniLM-L6-v2 vectors, shared by the module (read-only)."""
    root = tmp_path_factory.mktemp("dense")
    corpus = write_corpus(root / "corpus")
    index_dir = root / "index"
    ingest([corpus], collection="energy", index_dir=index_dir)
    return index_dir


@pytest.fixture
def bm25_index(corpus, index_dir):
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    return index_dir


def test_bm25_ranks_the_matching_chunk_first(bm25_index):
    with Collection.open("energy", index_dir=bm25_index) as col:
        response = col.search(query="How do batteries store energy at night?")
    assert response.mode == "bm25"  # no vectors: bm25 is the default
    top = response.hits[0]
    assert top.source == "solar.md" and "Batteries" in top.content
    assert top.heading == "Solar power > Storage"
    assert top.components["bm25"].rank == 1
    assert [h.rank for h in response.hits] == list(range(1, len(response.hits) + 1))
    assert all(a.score >= b.score for a, b in zip(response.hits, response.hits[1:]))


@pytest.mark.parametrize(
    "query,word,source",
    [
        ('"unbalanced offshore', "offshore", "notes/wind.txt"),
        ("NEAR(photovoltaic sunlight)", "photovoltaic sunlight", "solar.md"),
        ("lithium AND OR NOT", "lithium", "solar.md"),
        ("col:dams", "dams", "notes/hydro.html"),
        ("uphill*", "uphill", "notes/hydro.html"),
        ("^maintenance", "maintenance", "notes/wind.txt"),
        ("a -volts +c", "volts", "notes/calc.py"),
        ("'; DROP TABLE chunks; -- decade", "decade", "solar.md"),
        ("(((weather", "weather", "notes/wind.txt"),
        ("ünïcödé 東京 🌞 onshore", "onshore", "notes/wind.txt"),
    ],
)
def test_any_string_is_a_valid_bm25_query(bm25_index, query, word, source):
    """Query syntax (FTS operators, quotes, SQL) is neither an error nor an operator: the
    words around it find exactly what they find alone."""
    with Collection.open("energy", index_dir=bm25_index) as col:
        hits = col.search(query=query, mode="bm25").hits
        alone = col.search(query=word, mode="bm25").hits
        assert col.query("SELECT count(*) FROM chunks")[0][0] > 0
    assert hits and hits[0].source == source
    assert [h.chunk_id for h in hits] == [h.chunk_id for h in alone]


def test_bm25_uses_or_semantics_stemming_and_stop_words(bm25_index):
    with Collection.open("energy", index_dir=bm25_index) as col:
        hits = col.search(query="the turbines and batteries", mode="bm25", top_k=10).hits
        sources = {h.source for h in hits}
        assert {"solar.md", "notes/wind.txt"} <= sources  # either term suffices
        stemmed = col.search(query="battery", mode="bm25").hits
        assert stemmed and "Batteries" in stemmed[0].content
        assert col.search(query="the and of", mode="bm25").hits == []


def test_bm25_ties_are_broken_by_content_hash(tmp_path, index_dir):
    corpus = tmp_path / "ties"
    corpus.mkdir()
    for i in range(6):  # same length, one occurrence each: equal BM25 scores
        (corpus / f"t{i}.txt").write_text(f"zebra item{i}\n")
    ingest([corpus], collection="ties", index_dir=index_dir, embedder="none")
    with Collection.open("ties", index_dir=index_dir) as col:
        hits = col.search(query="zebra", mode="bm25", top_k=6).hits
        hashes = {
            cid: h for cid, h in col.query("SELECT chunk_id, content_hash FROM chunks")
        }
    assert len({h.score for h in hits}) == 1
    assert [hashes[h.chunk_id] for h in hits] == sorted(hashes[h.chunk_id] for h in hits)


def test_filters_apply_before_truncation(bm25_index):
    with Collection.open("energy", index_dir=bm25_index) as col:
        hits = col.search(query="energy water wind sun", mode="bm25", source="notes/", top_k=1).hits
        assert len(hits) == 1 and hits[0].source.startswith("notes/")
        globbed = col.search(query="energy water wind sun", source="*.html", mode="bm25").hits
        assert {h.source for h in globbed} == {"notes/hydro.html"}
        doc = globbed[0].document_id
        by_doc = col.search(query="energy water wind sun", document_id=doc, mode="bm25").hits
        assert {h.document_id for h in by_doc} == {doc}


def test_request_bounds_are_validated():
    SearchRequest(query="x" * MAX_QUERY_CHARS, top_k=MAX_TOP_K)
    for bad in (
        {"query": ""},
        {"query": "x" * (MAX_QUERY_CHARS + 1)},
        {"query": "x", "top_k": 0},
        {"query": "x", "top_k": MAX_TOP_K + 1},
        {"query": "x", "mode": "fuzzy"},
        {"query": "x", "vector": [float("nan")]},
        {"query": "x", "vector": [float("inf")]},
        {"query": "x", "vector": [0.1] * 4097},
        {"query": "x", "unexpected": 1},
    ):
        with pytest.raises(ValidationError):
            SearchRequest(**bad)


def test_dense_and_hybrid_need_vectors(bm25_index):
    with Collection.open("energy", index_dir=bm25_index) as col:
        for mode in ("dense", "hybrid"):
            with pytest.raises(DenseUnavailable, match="without embeddings"):
                col.search(query="sun", mode=mode)


def test_rerank_without_a_reranker_is_its_own_error(bm25_index):
    with Collection.open("energy", index_dir=bm25_index) as col:
        with pytest.raises(RerankNotConfigured):
            col.search(query="sun", rerank=True)


def test_dense_search_with_real_embeddings(dense_index):
    with Collection.open("energy", index_dir=dense_index) as col:
        response = col.search(query="keeping electricity for later use", mode="dense", top_k=3)
        assert response.hits[0].source == "solar.md"
        assert "Batteries" in response.hits[0].content
        assert all(-1.0 <= h.score <= 1.0 for h in response.hits)
        filtered = col.search(query="keeping electricity", mode="dense", source="notes/", top_k=2)
        assert len(filtered.hits) == 2
        assert all(h.source.startswith("notes/") for h in filtered.hits)


def test_hybrid_is_default_with_vectors_and_reports_components(dense_index):
    with Collection.open("energy", index_dir=dense_index) as col:
        response = col.search(query="offshore wind maintenance")
        assert response.mode == "hybrid"
        top = response.hits[0]
        assert top.source == "notes/wind.txt"
        assert set(top.components) == {"bm25", "dense"}
        expected = 1 / (60 + top.components["bm25"].rank) + 1 / (60 + top.components["dense"].rank)
        assert top.score == pytest.approx(expected)


def test_caller_vector_is_checked_and_used(dense_index):
    with Collection.open("energy", index_dir=dense_index) as col:
        with pytest.raises(InvalidRequest, match="384"):
            col.search(query="x", mode="dense", vector=[0.1, 0.2])
        from groundkit_datasette.embedding.embedders import get_embedder

        vec = get_embedder("minilm").embed_query("water released through turbines at a dam")
        hits = col.search(query="ignored", mode="dense", vector=vec.tolist(), top_k=1).hits
        assert hits[0].source == "notes/hydro.html"


def test_server_embedder_must_match_the_manifest(dense_index):
    class Other:
        provider, model_name, dimensions = "onnx", "some/other-model", 384

        def embed_query(self, text):
            raise AssertionError("must not be called")

    col = Collection.open("energy", index_dir=dense_index, embedder=Other())
    with col, pytest.raises(EmbedderMismatch, match="some/other-model"):
        col.search(query="sun", mode="dense")


def test_status_counts_and_manifest(dense_index):
    with Collection.open("energy", index_dir=dense_index) as col:
        status = col.status()
        assert status.documents == 4
        assert status.chunks == col.query("SELECT count(*) FROM chunks")[0][0]
        assert status.embedding.model == "sentence-transformers/all-MiniLM-L6-v2"
        assert status.embedding.dimensions == 384 and status.dense_available
        text = status.model_dump_json()
    assert str(dense_index) not in text and "corpus" not in text


def test_fetch_chunk_missing_id_is_not_found(bm25_index):
    with Collection.open("energy", index_dir=bm25_index) as col:
        with pytest.raises(ChunkNotFound):
            col.fetch_chunk("c_" + "0" * 24)
        with pytest.raises(ValidationError):
            col.fetch_chunk("../../etc/passwd")


def test_open_validates_the_name_before_looking(bm25_index):
    for bad in ("../energy", "energy/..", "/etc/passwd", "a\0b"):
        with pytest.raises(InvalidCollectionName):
            Collection.open(bad, index_dir=bm25_index)
    with pytest.raises(CollectionNotFound):
        Collection.open("missing", index_dir=bm25_index)
    assert not (bm25_index / "missing.sqlite3").exists()


def test_list_collections_skips_unrelated_files_and_escaping_symlinks(tmp_path, bm25_index):
    import sqlite3

    sqlite3.connect(bm25_index / "plain.sqlite3").execute("CREATE TABLE t(x)").connection.close()
    (bm25_index / "notes.txt").write_text("hello")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(bm25_index / "energy.sqlite3", outside / "stolen.sqlite3")
    (bm25_index / "stolen.sqlite3").symlink_to(outside / "stolen.sqlite3")
    before = snapshot(bm25_index)
    assert list_collections(bm25_index).collections == ["energy"]
    assert snapshot(bm25_index) == before


def test_every_operation_leaves_the_index_dir_byte_identical(dense_index, tmp_path):
    before = snapshot(dense_index)
    names_before = sorted(p.name for p in dense_index.rglob("*"))
    with Collection.open("energy", index_dir=dense_index) as col:
        for mode in ("bm25", "dense", "hybrid"):
            col.search(query="solar panels", mode=mode, top_k=5)
        col.search(query="solar", source="notes/", mode="dense")
        hit = col.search(query="solar panels", mode="bm25").hits[0]
        col.fetch_chunk(hit.chunk_id)
        col.status()
        # Each refusal is the specific error for it (not any exception, such as one from a write).
        for failing, error, words in (
            (lambda: col.fetch_chunk("c_" + "f" * 24), ChunkNotFound, "not found"),
            (lambda: col.search(query="x", rerank=True), RerankNotConfigured, "no reranker"),
            (lambda: col.search(query="x", mode="dense", vector=[1.0]), InvalidRequest, "dimensions"),
        ):
            with pytest.raises(error, match=words):
                failing()
    list_collections(dense_index)
    for bad, error in (("missing", CollectionNotFound), ("../x", InvalidCollectionName)):
        with pytest.raises(error):
            Collection.open(bad, index_dir=dense_index)
    assert snapshot(dense_index) == before
    assert sorted(p.name for p in dense_index.rglob("*")) == names_before


def _assert_takes_no_lock(reader, path):
    """With ``reader`` inside a read transaction, a writer still gets an EXCLUSIVE lock at once:
    an ``immutable=1`` reader takes no file locks (``mode=ro`` alone would hold a SHARED one)."""
    import sqlite3

    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM chunks").fetchone()[0] > 0
    writer = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        writer.execute("BEGIN EXCLUSIVE")  # "database is locked" if the reader held a lock
        writer.execute("ROLLBACK")
    finally:
        writer.close()
        reader.execute("ROLLBACK")


async def test_readers_take_no_locks_and_leave_no_side_files(bm25_index, corpus):
    """Collections are read with no locks (an ingest's rename never waits, a crashed reader
    never blocks): through Collection and through the database Datasette serves."""
    from datasette.app import Datasette

    path = bm25_index / "energy.sqlite3"
    before = snapshot(bm25_index)
    with Collection.open("energy", index_dir=bm25_index) as col:
        _assert_takes_no_lock(col._conn, path)
    ds = Datasette(files=[], immutables=[str(path)], metadata={"plugins": {"groundkit": {"base_dir": str(corpus)}}})
    await ds.invoke_startup()
    conn = ds.get_database("energy").connect()
    try:
        _assert_takes_no_lock(conn, path)
    finally:
        conn.close()
    assert snapshot(bm25_index) == before
    assert not [p.name for p in bm25_index.iterdir() if p.name.endswith(("-journal", "-wal", "-shm"))]


def test_a_newer_publish_is_detected(corpus, index_dir):
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    col = Collection.open("energy", index_dir=index_dir)
    assert col.is_current()
    (corpus / "new.md").write_text("# New\n\nfresh content about geothermal heat\n")
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    assert not col.is_current()
    assert col.search(query="geothermal", mode="bm25").hits == []  # old view, whole
    col.close()
    with Collection.open("energy", index_dir=index_dir) as fresh:
        assert fresh.search(query="geothermal", mode="bm25").hits[0].source == "new.md"
