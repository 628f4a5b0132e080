"""What every embedder is and the checks they share: a module of its own so that the built-in
embedders and the OpenAI-compatible client both import it and neither imports the other."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import EmbedderError


class Embedder:
    """What every embedder provides; rows of ``embed`` are L2-normalised float32."""

    provider: str
    model_name: str
    dimensions: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text])[0]


def check_texts(texts: Sequence[str]) -> list[str]:
    """``texts`` as a list, or EmbedderError for anything but a sequence of strings."""
    # A bare string is a Sequence[str] too, and would embed one character per row.
    if isinstance(texts, (str, bytes)):
        raise EmbedderError("embed() takes a list of strings, not a single string")
    texts = list(texts)
    for text in texts:
        if not isinstance(text, str):
            raise EmbedderError("embed() takes a list of strings")
    return texts


def l2_normalise(matrix: np.ndarray) -> np.ndarray:
    """Each row scaled to length 1, as float32."""
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    # A zero row stays zero instead of becoming NaN.
    return (matrix / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)
