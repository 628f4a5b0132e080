import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from groundkit_datasette import registry
from groundkit_datasette.errors import RedirectRefused, RerankerError, UnsafeEndpoint
from groundkit_datasette.hookspecs import hookimpl
from groundkit_datasette.retrieval.rerankers import (
    CrossEncoderReranker,
    HttpReranker,
    Reranker,
    get_reranker,
)

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

# --------------------------------------------------------------------------
# A tiny cross-encoder, built here because no model can be downloaded.
# It is a stand-in, not a real reranker: score = 3 * (number of "relevant"
# tokens) - 0.1 * (number of real tokens), so a text containing "relevant"
# outranks one that does not, and padding changes nothing only if the
# attention mask is fed correctly.

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "relevant", "solar", "panels", "wind", "the", "sun", "power"]


def _tokenizer_json() -> dict:
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for i, t in enumerate(VOCAB[:4])
        ],
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "special_tokens": {
                t: {"id": t, "ids": [VOCAB.index(t)], "tokens": [t]} for t in ("[CLS]", "[SEP]")
            },
        },
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {t: i for i, t in enumerate(VOCAB)}, "unk_token": "[UNK]"},
    }


def _model(*, two_class: bool = False, with_types: bool = False):
    # Column 0: "is this token 'relevant'"; column 1: 1 for every token,
    # including [PAD], which only the mask removes.
    table = np.zeros((len(VOCAB), 2), dtype=np.float32)
    table[VOCAB.index("relevant"), 0] = 1.0
    table[:, 1] = 1.0
    weights = np.array([[3.0], [-0.1]], dtype=np.float32)
    inits = [
        numpy_helper.from_array(table, "table"),
        numpy_helper.from_array(weights, "weights"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "seq_axis"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "last_axis"),
    ]
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["tok"], axis=0),
    ]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
    ]
    emb = "tok"
    if with_types:
        # Segment-B tokens (the text side) add 1.0 to the "relevant" column.
        types = np.array([[0.0, 0.0], [1.0, 0.0]], dtype=np.float32)
        inits.append(numpy_helper.from_array(types, "type_table"))
        inputs.append(helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["batch", "seq"]))
        nodes += [
            helper.make_node("Gather", ["type_table", "token_type_ids"], ["typ"], axis=0),
            helper.make_node("Add", ["tok", "typ"], ["tok_typ"]),
        ]
        emb = "tok_typ"
    nodes += [
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "last_axis"], ["mask3"]),
        helper.make_node("Mul", [emb, "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "seq_axis"], ["pooled"], keepdims=0),
    ]
    if two_class:
        nodes += [
            helper.make_node("MatMul", ["pooled", "weights"], ["pos"]),
            helper.make_node("Neg", ["pos"], ["neg"]),
            helper.make_node("Concat", ["neg", "pos"], ["logits"], axis=1),
        ]
        out_shape = ["batch", 2]
    else:
        nodes.append(helper.make_node("MatMul", ["pooled", "weights"], ["logits"]))
        out_shape = ["batch", 1]
    graph = helper.make_graph(
        nodes,
        "tiny_cross_encoder",
        inputs,
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, out_shape)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by older onnxruntime builds too
    onnx.checker.check_model(model)
    return model


def make_model_dir(path, **kwargs):
    path.mkdir(parents=True)
    onnx.save(_model(**kwargs), str(path / "model.onnx"))
    (path / "tokenizer.json").write_text(json.dumps(_tokenizer_json()), encoding="utf-8")
    return path


@pytest.fixture
def model_dir(tmp_path):
    return make_model_dir(tmp_path / "tiny-ce")


QUERY = "solar panels"
TEXTS = [
    "the wind power",
    "relevant solar panels",
    "the sun",
    "solar power the sun the wind the panels",
]


def test_cross_encoder_ranks_relevant_first(model_dir):
    reranker = get_reranker("cross-encoder", model_dir=str(model_dir))
    assert isinstance(reranker, Reranker)
    assert reranker.name == "cross-encoder"
    assert reranker.model_name == "tiny-ce"
    scores = reranker.score(QUERY, TEXTS)
    assert len(scores) == len(TEXTS)
    assert all(isinstance(s, float) for s in scores)
    assert max(range(len(TEXTS)), key=scores.__getitem__) == 1
    # [CLS] solar panels [SEP] relevant solar panels [SEP]: 8 tokens, one "relevant".
    assert scores[1] == pytest.approx(3.0 - 0.8, abs=1e-5)


def test_cross_encoder_padding_and_batching_do_not_change_scores(model_dir):
    alone = get_reranker("cross-encoder", model_dir=model_dir).score(QUERY, ["the sun"])[0]
    many = ["the sun"] + ["the wind " * 20] * 40 + ["relevant"]
    reranker = get_reranker("cross-encoder", model_dir=model_dir, batch_size=7)
    scores = reranker.score(QUERY, many)
    assert scores[0] == pytest.approx(alone, abs=1e-5)
    assert scores[-1] == max(scores)
    assert reranker.score(QUERY, []) == []


def test_cross_encoder_truncates_to_max_length(model_dir):
    reranker = get_reranker("cross-encoder", model_dir=model_dir, max_length=8)
    # Truncated to 8 tokens, so the length penalty is capped at 0.8.
    (score,) = reranker.score(QUERY, ["the " * 100])
    assert score == pytest.approx(-0.8, abs=1e-5)


def test_cross_encoder_two_class_logits_and_token_types(tmp_path):
    directory = make_model_dir(tmp_path / "two", two_class=True, with_types=True)
    reranker = get_reranker("cross-encoder", model_dir=directory, model_name="stand-in/two-class")
    assert reranker.model_name == "stand-in/two-class"
    scores = reranker.score(QUERY, TEXTS)
    # Column 1 is used; the 4 segment-B tokens (3 words + [SEP]) each add 3.0.
    assert scores[1] == pytest.approx(3.0 - 0.8 + 4 * 3.0, abs=1e-5)
    # 8 words + [SEP] on the text side, 13 tokens in all.
    assert scores[3] == pytest.approx(-1.3 + 9 * 3.0, abs=1e-5)


def test_cross_encoder_missing_files_messages_do_not_leak_paths(tmp_path):
    with pytest.raises(RerankerError, match="model_dir"):
        get_reranker("cross-encoder")
    missing = tmp_path / "secret-place" / "nope"
    with pytest.raises(RerankerError) as info:
        get_reranker("cross-encoder", model_dir=str(missing))
    assert "does not exist" in str(info.value)
    assert "secret-place" not in str(info.value)

    directory = make_model_dir(tmp_path / "secret-place" / "ce")
    (directory / "tokenizer.json").unlink()
    with pytest.raises(RerankerError) as info:
        get_reranker("cross-encoder", model_dir=directory)
    assert "tokenizer.json" in str(info.value)
    assert str(tmp_path) not in str(info.value) and "secret-place" not in str(info.value)

    (directory / "model.onnx").unlink()
    with pytest.raises(RerankerError, match="model.onnx") as info:
        get_reranker("cross-encoder", model_dir=directory)
    assert "secret-place" not in str(info.value)


def test_cross_encoder_rejects_bad_input(model_dir):
    reranker = get_reranker("cross-encoder", model_dir=model_dir)
    with pytest.raises(RerankerError, match="list of strings"):
        reranker.score(QUERY, "a single string")
    with pytest.raises(RerankerError):
        reranker.score(None, ["x"])


def test_unknown_reranker_lists_known_names():
    with pytest.raises(RerankerError) as info:
        get_reranker("no-such-reranker")
    message = str(info.value)
    assert "no-such-reranker" in message
    assert "cross-encoder" in message and "http" in message


def test_bad_option_is_a_reranker_error(model_dir):
    with pytest.raises(RerankerError, match="invalid options"):
        get_reranker("cross-encoder", model_dir=model_dir, colour="blue")


# --------------------------------------------------------------------------
# HTTP: a real server on 127.0.0.1 stands in for a remote rerank service.

SECRET_KEY = "sk-test-do-not-echo-4242"
KEY_ENV = "GROUNDKIT_TEST_RERANK_KEY"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        server = self.server
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"null")
        server.seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
        mode = server.mode
        if mode == "redirect":
            self.send_response(302)
            self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if mode == "error":
            self._reply(500, {"error": f"internal failure near {SECRET_KEY} at secret-body-text"})
            return
        texts = body["texts"] if mode == "tei" else body["documents"]
        # Score = 100 if "relevant" is in the text, plus its length, so each
        # score identifies its text; the reply order is shuffled.
        items = [(i, (100.0 if "relevant" in t else 0.0) + len(t)) for i, t in enumerate(texts)]
        random.Random(len(server.seen)).shuffle(items)
        if mode == "tei":
            self._reply(200, [{"index": i, "score": s} for i, s in items])
        else:
            self._reply(200, {"id": "x", "results": [{"index": i, "relevance_score": s} for i, s in items]})

    def _reply(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.seen = []
    httpd.mode = "tei"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def _url(server, host="127.0.0.1", scheme="http"):
    return f"{scheme}://{host}:{server.server_address[1]}/v1"


HTTP_TEXTS = ["alpha", "beta relevant", "gam", "delta!", "relevant epsilon"]
EXPECTED = [5.0, 113.0, 3.0, 6.0, 116.0]


def test_http_tei_flavor(server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET_KEY)
    with get_reranker(
        "http", base_url=_url(server), api_key_env=KEY_ENV, allow_private=True, batch_size=2
    ) as reranker:
        assert reranker.name == "http"
        assert isinstance(reranker, Reranker)
        assert reranker.score("which is relevant?", HTTP_TEXTS) == EXPECTED
        assert SECRET_KEY not in repr(reranker)
    # 5 texts in batches of 2: three requests, each scored back by index.
    assert len(server.seen) == 3
    first = server.seen[0]
    assert first["path"] == "/v1/rerank"
    assert first["body"] == {"query": "which is relevant?", "texts": ["alpha", "beta relevant"]}
    assert first["headers"]["Authorization"] == f"Bearer {SECRET_KEY}"
    assert [r["body"]["texts"] for r in server.seen[1:]] == [["gam", "delta!"], ["relevant epsilon"]]


def test_http_cohere_flavor(server, monkeypatch):
    server.mode = "cohere"
    monkeypatch.setenv(KEY_ENV, SECRET_KEY)
    reranker = get_reranker(
        "http",
        base_url=_url(server),
        flavor="cohere",
        model="rerank-test-v1",
        api_key_env=KEY_ENV,
        allow_private=True,
    )
    assert reranker.model_name == "rerank-test-v1"
    assert reranker.score("q", HTTP_TEXTS) == EXPECTED
    (request,) = server.seen
    assert request["body"] == {"model": "rerank-test-v1", "query": "q", "documents": HTTP_TEXTS, "top_n": 5}
    assert request["headers"]["Authorization"] == f"Bearer {SECRET_KEY}"
    reranker.close()


def test_http_without_key_sends_no_authorization(server):
    reranker = get_reranker("http", base_url=_url(server), allow_private=True)
    assert reranker.score("q", ["relevant"]) == [108.0]
    assert "Authorization" not in server.seen[0]["headers"]
    assert reranker.score("q", []) == []
    assert len(server.seen) == 1


def test_http_missing_key_env_fails_before_request(server, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    reranker = get_reranker("http", base_url=_url(server), api_key_env=KEY_ENV, allow_private=True)
    with pytest.raises(RerankerError, match=KEY_ENV):
        reranker.score("q", ["a"])
    assert server.seen == []


def test_http_redirect_is_not_followed(server):
    server.mode = "redirect"
    reranker = get_reranker("http", base_url=_url(server), allow_private=True)
    with pytest.raises(RedirectRefused):
        reranker.score("q", ["a"])
    assert [r["path"] for r in server.seen] == ["/v1/rerank"]


def test_http_server_error_message_is_safe(server, monkeypatch):
    server.mode = "error"
    monkeypatch.setenv(KEY_ENV, SECRET_KEY)
    url = _url(server)
    reranker = get_reranker("http", base_url=url, api_key_env=KEY_ENV, allow_private=True)
    with pytest.raises(RerankerError) as info:
        reranker.score("q", ["a"])
    message = str(info.value)
    assert "500" in message
    for leak in (SECRET_KEY, url, "127.0.0.1", str(server.server_address[1]), "secret-body-text"):
        assert leak not in message


def test_http_bad_reply_shapes(server):
    reranker = get_reranker("http", base_url=_url(server), allow_private=True)
    for payload, expected in [
        ({"not": "a list"}, "malformed"),
        ([{"index": 0, "score": 1.0}], "missing scores"),
        ([{"index": 0, "score": 1.0}, {"index": 0, "score": 2.0}], "repeats"),
        ([{"index": 5, "score": 1.0}, {"index": 1, "score": 2.0}], "bad indexes"),
        ([{"index": 0, "score": "high"}, {"index": 1, "score": 2.0}], "non-numeric"),
    ]:
        with pytest.raises(RerankerError, match=expected):
            reranker._parse(payload, 2)


def test_http_loopback_refused_without_allow_private(server):
    # A literal loopback address is refused when the reranker is built...
    with pytest.raises(UnsafeEndpoint):
        get_reranker("http", base_url=_url(server, scheme="https"))
    # ...and a name resolving to loopback is refused before any request.
    reranker = get_reranker("http", base_url=_url(server, host="localhost", scheme="https"))
    with pytest.raises(UnsafeEndpoint) as info:
        reranker.score("q", ["a"])
    assert "loopback" in str(info.value)
    assert "localhost" not in str(info.value)
    # Plain http needs allow_private.
    with pytest.raises(UnsafeEndpoint):
        get_reranker("http", base_url=_url(server, host="localhost"))
    assert server.seen == []


def test_http_option_validation():
    with pytest.raises(RerankerError, match="flavor"):
        HttpReranker(base_url="https://rerank.example.com", flavor="other")
    with pytest.raises(RerankerError, match="api_key_env"):
        HttpReranker(base_url="https://rerank.example.com", api_key_env="sk-not-a-name!")
    with pytest.raises(RerankerError, match="timeout"):
        HttpReranker(base_url="https://rerank.example.com", timeout=0)
    with pytest.raises(UnsafeEndpoint) as info:
        HttpReranker(base_url="https://user:pw@rerank.example.com")
    assert "pw" not in str(info.value)


# --------------------------------------------------------------------------
# Third-party rerankers arrive through the pluggy hook.


class _LengthReranker:
    name = "by-length"

    def __init__(self, *, model_name="length-v0"):
        self.model_name = model_name

    def score(self, query, texts):
        return [float(len(t)) for t in texts]


class _ThirdPartyPlugin:
    @hookimpl
    def register_rerankers(self, register):
        register("by-length", _LengthReranker)


def test_third_party_reranker_via_hook():
    plugin = _ThirdPartyPlugin()
    registry.pm.register(plugin, name="test-third-party-reranker")
    try:
        reranker = get_reranker("by-length", model_name="custom")
        assert isinstance(reranker, Reranker)
        assert reranker.model_name == "custom"
        assert reranker.score("q", ["a", "abc"]) == [1.0, 3.0]
        # Built-ins are still there alongside it.
        assert {"cross-encoder", "http", "by-length"} <= set(registry.registered("register_rerankers"))
    finally:
        registry.pm.unregister(plugin)
    with pytest.raises(RerankerError, match="unknown reranker"):
        get_reranker("by-length")


def test_cross_encoder_class_is_the_registered_factory():
    assert registry.registered("register_rerankers")["cross-encoder"] is CrossEncoderReranker
