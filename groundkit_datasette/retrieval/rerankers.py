"""Rerankers: a local ONNX cross-encoder and a client for ``/rerank`` services.

Plugins add more through the ``register_rerankers`` hook. A reranker scores
(query, text) pairs; higher means more relevant, and scores are only
comparable within one ``score`` call.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .. import registry
from ..errors import RerankerError
from ..hookspecs import hookimpl
from ..embedding.onnx_cpu import cpu_session, usable_threads as _usable_threads
from .reranker_base import Reranker, check_inputs as _check_inputs, positive_int as _positive_int


def get_reranker(name: str, **options: Any) -> Reranker:
    """Build the reranker registered as ``name`` with ``options``."""
    return registry.build("register_rerankers", "reranker", name, options, RerankerError)


def _http_reranker():
    # Imported on first use: the HTTP stack costs more than a query (adr/0041).
    from .http_reranker import HttpReranker

    return HttpReranker


@hookimpl
def register_rerankers(register):
    register("cross-encoder", CrossEncoderReranker)
    register("http", registry.LazyFactory(_http_reranker))


# --------------------------------------------------------------------------
# Cross-encoder (ONNX, in process)

_MODEL_FILE = "model.onnx"
_TOKENIZER_FILE = "tokenizer.json"
_KNOWN_INPUTS = {"input_ids", "attention_mask", "token_type_ids"}


class CrossEncoderReranker:
    """A cross-encoder exported to ONNX, run on the CPU with onnxruntime.

    Nothing is downloaded: ``model_dir`` must already hold ``model.onnx`` and
    a Hugging Face ``tokenizer.json``. To get one, export a sequence
    classification cross-encoder yourself, for example::

        optimum-cli export onnx --task text-classification \\
            --model cross-encoder/ms-marco-MiniLM-L-6-v2 ./ms-marco-minilm

    Scores are the model's raw logits (for two-class heads, the "relevant"
    column). Pairs longer than ``max_length`` tokens are truncated, longest
    side first, as sentence-transformers does.
    """

    name = "cross-encoder"

    def __init__(
        self,
        *,
        model_dir: str | os.PathLike | None = None,
        model_name: str | None = None,
        max_length: int = 512,
        batch_size: int = 32,
        threads: int | None = None,
    ):
        if model_dir is None or (isinstance(model_dir, str) and not model_dir.strip()):
            raise RerankerError("the cross-encoder reranker needs the model_dir option")
        if model_name is not None and (not isinstance(model_name, str) or not model_name.strip()):
            raise RerankerError("model_name must be a non-empty string")
        max_length = _positive_int(max_length, "max_length", maximum=8192)
        if max_length < 4:
            raise RerankerError("max_length must be at least 4")
        self.max_length = max_length
        self.batch_size = _positive_int(batch_size, "batch_size")
        self.threads = _usable_threads() if threads is None else _positive_int(threads, "threads")
        directory = Path(model_dir)
        # Messages name the missing file but never the directory's path.
        if not directory.is_dir():
            raise RerankerError("the cross-encoder model directory does not exist")
        for needed in (_MODEL_FILE, _TOKENIZER_FILE):
            if not (directory / needed).is_file():
                raise RerankerError(f"the cross-encoder model directory has no {needed}")
        self._dir = directory
        self.model_name = model_name or directory.resolve().name
        self._lock = threading.Lock()
        self._session = None
        self._tokenizer = None
        self._pad_id = 0
        self._inputs: dict[str, type] = {}
        self._output = ""

    def __repr__(self) -> str:
        return f"CrossEncoderReranker(model_name={self.model_name!r})"

    def load(self) -> None:
        """Load the model now (otherwise the first ``score`` does); thread-safe."""
        if self._session is not None:
            return
        with self._lock:
            if self._session is not None:
                return
            from tokenizers import Tokenizer

            try:
                tokenizer = Tokenizer.from_file(str(self._dir / _TOKENIZER_FILE))
            except Exception:
                raise RerankerError(f"the cross-encoder {_TOKENIZER_FILE} could not be read") from None
            self._pad_id = _pad_id(tokenizer)
            # Pad per batch ourselves, to the batch's longest pair.
            tokenizer.no_padding()
            tokenizer.enable_truncation(max_length=self.max_length, strategy="longest_first")

            try:
                session = cpu_session(self._dir / _MODEL_FILE, self.threads)
            except Exception:
                raise RerankerError(f"the cross-encoder {_MODEL_FILE} could not be loaded") from None
            inputs = {}
            for arg in session.get_inputs():
                if arg.name not in _KNOWN_INPUTS:
                    raise RerankerError("the cross-encoder model has unexpected inputs")
                inputs[arg.name] = np.int32 if arg.type == "tensor(int32)" else np.int64
            if "input_ids" not in inputs:
                raise RerankerError("the cross-encoder model has no input_ids input")
            names = [o.name for o in session.get_outputs()]
            self._output = "logits" if "logits" in names else names[0]
            self._inputs = inputs
            self._tokenizer = tokenizer
            self._session = session

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        texts = _check_inputs(query, texts)
        if not texts:
            return []
        self.load()
        try:
            encodings = self._tokenizer.encode_batch([(query, t) for t in texts], add_special_tokens=True)
        except Exception:
            raise RerankerError("the cross-encoder tokenizer failed") from None
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        # Length-sorted batches pad less.
        order = np.argsort(lengths, kind="stable")
        scores = np.empty(len(texts), dtype=np.float64)
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            scores[rows] = self._run_batch([encodings[i] for i in rows], int(lengths[rows].max()))
        if not np.isfinite(scores).all():
            raise RerankerError("the cross-encoder produced non-finite scores")
        return scores.tolist()

    def _run_batch(self, encodings, width: int) -> np.ndarray:
        n = len(encodings)
        ids = np.full((n, width), self._pad_id, dtype=np.int64)
        mask = np.zeros((n, width), dtype=np.int64)
        types = np.zeros((n, width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            k = len(enc.ids)
            ids[row, :k] = enc.ids
            mask[row, :k] = 1
            types[row, :k] = enc.type_ids
        arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        feed = {name: arrays[name].astype(dtype, copy=False) for name, dtype in self._inputs.items()}
        try:
            (logits,) = self._session.run([self._output], feed)
        except Exception:
            raise RerankerError("the cross-encoder model failed to run") from None
        logits = np.asarray(logits)
        if logits.ndim == 1 and logits.shape[0] == n:
            return logits
        if logits.ndim == 2 and logits.shape[0] == n and logits.shape[1] in (1, 2):
            return logits[:, logits.shape[1] - 1]
        raise RerankerError("the cross-encoder model returned logits of an unexpected shape")


def _pad_id(tokenizer) -> int:
    padding = tokenizer.padding
    if padding and isinstance(padding.get("pad_id"), int):
        return padding["pad_id"]
    for token in ("[PAD]", "<pad>"):
        found = tokenizer.token_to_id(token)
        if found is not None:
            return found
    return 0  # masked out anyway


def __getattr__(name: str):
    if name == "HttpReranker":  # the old import path keeps working
        return _http_reranker()
    raise AttributeError(name)


# The built-in rerankers, registered on the first lookup after installed plugins (registry.add_builtins).
registry.add_builtins(sys.modules[__name__])
