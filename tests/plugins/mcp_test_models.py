"""Test embedders registered through groundkit's hook (tests/test_mcp_errors.py).

``test-hash`` gives deterministic vectors from a text's SHA-256: dense search
with no model to download. Its ``model`` option names the model, so a
collection built with ``model="hash-v2"`` does not match the server's default
``hash-v1``. ``test-query-fails`` embeds documents (an ingest succeeds) and
fails every query the way a model service that went down would. The
``explode`` tool (``Exploding``) has a bug.
"""

import hashlib

import numpy as np
from pydantic import BaseModel, ConfigDict

from groundkit_datasette.errors import EmbedderError
from groundkit_datasette.hookspecs import hookimpl
from groundkit_datasette.surfaces.tools import Tool

DIMS = 8
# Appears in no answer: the 502's text is fixed (the service's words go to the log only).
UPSTREAM_WORDS = "SENTINEL upstream said: quota exhausted for key sk-test-123"


class HashEmbedder:
    provider = "test"
    dimensions = DIMS

    def __init__(self, model="hash-v1"):
        self.model_name = model

    def embed(self, texts):
        rows = []
        for text in texts:
            digest = hashlib.sha256(text.encode("utf-8")).digest()
            v = np.frombuffer(digest[: DIMS * 4], dtype=np.uint32).astype(np.float32) + 1.0
            rows.append(v / np.linalg.norm(v))
        return np.array(rows, dtype=np.float32).reshape(len(rows), DIMS)

    def embed_query(self, text):
        return self.embed([text])[0]


class QueryFailsEmbedder(HashEmbedder):
    def embed_query(self, text):
        raise EmbedderError(UPSTREAM_WORDS)


@hookimpl
def register_embedders(register):
    register("test-hash", HashEmbedder)
    register("test-query-fails", lambda: QueryFailsEmbedder())


class _Empty(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Done(BaseModel):
    done: bool


async def _explode(ctx, collection, request):
    raise RuntimeError(UPSTREAM_WORDS)  # a bug: its words must reach the log only


class Exploding:
    """A tool whose handler has a bug, for the 500 row of the error table."""

    TOOL = Tool(name="explode", summary="Always fails.", request_model=_Empty, response_model=_Done,
                handler=_explode, scope="instance", json_route="/-/groundkit/explode.json")

    @hookimpl
    def register_tools(self, register):
        register(self.TOOL)


def register_all(pm) -> None:
    """Register this module's embedders and the exploding tool with groundkit's plugin manager."""
    import sys

    pm.register(sys.modules[__name__], name="mcp-test-models")
    pm.register(Exploding(), name="mcp-test-explode")


def unregister_all(pm) -> None:
    pm.unregister(name="mcp-test-models")
    pm.unregister(name="mcp-test-explode")
