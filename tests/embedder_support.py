"""A real embedder plugin with deterministic clustered vectors: many vectors, no model needed."""

import hashlib

import numpy as np

from groundkit_datasette.hookspecs import hookimpl


class ClusteredEmbedder:
    """Each text's vector is one of ``centres`` plus ``noise`` times Gaussian noise, both
    chosen by the text's hash, so equal texts embed equally across processes."""

    provider = "test"

    def __init__(self, model_name: str, centres: np.ndarray, noise: float):
        self.model_name, self.centres, self.noise = model_name, centres, noise
        self.dimensions = centres.shape[1]

    def embed(self, texts):
        out = []
        for t in texts:
            seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little")
            noise = np.random.default_rng(seed).normal(size=self.dimensions)
            v = self.centres[seed % len(self.centres)] + self.noise * noise
            out.append(v / np.linalg.norm(v))
        return np.asarray(out, dtype=np.float32).reshape(len(texts), self.dimensions)

    def embed_query(self, text):
        return self.embed([text])[0]


def embedder_plugin(key: str, embedder: ClusteredEmbedder):
    """A plugin object registering ``embedder`` under ``key`` (register it on gk_registry.pm)."""

    class Plugin:
        @staticmethod
        @hookimpl
        def register_embedders(register):
            register(key, lambda **o: embedder)

    return Plugin
