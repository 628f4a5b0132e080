"""Preloaded into the test cluster's workers (``dask worker --preload``: ``dask_setup``) and
registered by tests/test_cluster.py for its own tests: the ``worker-killer`` embedder kills the
process that embeds a text containing POISON, as a segfaulting model would. Deterministic
vectors otherwise (no model needed)."""

import os

from groundkit_datasette.hookspecs import hookimpl

from fixed_vectors import HashEmbedder  # noqa: E402  (tests/plugins is on the path)

MARK = "POISON"
NAME = "worker-killer"
PLUGIN = "cluster-worker-killer"


class PoisonEmbedder(HashEmbedder):
    def __init__(self):
        super().__init__("hash-poison")

    def embed(self, texts):
        if any(MARK in t for t in texts):
            os._exit(13)
        return super().embed(texts)


class Plugin:
    @staticmethod
    @hookimpl
    def register_embedders(register):
        register(NAME, lambda **o: PoisonEmbedder())


def register():
    from groundkit_datasette.registry import pm

    if pm.get_plugin(PLUGIN) is None:
        pm.register(Plugin, name=PLUGIN)


def unregister():
    from groundkit_datasette.registry import pm

    if pm.get_plugin(PLUGIN) is not None:
        pm.unregister(name=PLUGIN)


def dask_setup(worker):
    """Dask calls this in each worker process that preloads the module."""
    register()
