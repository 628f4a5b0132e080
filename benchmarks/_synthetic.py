"""Synthetic corpora and a synthetic embedder for size-dependent benchmarks.

The embedder is registered through the same ``register_embedders`` hook a
user's plugin would use, so the collections it builds are ordinary ones.
Its vectors are clustered (256 centres plus noise) rather than uniform,
because real embeddings are clustered and uniform data is the worst case
for any ANN index.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import shutil
import time
from pathlib import Path

import numpy as np

from groundkit_datasette.embedding.embedders import Embedder
from groundkit_datasette.hookspecs import hookimpl

DIMENSIONS = 384
SECTIONS_PER_FILE = 100
_CENTRES = np.random.default_rng(1234).standard_normal((256, DIMENSIONS)).astype(np.float32)


class SyntheticEmbedder(Embedder):
    provider = "synthetic"
    model_name = "clustered-random-384"
    dimensions = DIMENSIONS

    def __init__(self, **_options):
        pass

    def embed(self, texts):
        out = np.empty((len(texts), DIMENSIONS), dtype=np.float32)
        for i, text in enumerate(texts):
            seed = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
            rng = np.random.default_rng(seed)
            out[i] = _CENTRES[rng.integers(256)] + rng.standard_normal(DIMENSIONS, dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


class _Plugin:
    @staticmethod
    @hookimpl
    def register_embedders(register):
        register("synthetic", SyntheticEmbedder)


def register() -> None:
    from groundkit_datasette.registry import pm

    if pm.get_plugin("benchmarks-synthetic") is None:
        pm.register(_Plugin, "benchmarks-synthetic")


def query_vectors(n: int, seed: int = 7) -> np.ndarray:
    """Queries near the data: a centre plus noise, like a question near its topic."""
    rng = np.random.default_rng(seed)
    v = _CENTRES[rng.integers(256, size=n)] + rng.standard_normal((n, DIMENSIONS), dtype=np.float32)
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def _vocabulary(size: int, rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(3, 10))))
    return sorted(words)


def write_corpus(directory: Path, chunks: int, seed: int = 42) -> int:
    """Markdown files of ``SECTIONS_PER_FILE`` sections of ~100 Zipf-distributed words: one chunk each."""
    rng = random.Random(seed)
    vocab = _vocabulary(20000, rng)
    weights = [1.0 / (r + 1) for r in range(len(vocab))]
    # What choices(vocab, weights) computes on every call, once: the same draws, much faster.
    cum_weights = list(itertools.accumulate(weights))
    directory.mkdir(parents=True, exist_ok=True)
    n = 0
    file_no = 0
    while n < chunks:
        parts = []
        for _ in range(min(SECTIONS_PER_FILE, chunks - n)):
            words = rng.choices(vocab, cum_weights=cum_weights, k=100)
            parts.append(f"# Section {n}\n\n" + " ".join(words) + ".\n")
            n += 1
        (directory / f"doc{file_no:06d}.md").write_text("\n".join(parts), encoding="utf-8")
        file_no += 1
    return n


def build_collection(work: Path, chunks: int, *, embedder: str = "synthetic", name: str | None = None,
                     rebuild: bool = False):
    """A real collection of ``chunks`` synthetic chunks (reused when already built)."""
    from groundkit_datasette.indexing.ingest import Indexer

    register()
    name = name or f"syn{chunks}-{embedder}"
    sources = work / f"syn-sources-{chunks}"
    index = work / "index"
    if rebuild:
        shutil.rmtree(sources, ignore_errors=True)
        for p in index.glob(f"{name}.*"):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    if not (sources / ".complete").exists():
        shutil.rmtree(sources, ignore_errors=True)
        write_corpus(sources, chunks)
        (sources / ".complete").write_text("ok")
    t = time.perf_counter()
    report = Indexer(name, index_dir=index, base_dir=sources, embedder=embedder).ingest([sources])
    return index, name, report, time.perf_counter() - t
