"""Dense search below EXACT_MAX_ROWS runs in numpy over vectors read once per collection
version (indexing/vector_search.py VectorSearch): it must answer exactly what LanceDB's flat
search answers, keep filters as prefilters, and load in the background on the first query."""


import numpy as np
import pytest

from groundkit_datasette import registry as gk_registry
from groundkit_datasette.indexing import vector_search
from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.indexing.vector_search import VectorSearch
from groundkit_datasette.retrieval.collection import Collection

from .embedder_support import ClusteredEmbedder, embedder_plugin

DIMS = 32
CENTRES = np.random.default_rng(3).normal(size=(8, DIMS)).astype(np.float32)

Plugin = embedder_plugin("topics", ClusteredEmbedder("topics-32", CENTRES, 0.8))


@pytest.fixture
def collection(tmp_path):
    gk_registry.pm.register(Plugin, name="topics-test")
    try:
        yield from _build(tmp_path)
    finally:
        gk_registry.pm.unregister(name="topics-test")


def _build(tmp_path):
    corpus = tmp_path / "c"
    corpus.mkdir()
    for f in range(6):
        (corpus / f"f{f}.txt").write_text("\n\n".join(f"entry {f}-{i} about thing {i * 7 % 13} " + "word " * 12
                                                   for i in range(60)))
    ingest([corpus], collection="small", index_dir=tmp_path / "i", embedder="topics", chunk_size=50,
           chunk_overlap=0)
    col = Collection.open("small", index_dir=tmp_path / "i")
    yield col
    col.close()


def _queries(n=12):
    rng = np.random.default_rng(11)
    q = CENTRES[rng.integers(len(CENTRES), size=n)] + rng.normal(size=(n, DIMS))
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def test_exact_search_answers_what_lancedb_flat_search_answers(collection):
    """Same chunks in the same order and the same scores, with and without a document filter."""
    table = collection.vectors()
    assert table.count_rows() >= 300 and not collection.manifest.get("ann_index")
    exact = VectorSearch(table, ann=False)
    flat = VectorSearch(table, ann=False, exact_max_rows=0)  # LanceDB's own (flat) scan
    assert exact.exact and not flat.exact
    docs = sorted({r[0] for r in collection.query("SELECT document_id FROM documents")})
    for q in _queries():
        for depth, documents, exclude in ((10, None, False), (100, None, False),
                                          (10, docs[:2], False), (10, docs[:1], True)):
            ours = exact.search(q, depth, documents, exclude)
            theirs = flat.search(q, depth, documents, exclude)
            assert [c for c, _ in ours] == [c for c, _ in theirs]
            assert np.allclose([s for _, s in ours], [s for _, s in theirs], atol=1e-5)


def test_exact_search_filters_before_the_top_k(collection):
    """A document whose chunks are all far from the query still fills the page: hidden chunks
    never take a slot, and a filter with fewer chunks than top_k returns exactly those."""
    doc = collection.query("SELECT document_id FROM documents ORDER BY source LIMIT 1")[0][0]
    own = {r[0] for r in collection.query("SELECT chunk_id FROM chunks WHERE document_id = ?", (doc,))}
    search = collection.vector_search()
    assert search.exact
    for q in _queries(4):
        hits = search.search(q, 10, [doc])
        assert len(hits) == 10 and {c for c, _ in hits} <= own
        everything = search.search(q, len(own) + 50, [doc])
        assert {c for c, _ in everything} == own
        outside = search.search(q, 10, [doc], exclude=True)
        assert len(outside) == 10 and not {c for c, _ in outside} & own
    assert search.search(_queries(1)[0], 10, []) == []


def test_the_first_dense_query_loads_the_vectors_in_the_background_once(collection, monkeypatch):
    """The text query starts the prefetch; without the index file (a collection from before
    it) the vectors are read from LanceDB once per open collection, not per query."""
    collection.manifest.pop("vector_index")  # in memory only: read as an older collection is
    table = collection.vectors()
    reads = []
    original = table.to_arrow

    def counting(*a, **k):
        reads.append(1)
        return original(*a, **k)

    monkeypatch.setattr(table, "to_arrow", counting)
    assert collection._prefetch is None
    first = collection.search(query="thing 3", mode="dense", top_k=5)
    assert collection._prefetch is not None
    collection._prefetch.join(10)
    second = collection.search(query="thing 3", mode="hybrid", top_k=5)
    assert len(first.hits) == 5 and len(second.hits) == 5
    assert reads == [1]
    assert collection.vector_search() is collection.vector_search()


def test_larger_tables_go_to_lancedb(collection, monkeypatch):
    """Past EXACT_MAX_ROWS the search is LanceDB's, and answers the same hits on a flat table."""
    exact = [h.chunk_id for h in collection.search(query="thing 5", mode="dense", top_k=8).hits]
    monkeypatch.setattr(vector_search, "EXACT_MAX_ROWS", 10)
    fresh = Collection.open("small", index_dir=collection.path.parent)
    fresh.manifest.pop("vector_index")  # no index file (an older collection): LanceDB answers
    try:
        assert not fresh.vector_search().exact
        assert [h.chunk_id for h in fresh.search(query="thing 5", mode="dense", top_k=8).hits] == exact
    finally:
        fresh.close()
