"""MiniLM's compute modes (adr/0040): "fp32" (weights dequantised, float matrices) and "int8"
(the shipped int8 matrices multiplied in integers with activations quantised at run time).
A collection records the mode its vectors were computed with (``embedding_compute``), its
queries are embedded the same way, and a collection from before the record stays fp32.

Real model, real ingest into SQLite and LanceDB, real searches and a real Datasette app.
"""

import asyncio
import json
import sqlite3

import numpy as np
import onnx
import pytest
from datasette.app import Datasette
from onnx import numpy_helper

from groundkit_datasette.indexing.ingest import Indexer, embedding_text, ingest
from groundkit_datasette.embedding import onnx_graph
from groundkit_datasette.embedding.embedders import MiniLMEmbedder
from groundkit_datasette.embedding.onnx_cpu import cpu_session
from groundkit_datasette.errors import EmbedderError, EmbedderMismatch
from groundkit_datasette.retrieval import rankers
from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.retrieval.models import MAX_QUERY_CHARS, SearchRequest

from .conftest import manifest, write_corpus
from .test_model_load import TEXTS, _tiny_int8_model


def _manifest(index_dir, name):
    return manifest(index_dir / f"{name}.sqlite3")


def _chunk_texts(index_dir, name):
    conn = sqlite3.connect(index_dir / f"{name}.sqlite3")
    try:
        return {cid: embedding_text(h, t) for cid, h, t in
                conn.execute("SELECT chunk_id, heading, content FROM chunks ORDER BY id")}
    finally:
        conn.close()


def _assert_queries_find_their_own_chunks(col, texts):
    """A query equal to a chunk's embedded text gets that chunk's own vector (cosine 1): the
    query side computes vectors exactly as ingest did."""
    for chunk_id, text in list(texts.items())[:3]:
        hit = col.search(SearchRequest(query=text[:MAX_QUERY_CHARS], mode="dense", top_k=1)).hits[0]
        assert hit.chunk_id == chunk_id
        assert hit.score == pytest.approx(1.0, abs=1e-5)


@pytest.fixture
def fresh_embedders():
    rankers._embedders.clear()
    yield
    rankers._embedders.clear()


def test_int8_graph_multiplies_the_matrices_in_exact_integers(tmp_path):
    """Each int8 matrix becomes a DynamicQuantizeMatMul on uint8 weights (q + 128, zero point
    128), whose sums equal exact integer arithmetic; the uint8 x int8 kernel on this kind of
    CPU saturates pairs of products at 16 bits, which would make the vectors wrong and
    CPU-dependent."""
    path = _tiny_int8_model(tmp_path / "tiny.onnx")
    prepared = onnx_graph.prepare(path.read_bytes(), int8_matmul=True)
    assert prepared is not None and prepared.integer == 1 and prepared.folded == 0
    ops = [n.op_type for n in onnx.load_from_string(prepared.model).graph.node]
    assert "DynamicQuantizeMatMul" in ops and "MatMul" not in ops
    model = onnx.load(str(path))
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    ids = np.array([[0, 3, 49, 3], [7, 7, 1, 0]], dtype=np.int64)
    ours = cpu_session(path, 1, int8_matmul=True).run(None, {"ids": ids})[0]
    # The reference: onnxruntime's DynamicQuantizeLinear (uint8, one scale for the tensor),
    # then the integer product in int64 and the two scales.
    x = (weights["table_q"].astype(np.float32) * weights["table_s"])[ids]
    low, high = min(0.0, float(x.min())), max(0.0, float(x.max()))
    scale = np.float32((high - low) / 255)
    zero = np.clip(np.rint(-low / scale), 0, 255)
    xq = np.clip(np.rint(x / scale) + zero, 0, 255).astype(np.int64) - int(zero)
    exact = (xq @ weights["matrix_q"].astype(np.int64)) * scale * weights["matrix_s"]
    np.testing.assert_allclose(ours, exact, rtol=1e-5, atol=1e-6)
    # A graph with nothing to run in integers is refused, not loaded as float.
    plain = _tiny_int8_model(tmp_path / "plain.onnx", with_pattern=False)
    assert onnx_graph.prepare(plain.read_bytes(), int8_matmul=True) is None
    with pytest.raises(ValueError):
        cpu_session(plain, 1, int8_matmul=True)


