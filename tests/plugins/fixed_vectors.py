"""Test plugins: deterministic embedders (no model needed) and a reranker that waits for a signal.

Real groundkit plugins registered through the hooks, so ingest, the registry and the
search path run unchanged.
"""

import hashlib
import threading

import numpy as np

from groundkit_datasette.hookspecs import hookimpl

DIMS = 8


class HashEmbedder:
    """Vectors from a hash of each word: similar texts share words, hence directions."""

    provider = "test"
    dimensions = DIMS

    def __init__(self, model_name):
        self.model_name = model_name

    def embed(self, texts):
        out = np.zeros((len(texts), DIMS), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                out[row, hashlib.sha256(word.encode()).digest()[0] % DIMS] += 1.0
            out[row] /= max(float(np.linalg.norm(out[row])), 1e-9)
        return out

    def embed_query(self, text):
        return self.embed([text])[0]


class Embedders:
    """``vec-a`` and ``vec-b``: the same width, different models (an embedder mismatch)."""

    @staticmethod
    @hookimpl
    def register_embedders(register):
        register("vec-a", lambda: HashEmbedder("hash-a"))
        register("vec-b", lambda: HashEmbedder("hash-b"))


class Gate:
    """A reranker that holds each call until ``release`` is set: a search kept in flight."""

    model_name = "gate"

    def __init__(self):
        self.entered = threading.Event()
        self.release = threading.Event()

    def score(self, query, texts):
        self.entered.set()
        self.release.wait(60)
        return [0.0] * len(texts)


GATE = Gate()


class GateReranker:
    @staticmethod
    @hookimpl
    def register_rerankers(register):
        register("gate", lambda: GATE)
