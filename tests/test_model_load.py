"""How the default MiniLM is loaded (adr/0037): int8 weights dequantised in numpy and handed to
onnxruntime from memory, the same vectors as onnxruntime folding the file itself, and a fresh
process's first dense query loading the model in a thread before the rest of the search."""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.embedding import onnx_graph
from groundkit_datasette.embedding.embedders import MiniLMEmbedder
from groundkit_datasette.embedding.onnx_cpu import cpu_session

from .conftest import snapshot, write_corpus

# Real chunk-like texts of several lengths (one longer than 128 word pieces).
TEXTS = [
    "Photovoltaic panels turn sunlight into electricity.",
    "Batteries store surplus energy for the night. Lithium-ion cells dominate home storage.",
    "Dams hold water & release it through turbines; pumped storage moves water uphill when power is cheap.",
    "def watts(volts, amps):\n    return volts * amps\n",
    " ".join(["Offshore wind farms see steadier winds than onshore ones, and maintenance at sea is "
              "expensive and weather dependent."] * 8),
    "x",
]


def _folded_session(model_file):
    """The session as it was built before adr/0037: onnxruntime folds the file's Cast/Mul."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(str(model_file), sess_options=options, providers=["CPUExecutionProvider"])


def test_shipped_model_is_rewritten_and_gives_the_vectors_onnxruntime_folding_gives():
    """Every int8 weight is dequantised before onnxruntime sees the graph (nothing left for its
    constant folding), and the vectors equal those of the old, folding session."""
    ours = MiniLMEmbedder(batch_size=4, compute="fp32")  # the float graph (int8 compute: adr/0040)
    model_file, _tok = ours._model_files()
    prepared = onnx_graph.prepare(model_file.read_bytes())
    assert prepared is not None
    assert prepared.folded == 36 and prepared.gathered == 2  # 6 layers x 6 matrices; word + position tables
    assert len(prepared.model) < 1_000_000  # the graph alone: weights come from memory, not the proto
    graph = onnx.load_from_string(prepared.model).graph
    int8_in_graph = [t.name for t in graph.initializer
                     if t.data_type == TensorProto.INT8 and t.data_location != TensorProto.EXTERNAL]
    assert int8_in_graph == []

    reference = MiniLMEmbedder(batch_size=4, compute="fp32")
    reference.load()
    reference._session = _folded_session(model_file)  # same tokenizer and pooling, the old session
    mine, theirs = ours.embed(TEXTS), reference.embed(TEXTS)
    cosines = np.sum(mine * theirs, axis=1)
    assert cosines.min() >= 0.99999
    np.testing.assert_allclose(mine, theirs, atol=1e-6)


def _tiny_int8_model(path, with_pattern=True):
    """A small graph in the export's shape: an int8 embedding table (per-row scales) gathered by
    the input ids, then an int8 matrix (per-column scales) multiplied in."""
    rng = np.random.default_rng(7)
    table_q = rng.integers(-127, 128, size=(50, 8), dtype=np.int8)
    table_s = rng.random((50, 1), dtype=np.float32) / 100
    matrix_q = rng.integers(-127, 128, size=(8, 4), dtype=np.int8)
    matrix_s = rng.random((1, 4), dtype=np.float32) / 100
    inits = [numpy_helper.from_array(table_q, "table_q"), numpy_helper.from_array(table_s, "table_s"),
             numpy_helper.from_array(matrix_q, "matrix_q"), numpy_helper.from_array(matrix_s, "matrix_s")]
    if with_pattern:
        nodes = [helper.make_node("Cast", ["table_q"], ["table_f"], to=TensorProto.FLOAT),
                 helper.make_node("Mul", ["table_f", "table_s"], ["table"]),
                 helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
                 helper.make_node("Cast", ["matrix_q"], ["matrix_f"], to=TensorProto.FLOAT),
                 helper.make_node("Mul", ["matrix_f", "matrix_s"], ["matrix"]),
                 helper.make_node("MatMul", ["rows", "matrix"], ["out"])]
    else:  # the same arithmetic with DequantizeLinear-free float weights: nothing to rewrite
        inits = [numpy_helper.from_array(table_q.astype(np.float32) * table_s, "table"),
                 numpy_helper.from_array(matrix_q.astype(np.float32) * matrix_s, "matrix")]
        nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
                 helper.make_node("MatMul", ["rows", "matrix"], ["out"])]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["b", "s", 4])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, path)
    return path


def test_rewrite_is_bit_identical_on_a_small_graph(tmp_path):
    """Gathering int8 rows before dequantising them, and dequantising matrices in numpy, give
    exactly the numbers onnxruntime's own Cast and Mul give."""
    path = _tiny_int8_model(tmp_path / "tiny.onnx")
    prepared = onnx_graph.prepare(path.read_bytes())
    assert prepared is not None and prepared.folded == 1 and prepared.gathered == 1
    ids = np.array([[0, 3, 49, 3], [7, 7, 1, 0]], dtype=np.int64)
    ours = cpu_session(path, 1).run(None, {"ids": ids})[0]
    theirs = _folded_session(path).run(None, {"ids": ids})[0]
    np.testing.assert_array_equal(ours, theirs)