def test_int8_graph_with_signed_weights_sums_the_same_integers(tmp_path):
    """Handed over as int8 (zero point 0) rather than uint8 (q + 128, zero point 128), the
    matrices give the same products where the probe finds onnxruntime's int8 kernel exact,
    and a session asked for the default form takes int8 exactly there (adr/0042)."""
    import onnxruntime as ort

    from groundkit_datasette.embedding import onnx_cpu

    path = _tiny_int8_model(tmp_path / "tiny.onnx")
    signed = onnx_graph.prepare(path.read_bytes(), int8_matmul=True, signed=True)
    graph = onnx.load_from_string(signed.model).graph
    assert [n.op_type for n in graph.node if n.op_type == "DynamicQuantizeMatMul"] == ["DynamicQuantizeMatMul"]
    dtypes = {n: a.dtype for n, a in signed.initializers.items() if "groundkit_s8" in n}
    assert set(dtypes.values()) == {np.dtype(np.int8), np.dtype(np.float32)} and len(dtypes) == 3
    ids = np.array([[0, 3, 49, 3], [7, 7, 1, 0]], dtype=np.int64)
    unsigned = cpu_session(path, 1, int8_matmul=True, signed=False).run(None, {"ids": ids})[0]
    as_int8 = cpu_session(path, 1, int8_matmul=True, signed=True).run(None, {"ids": ids})[0]
    default = cpu_session(path, 1, int8_matmul=True).run(None, {"ids": ids})[0]
    if onnx_cpu.signed_kernel_exact(ort):
        np.testing.assert_array_equal(as_int8, unsigned)
    np.testing.assert_array_equal(default, unsigned)  # the default never gives other numbers


def test_the_probe_tells_an_exact_kernel_from_one_that_saturates_pairs():
    """The probe's input quantises to 255 and its matrix is 127s: exact sums give 127 * k, a
    kernel saturating each pair of products at 16 bits (AVX2 without VNNI) about half. What
    onnxruntime answers here is one of the two."""
    import onnxruntime as ort

    model, ones, exact = onnx_graph.signed_probe(rows=2, k=64, n=8)
    assert exact == 127.0 * 64
    pairs = np.full(32, 255 * 127 * 2)
    saturated = float(np.minimum(pairs, 32767).sum()) / 255  # the input's scale is 1/255
    assert abs(saturated - exact) > exact * 0.4
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"a": ones})
    assert out.shape == (2, 8)
    assert np.allclose(out, exact, rtol=1e-6) or np.allclose(out, saturated, rtol=1e-3)


def test_int8_vectors_are_close_to_fp32_and_do_not_depend_on_the_batch():
    """int8 vectors are near the fp32 ones, and a text's vector is the same alone (as a query)
    as among other texts (as at ingest), whatever the batch and thread settings."""
    model_file, _tok = MiniLMEmbedder()._model_files()
    prepared = onnx_graph.prepare(model_file.read_bytes(), int8_matmul=True)
    assert prepared.integer == 36 and prepared.folded == 0 and prepared.gathered == 2
    fp32 = MiniLMEmbedder(compute="fp32").embed(TEXTS)
    batched = MiniLMEmbedder(compute="int8", batch_size=8, threads=2).embed(TEXTS)
    alone = np.stack([MiniLMEmbedder(compute="int8", threads=1).embed_query(t) for t in TEXTS])
    np.testing.assert_array_equal(batched, alone)
    cosines = np.sum(batched * fp32, axis=1)
    assert cosines.min() > 0.97 and cosines.max() < 0.99999  # another computation, close


def test_unknown_compute_mode_is_refused():
    with pytest.raises(EmbedderError, match="compute must be one of fp32, int8"):
        MiniLMEmbedder(compute="fp16")


def test_compute_is_recorded_and_queries_are_computed_the_same_way(fresh_embedders, tmp_path):
    """An int8 collection records "int8", its queries are embedded in int8 (they meet their own
    chunks at cosine 1), a re-ingest keeps int8, and adding fp32 vectors is refused."""
    corpus = write_corpus(tmp_path / "corpus")
    index_dir = tmp_path / "index"
    ingest([corpus], collection="q8", index_dir=index_dir, embedder_options={"compute": "int8"})
    assert _manifest(index_dir, "q8")["embedding_compute"] == "int8"
    with Collection.open("q8", index_dir=index_dir) as col:
        assert col.embedding_compute == "int8"
        assert rankers.query_embedder(col).compute == "int8"
        _assert_queries_find_their_own_chunks(col, _chunk_texts(index_dir, "q8"))
        hybrid = col.search(SearchRequest(query="solar panels", mode="hybrid")).hits
        assert hybrid
    (corpus / "extra.txt").write_text("Tidal turbines sit in estuaries and run twice a day.", encoding="utf-8")
    report = ingest([corpus], collection="q8", index_dir=index_dir)
    assert report.added == 1 and _manifest(index_dir, "q8")["embedding_compute"] == "int8"
    with pytest.raises(EmbedderError, match="compute int8; refusing to add vectors computed with fp32"):
        Indexer("q8", index_dir=index_dir, embedder_options={"compute": "fp32"}).ingest([corpus])


