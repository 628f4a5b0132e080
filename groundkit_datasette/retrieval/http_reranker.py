"""The HTTP reranker client, in its own module so that a process that never reranks over
HTTP never imports the HTTP stack (``rerankers.py`` registers it lazily). It imports
``reranker_base``, never ``rerankers``, so the two do not import each other."""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

from ..errors import RerankerError
from ..security import outbound
from .reranker_base import check_inputs, positive_int


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FLAVORS = ("tei", "cohere")


class HttpReranker(outbound.GuardedHTTPService):
    """``POST {base_url}/rerank`` in the TEI or the Cohere (v1/v2) shape.

    ``flavor="tei"`` sends ``{"query", "texts"}`` and reads
    ``[{"index", "score"}]`` (Hugging Face text-embeddings-inference).
    ``flavor="cohere"`` sends ``{"model", "query", "documents", "top_n"}``
    (``model`` only when set) and
    reads ``{"results": [{"index", "relevance_score"}]}`` (Cohere, Jina,
    vLLM, LiteLLM, Infinity).

    Every request passes the outbound guard; guard refusals raise
    UnsafeEndpoint (RedirectRefused for a 3xx). ``allow_private`` is for
    local servers. The API key is read from the environment variable named
    by ``api_key_env`` at each call and never stored on the object.
    """

    _error_class = RerankerError
    _key_purpose = "rerank API key"

    name = "http"

    def __init__(
        self,
        *,
        base_url: str,
        model: str | None = None,
        api_key_env: str | None = None,
        flavor: str = "tei",
        timeout: float = 30.0,
        batch_size: int = 32,
        allow_private: bool = False,
        ca_bundle: str | None = None,
        resolver=None,
    ):
        if flavor not in _FLAVORS:
            raise RerankerError(f"flavor must be one of: {', '.join(_FLAVORS)}")
        if model is not None and (not isinstance(model, str) or not model.strip()):
            raise RerankerError("model must be a non-empty string")
        if api_key_env is not None and (not isinstance(api_key_env, str) or not _ENV_NAME.match(api_key_env)):
            raise RerankerError("api_key_env must be the name of an environment variable")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 600:
            raise RerankerError("timeout must be between 0 and 600 seconds")
        if not isinstance(allow_private, bool):
            raise RerankerError("allow_private must be true or false")
        # TEI refuses more than 32 texts per request by default.
        self.batch_size = positive_int(batch_size, "batch_size")
        self._endpoint = outbound.validate_endpoint(base_url, allow_private=allow_private)
        self.flavor = flavor
        self.model = model
        self.model_name = model or f"{flavor}-server-default"
        self._init_http(timeout=timeout, api_key_env=api_key_env, ca_bundle=ca_bundle)
        self._resolver = resolver

    def __repr__(self) -> str:
        return f"HttpReranker(flavor={self.flavor!r}, model_name={self.model_name!r})"

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        texts = check_inputs(query, texts)
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            scores.extend(self._score_batch(query, texts[start : start + self.batch_size]))
        return scores

    def _body(self, query: str, texts: list[str]) -> dict:
        if self.flavor == "tei":
            return {"query": query, "texts": texts}
        body = {"model": self.model} if self.model else {}
        # top_n = all texts: we want every score, not just the best few.
        body.update(query=query, documents=texts, top_n=len(texts))
        return body

    def _score_batch(self, query: str, texts: list[str]) -> list[float]:
        payload = self._post_json("rerank", self._body(query, texts), "rerank")
        return self._parse(payload, len(texts))

    def _parse(self, payload: Any, expected: int) -> list[float]:
        if self.flavor == "tei":
            items, key = payload, "score"
        else:
            items, key = payload.get("results") if isinstance(payload, dict) else None, "relevance_score"
        if not isinstance(items, list):
            raise RerankerError("rerank endpoint reply is malformed")
        scores: list[float | None] = [None] * expected
        for item in items:
            if not isinstance(item, dict):
                raise RerankerError("rerank endpoint reply is malformed")
            index, value = item.get("index"), item.get(key)
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < expected:
                raise RerankerError("rerank endpoint reply has bad indexes")
            if scores[index] is not None:
                raise RerankerError("rerank endpoint reply repeats an index")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise RerankerError("rerank endpoint reply has a missing or non-numeric score")
            scores[index] = float(value)
        if any(s is None for s in scores):
            raise RerankerError("rerank endpoint reply is missing scores for some texts")
        return scores  # type: ignore[return-value]
