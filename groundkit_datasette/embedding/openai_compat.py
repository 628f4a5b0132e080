"""The OpenAI-compatible embedding client, in its own module so that loading the built-in
MiniLM never imports the HTTP stack (``embedders.py`` imports this on first use). It imports
``base``, never ``embedders``, so the two do not import each other."""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

from ..errors import EmbedderError
from ..security import outbound
from .base import Embedder, check_texts, l2_normalise

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class OpenAICompatibleEmbedder(outbound.GuardedHTTPService, Embedder):
    """``POST {base_url}/embeddings`` as OpenAI, vLLM, Ollama, LiteLLM serve it.

    Every request passes the outbound guard. ``allow_private`` is for local
    servers (permits http and loopback/private addresses). The API key is read
    from the environment variable named by ``api_key_env`` at each call, so
    it is never stored on the object.
    """

    _error_class = EmbedderError
    _key_purpose = "embedding API key"

    provider = "openai-compatible"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        dimensions: int | None = None,
        api_key_env: str | None = None,
        timeout: float = 30.0,
        batch_size: int = 64,
        allow_private: bool = False,
        ca_bundle: str | None = None,
        resolver=None,
    ):
        if not isinstance(model, str) or not model.strip():
            raise EmbedderError("model must be a non-empty string")
        if dimensions is not None and (not isinstance(dimensions, int) or dimensions < 1):
            raise EmbedderError("dimensions must be a positive integer")
        if api_key_env is not None and (not isinstance(api_key_env, str) or not _ENV_NAME.match(api_key_env)):
            raise EmbedderError("api_key_env must be the name of an environment variable")
        if not isinstance(timeout, (int, float)) or not 0 < timeout <= 600:
            raise EmbedderError("timeout must be between 0 and 600 seconds")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise EmbedderError("batch_size must be a positive integer")
        self._endpoint = outbound.validate_endpoint(base_url, allow_private=allow_private)
        self.model_name = model
        self._dimensions = dimensions
        self._init_http(timeout=timeout, api_key_env=api_key_env, ca_bundle=ca_bundle)
        self.batch_size = batch_size
        self._resolver = resolver

    def __repr__(self) -> str:
        return f"OpenAICompatibleEmbedder(model={self.model_name!r}, endpoint={self._endpoint.url!r})"

    @property
    def dimensions(self) -> int:
        """Configured, or learnt from the first reply (probing if none yet)."""
        if self._dimensions is None:
            self.embed(["dimension probe"])
        return self._dimensions

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = check_texts(texts)
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        parts = [self._embed_batch(texts[i : i + self.batch_size]) for i in range(0, len(texts), self.batch_size)]
        return np.concatenate(parts, axis=0)

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        payload = self._post_json("embeddings", {"model": self.model_name, "input": texts}, "embedding")
        return self._parse(payload, len(texts))

    def _parse(self, payload: Any, expected: int) -> np.ndarray:
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list) or len(data) != expected:
            raise EmbedderError("embedding endpoint reply has the wrong number of embeddings")
        rows: list[Any] = [None] * expected
        for position, item in enumerate(data):
            if not isinstance(item, dict) or not isinstance(item.get("embedding"), list):
                raise EmbedderError("embedding endpoint reply is malformed")
            index = item.get("index", position)
            if not isinstance(index, int) or not 0 <= index < expected or rows[index] is not None:
                raise EmbedderError("embedding endpoint reply has bad indexes")
            rows[index] = item["embedding"]
        width = len(rows[0])
        if width == 0 or any(len(r) != width for r in rows):
            raise EmbedderError("embedding endpoint reply has vectors of differing sizes")
        try:
            matrix = np.asarray(rows, dtype=np.float64)
        except (TypeError, ValueError):
            raise EmbedderError("embedding endpoint reply has non-numeric vectors") from None
        if not np.isfinite(matrix).all():
            raise EmbedderError("embedding endpoint reply has non-finite values")
        with self._lock:
            if self._dimensions is None:
                self._dimensions = width
        if width != self._dimensions:
            raise EmbedderError(
                f"embedding endpoint returned {width}-dimensional vectors; expected {self._dimensions}"
            )
        return l2_normalise(matrix)