def test_default_is_int8_and_fp32_stays_available(fresh_embedders, tmp_path):
    """A new collection is int8 by default; fp32 is recorded and queried as fp32. Each mode's
    queries meet their own chunks at cosine 1."""
    corpus = write_corpus(tmp_path / "corpus")
    index_dir = tmp_path / "index"
    ingest([corpus], collection="new", index_dir=index_dir)
    assert _manifest(index_dir, "new")["embedding_compute"] == "int8"
    ingest([corpus], collection="f32", index_dir=index_dir, embedder_options={"compute": "fp32"})
    assert _manifest(index_dir, "f32")["embedding_compute"] == "fp32"
    with Collection.open("f32", index_dir=index_dir) as col:
        assert rankers.query_embedder(col).compute == "fp32"
        _assert_queries_find_their_own_chunks(col, _chunk_texts(index_dir, "f32"))


def test_a_collection_without_the_record_stays_fp32(fresh_embedders, tmp_path):
    """Collections from before the record were embedded in fp32: queried in fp32, and an int8
    ingest into them is refused; a plain re-ingest works."""
    corpus = write_corpus(tmp_path / "corpus")
    index_dir = tmp_path / "index"
    ingest([corpus], collection="old", index_dir=index_dir, embedder_options={"compute": "fp32"})
    conn = sqlite3.connect(index_dir / "old.sqlite3")
    with conn:
        conn.execute("DELETE FROM groundkit_manifest WHERE key = 'embedding_compute'")
    conn.close()
    with Collection.open("old", index_dir=index_dir) as col:
        assert col.embedding_compute is None
        assert rankers.query_embedder(col).compute == "fp32"
        _assert_queries_find_their_own_chunks(col, _chunk_texts(index_dir, "old"))
    with pytest.raises(EmbedderError, match="compute fp32; refusing to add vectors computed with int8"):
        Indexer("old", index_dir=index_dir, embedder_options={"compute": "int8"}).ingest([corpus])
    (corpus / "extra.txt").write_text("Geothermal plants tap heat from deep rock.", encoding="utf-8")
    assert ingest([corpus], collection="old", index_dir=index_dir).added == 1  # fp32, though int8 is the default
    assert _manifest(index_dir, "old")["embedding_compute"] == "fp32"


def test_a_server_embedder_with_another_compute_mode_is_reported(fresh_embedders, tmp_path):
    """A configured embedder computing differently answers 409 embedder_mismatch, not near-miss
    vectors; the matching setting answers."""
    corpus = write_corpus(tmp_path / "corpus")
    index_dir = tmp_path / "index"
    ingest([corpus], collection="q8", index_dir=index_dir, embedder_options={"compute": "int8"})
    with Collection.open("q8", index_dir=index_dir, embedder=MiniLMEmbedder(compute="fp32")) as col:
        with pytest.raises(EmbedderMismatch, match="with fp32.*compute int8"):
            col.search(SearchRequest(query="solar panels", mode="dense"))

    async def run():
        def server(compute):
            config = {"base_dir": str(corpus), "embedder": "minilm", "embedder_options": {"compute": compute}}
            return Datasette(files=[], immutables=[str(index_dir / "q8.sqlite3")],
                             metadata={"plugins": {"groundkit": config}})

        body = json.dumps({"query": "solar panels", "mode": "dense"})
        headers = {"content-type": "application/json"}
        r = await server("fp32").client.post("/q8/-/groundkit/search.json", content=body, headers=headers)
        assert r.status_code == 409 and r.json()["error"] == "embedder_mismatch"
        assert str(index_dir) not in r.text
        r = await server("int8").client.post("/q8/-/groundkit/search.json", content=body, headers=headers)
        assert r.status_code == 200 and r.json()["hits"]

    asyncio.run(run())
