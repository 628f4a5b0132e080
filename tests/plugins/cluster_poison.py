"""Preloaded into the test cluster's workers (``dask worker --preload``) and registered in the
test process: the ``poison`` embedder kills the process that embeds a text containing POISON,
as a segfaulting model would. Deterministic vectors otherwise (no model needed)."""

import os

from groundkit_datasette.hookspecs import hookimpl

from fixed_vectors import HashEmbedder  # noqa: E402  (tests/plugins is on the path)

MARK = "POISON"


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
        register("poison", lambda **o: PoisonEmbedder())


def register():
    from groundkit_datasette.plugins import pm

    if pm.get_plugin("cluster-poison") is None:
        pm.register(Plugin, name="cluster-poison")


register()
