import numpy as np
import pytest

from groundkit_datasette import registry as gk_registry
from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.indexing.vectors import ANN_INDEX

from .embedder_support import ClusteredEmbedder, embedder_plugin

DIMS = 64
CENTERS = np.random.default_rng(7).normal(size=(40, DIMS)).astype(np.float32)

EMBEDDER = ClusteredEmbedder("clustered-64", CENTERS, 0.7)
Plugin = embedder_plugin("clustered", EMBEDDER)


@pytest.fixture
def clustered():
    gk_registry.pm.register(Plugin, name="clustered-test")
    yield
    gk_registry.pm.unregister(name="clustered-test")


def test_ann_index_is_used_past_the_threshold_with_recall_over_095(tmp_path, clustered, monkeypatch):
    from groundkit_datasette.indexing import vector_search

    monkeypatch.setattr(vector_search, "EXACT_MAX_ROWS", 1000)  # search through the index, not numpy
    corpus = tmp_path / "c"
    corpus.mkdir()
    for f in range(30):
        (corpus / f"f{f}.txt").write_text(
            "\n\n".join(f"record {f}-{i} of batch {f}" for i in range(200))
        )
    index_dir = tmp_path / "index"
    ingest([corpus], collection="big", index_dir=index_dir, embedder="clustered", chunk_size=50,
           chunk_overlap=0, ann_threshold=2000)
    with Collection.open("big", index_dir=index_dir) as col:
        status = col.status()
        assert status.chunks >= 3000 and status.ann_index == ANN_INDEX
        table = col.vectors()
        data = table.to_arrow().select(["chunk_id", "vector"]).to_pydict()
        ids = np.array(data["chunk_id"])
        matrix = np.array(data["vector"], dtype=np.float32)
        rng = np.random.default_rng(1)
        recalls = []
        for row in rng.integers(0, len(ids), 40):
            q = matrix[row] + 0.2 * rng.normal(size=DIMS).astype(np.float32)
            q /= np.linalg.norm(q)
            exact = set(ids[np.argsort(-(matrix @ q))[:10]])
            hits = col.search(query="x", mode="dense", vector=q.tolist(), top_k=10).hits
            recalls.append(len(exact & {h.chunk_id for h in hits}) / 10)
    assert np.mean(recalls) >= 0.95
    with Collection.open("big", index_dir=index_dir) as col:
        # Hybrid asks the ANN index for more candidates than top_k; it must still answer.
        for mode in ("hybrid", "dense"):
            response = col.search(query="record batch", mode=mode, top_k=50)
            assert len(response.hits) == 50


def test_small_collections_search_exactly(tmp_path, clustered):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.txt").write_text("\n\n".join(f"line {i}" for i in range(50)))
    ingest([corpus], collection="small", index_dir=tmp_path / "i", embedder="clustered",
           chunk_size=50, chunk_overlap=0)
    with Collection.open("small", index_dir=tmp_path / "i") as col:
        assert col.status().ann_index is None