def test_graphs_without_the_pattern_and_garbage_are_loaded_unchanged(tmp_path):
    """The rewrite touches only int8 Cast/Mul weights; anything else (or a file this reader cannot
    parse) is left for onnxruntime to load as it is."""
    plain = _tiny_int8_model(tmp_path / "plain.onnx", with_pattern=False)
    assert onnx_graph.prepare(plain.read_bytes()) is None
    ids = np.array([[1, 2]], dtype=np.int64)
    assert cpu_session(plain, 1).run(None, {"ids": ids})[0].shape == (1, 2, 4)
    assert onnx_graph.prepare(b"") is None
    assert onnx_graph.prepare(b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff") is None
    whole = _tiny_int8_model(tmp_path / "tiny.onnx").read_bytes()
    assert onnx_graph.prepare(whole[: len(whole) // 2]) is None  # truncated


@pytest.fixture(scope="module")
def minilm_index(tmp_path_factory):
    """A real collection embedded with the default MiniLM (read-only for the tests)."""
    root = tmp_path_factory.mktemp("warm")
    corpus = write_corpus(root / "corpus")
    ingest([corpus], collection="energy", index_dir=root / "index")
    return root / "index"


_CHILD = """
import json, sys, threading
from groundkit_datasette.retrieval.collection import Collection
col = Collection.open("energy", index_dir=sys.argv[1])
mode = sys.argv[2]
seen = {}
real_start = threading.Thread.start
def start(self):
    if self.name == "groundkit-warm-minilm":
        seen["models imported when the load started"] = "groundkit_datasette.retrieval.models" in sys.modules
        seen["pydantic imported when the load started"] = "pydantic" in sys.modules
        ort = sys.modules.get("onnxruntime")
        seen["onnxruntime imported when the load started"] = ort is not None
        if ort is not None:
            real_init = ort.InferenceSession.__init__
            def init(session, *args, **kwargs):
                seen["session built on"] = threading.current_thread().name
                real_init(session, *args, **kwargs)
            ort.InferenceSession.__init__ = init
    real_start(self)
threading.Thread.start = start
if mode == "vector":
    response = col.search(query="night storage", vector=[0.05] * 384, mode="dense", top_k=3)
else:
    response = col.search(query="How do batteries store energy at night?", mode=mode, top_k=3)
seen["onnxruntime"] = "onnxruntime" in sys.modules
seen["hits"] = [[h.chunk_id, round(h.score, 6)] for h in response.hits]
seen["response"] = type(response).__name__
seen["body"] = response.model_dump(mode="json", exclude={"timings_ms"})
print(json.dumps(seen))
"""


def _fresh_search(index_dir, mode):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", _CHILD, str(index_dir), mode], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_first_hybrid_search_loads_the_model_before_the_rest_of_the_search(minilm_index):
    """A fresh process starts the model load before importing the response models, and its
    answer is the one the same search gives once everything is loaded."""
    before = snapshot(minilm_index)
    fresh = _fresh_search(minilm_index, "hybrid")
    assert fresh["models imported when the load started"] is False
    from groundkit_datasette.retrieval.collection import Collection

    with Collection.open("energy", index_dir=minilm_index) as col:
        col.search(query="warm up", mode="hybrid", top_k=1)
        again = col.search(query="How do batteries store energy at night?", mode="hybrid", top_k=3)
    assert fresh["hits"] == [[h.chunk_id, round(h.score, 6)] for h in again.hits]
    # The same response model, field for field (its schema built on first use, adr/0037).
    assert fresh["response"] == "SearchResponse"
    assert fresh["body"] == again.model_dump(mode="json", exclude={"timings_ms"})
    assert snapshot(minilm_index) == before  # nothing written by a read, model included


def test_the_session_is_prepared_before_the_thread_and_built_in_it(minilm_index):
    """The searching thread imports onnxruntime (Python work, which holds the GIL) before
    pydantic; the model thread then builds the session (onnxruntime's own work, which does
    not), so the build runs beside the main thread's imports instead of taking turns with
    them (adr/0037; which thread does the rest: test_the_warm_up_thread_only_builds_the_session)."""
    fresh = _fresh_search(minilm_index, "hybrid")
    assert fresh["pydantic imported when the load started"] is False
    assert fresh["onnxruntime imported when the load started"] is True
    assert fresh["session built on"] == "groundkit-warm-minilm"


def test_response_models_build_their_schemas_on_first_use_and_validate_as_strictly():
    """Importing the models builds no response schema (a fresh search needs none of them to
    answer); the request is validated as strictly as before, and a response validated from
    the same fields equals the one built without validation."""
    code = (
        "import json, pydantic\n"
        "from groundkit_datasette.retrieval import models as m\n"
        "deferred = [c.__name__ for c in (m.SearchResponse, m.Hit, m.ComponentScore, m.IndexStatus,\n"
        "            m.DocumentResponse, m.SearchRequest) if not c.__pydantic_complete__]\n"
        "errors = []\n"
        "for bad in ({'query': ''}, {'query': 'x', 'top_k': 0}, {'query': 'x', 'top_k': 51},\n"
        "            {'query': 'x', 'nope': 1}, {'query': 'x', 'min_score': float('inf')},\n"
        "            {'query': 'x', 'mode': 'bm25', 'vector': [0.1]}):\n"
        "    try:\n"
        "        m.SearchRequest(**bad)\n"
        "    except pydantic.ValidationError as e:\n"
        "        errors.append(e.errors()[0]['type'])\n"
        "hit = dict(chunk_id='c_' + '0' * 24, document_id='d', source='s', title=None, start_offset=0,\n"
        "           end_offset=1, line_start=1, line_end=1, page_start=None, page_end=None, heading='',\n"
        "           content='x', rank=1, score=0.5, components={}, source_changed=None, matched_terms=[])\n"
        "built = m.Hit.model_validate(dict(hit))\n"
        "print(json.dumps({'deferred': deferred, 'errors': errors, 'same': built == m.Hit(**hit)}))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout)
    assert seen["deferred"] == ["SearchResponse", "Hit", "ComponentScore", "IndexStatus", "DocumentResponse",
                                "SearchRequest"]
    # A non-finite floor: pydantic-core's own check since session 9 (it was a Python validator).
    assert seen["errors"] == ["string_too_short", "greater_than_equal", "less_than_equal", "extra_forbidden",
                              "finite_number", "value_error"]
    assert seen["same"] is True


def test_bm25_and_vector_searches_never_load_the_model(minilm_index):
    """Only a text query in a dense mode loads the query model."""
    for mode in ("bm25", "vector"):
        seen = _fresh_search(minilm_index, mode)
        assert "models imported when the load started" not in seen
        assert seen["onnxruntime"] is False
        assert seen["hits"]


def test_load_takes_the_warmed_session_once():
    """The embedder built after a warm-up uses the session the warm-up loaded, instead of
    loading a second one; a later embedder loads its own."""
    from groundkit_datasette.embedding import embedders

    embedders._loaded.clear()
    thread = MiniLMEmbedder.start_warm()
    assert thread is not None
    assert MiniLMEmbedder.start_warm() is None  # one warm-up per configuration
    thread.join()
    key = next(iter(embedders._warming))
    warmed = embedders._warming[key].result()  # the session the warm-up built
    first = MiniLMEmbedder()
    first.load()
    assert first._session is warmed
    second = MiniLMEmbedder()
    second.load()
    assert second._session is not warmed
    assert MiniLMEmbedder.start_warm() is None  # loaded in this process: nothing to warm
    np.testing.assert_array_equal(first.embed(TEXTS), second.embed(TEXTS))


def test_a_warm_up_at_a_recorded_length_serves_the_embedder_of_that_length():
    """A collection embedded at max_length 256 warms the session its query embedder (built at
    256) takes, not one at the default that nothing would use."""
    from groundkit_datasette.embedding import embedders

    embedders._loaded.clear()
    embedders._warming.clear()
    thread = MiniLMEmbedder.start_warm(256)
    assert thread is not None
    thread.join()
    (key,) = embedders._warming
    assert key[2] == 256
    warmed = embedders._warming[key].result()  # the session the warm-up built
    at_256 = MiniLMEmbedder(max_length=256)
    at_256.load()
    assert at_256._session is warmed
    assert not embedders._warming


def test_the_warm_up_thread_only_builds_the_session(monkeypatch):
    """What holds the GIL (rewriting the graph, reading the tokenizer) runs on the thread that
    asks; the warm-up thread only builds the session, which holds no GIL (adr/0041). In the
    thread, the rewrite and the tokenizer took turns with the asking thread's imports and made
    the first hybrid answer wait."""
    import threading

    import tokenizers

    from groundkit_datasette.embedding import embedders

    where = []

    def recorded(name, fn):
        def call(*args, **kwargs):
            where.append((name, threading.current_thread().name))
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(onnx_graph, "prepare", recorded("rewrite", onnx_graph.prepare))
    monkeypatch.setattr(ort, "InferenceSession", recorded("session", ort.InferenceSession))
    monkeypatch.setattr(tokenizers.Tokenizer, "from_file",
                        staticmethod(recorded("tokenizer", tokenizers.Tokenizer.from_file)))
    embedders._loaded.clear()
    embedders._warming.clear()
    me = threading.current_thread().name
    thread = MiniLMEmbedder.start_warm()
    assert thread is not None
    thread.join()
    embedder = MiniLMEmbedder()
    embedder.load()
    assert where == [("rewrite", me), ("session", "groundkit-warm-minilm"), ("tokenizer", me)]
    assert embedder.embed_query("solar panels").shape == (384,)


_CLI_CHILD = """
import json, sys, threading
seen = {}
real_start = threading.Thread.start
def start(self):
    if self.name == "groundkit-warm-minilm":
        seen["pydantic imported when the load started"] = "pydantic" in sys.modules
    real_start(self)
threading.Thread.start = start
from groundkit_datasette.cli import cli
try:
    cli(["search", "energy", "How do batteries store energy at night?", "--index-dir", sys.argv[1],
         "--mode", "hybrid", "--json"])
except SystemExit as exit:
    seen["exit"] = exit.code
print(json.dumps(seen), file=sys.stderr)
"""


def test_the_cli_search_starts_the_model_load_before_validating_the_request(minilm_index):
    """`groundkit search` hands the search its fields, so the query model starts loading
    before pydantic is imported to validate them (adr/0041); the answer is the same."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", _CLI_CHILD, str(minilm_index)], capture_output=True,
                         text=True, env=env, timeout=300)
    seen = json.loads(out.stderr.strip().splitlines()[-1])
    assert seen == {"pydantic imported when the load started": False, "exit": 0}
    from groundkit_datasette.retrieval.collection import Collection

    with Collection.open("energy", index_dir=minilm_index) as col:
        again = col.search(query="How do batteries store energy at night?", mode="hybrid", top_k=10)
    printed = json.loads(out.stdout)
    assert [h["chunk_id"] for h in printed["hits"]] == [h.chunk_id for h in again.hits]
