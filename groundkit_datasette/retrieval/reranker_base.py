"""What every reranker is and the checks they share: a module of its own so that the built-in
cross-encoder's module and the HTTP client both import it and neither imports the other."""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from ..errors import RerankerError


@runtime_checkable
class Reranker(Protocol):
    """What every reranker provides."""

    name: str  # the name it is registered under
    model_name: str

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """One score per text, in the order given; higher is more relevant."""
        ...


def check_inputs(query: str, texts: Sequence[str]) -> list[str]:
    """``texts`` as a list, or RerankerError unless the query is a string and texts strings."""
    if not isinstance(query, str):
        raise RerankerError("the rerank query must be a string")
    # A bare string is a Sequence[str] too, and would score one character per row.
    if isinstance(texts, (str, bytes)):
        raise RerankerError("score() takes a list of strings, not a single string")
    texts = list(texts)
    if not all(isinstance(t, str) for t in texts):
        raise RerankerError("score() takes a list of strings")
    return texts


def positive_int(value: Any, option: str, *, maximum: int | None = None) -> int:
    """``value`` if it is an integer from 1 (to ``maximum``), else RerankerError naming ``option``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (maximum and value > maximum):
        limit = f" up to {maximum}" if maximum else ""
        raise RerankerError(f"{option} must be a positive integer{limit}")
    return value
