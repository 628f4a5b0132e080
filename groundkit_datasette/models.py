"""Request and response models: the one schema shared by the Python API, CLI, JSON API and MCP."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_QUERY_CHARS = 4000
MAX_TOP_K = 50
DEFAULT_TOP_K = 10
MAX_VECTOR_DIMS = 4096
CHUNK_ID_PATTERN = r"^c_[0-9a-f]{24}$"

Mode = Literal["bm25", "dense", "hybrid"]


class Request(BaseModel):
    """Requests are frozen and refuse unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class SearchRequest(Request):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, description="Free text; no query syntax.")
    mode: Mode | None = Field(
        default=None, description="bm25, dense or hybrid; default hybrid when the collection has vectors."
    )
    top_k: int = Field(
        default=DEFAULT_TOP_K, ge=1, le=MAX_TOP_K,
        description=f"How many hits to return, 1 to {MAX_TOP_K} (default {DEFAULT_TOP_K}).",
    )
    rerank: bool = Field(default=False, description="Rerank candidates with the configured reranker.")
    source: str | None = Field(
        default=None,
        max_length=1000,
        description="Only sources starting with this prefix, or matching it as a glob if it has * ? or [.",
    )
    document_id: str | None = Field(
        default=None, max_length=100,
        description="Only chunks of this document: a document_id from a search hit or fetched chunk.",
    )
    vector: list[float] | None = Field(
        default=None,
        max_length=MAX_VECTOR_DIMS,
        description="A query embedding computed by the caller, of the collection's dimensions.",
    )

    @field_validator("vector")
    @classmethod
    def _finite(cls, v):
        if v is not None and not all(math.isfinite(x) for x in v):
            raise ValueError("vector values must be finite numbers")
        return v

    @model_validator(mode="after")
    def _vector_needs_dense(self):
        # A vector BM25 would ignore is a caller's mistake, not a hint: say so.
        if self.vector is not None and self.mode == "bm25":
            raise ValueError("vector is only used by mode dense or hybrid, not bm25")
        return self


class FetchChunkRequest(Request):
    chunk_id: str = Field(pattern=CHUNK_ID_PATTERN, description="A chunk id from a search hit.")


class StatusRequest(Request):
    pass


class ListCollectionsRequest(Request):
    pass


class Response(BaseModel):
    model_config = ConfigDict(frozen=True)


class ComponentScore(Response):
    rank: int | None = None
    score: float


class Citation(Response):
    """Where a chunk's text lies in its source: shared by search hits and fetched chunks."""

    chunk_id: str
    document_id: str
    source: str
    title: str | None
    start_offset: int
    end_offset: int
    line_start: int
    line_end: int
    page_start: int | None = None
    page_end: int | None = None
    heading: str
    content: str


class Hit(Citation):
    rank: int
    score: float
    components: dict[str, ComponentScore] = Field(default_factory=dict)


class SearchResponse(Response):
    collection: str
    mode: Mode
    generation: int
    top_k: int
    reranked: bool = False
    rerank_model: str | None = None
    rerank_depth: int | None = None
    complete: bool = True
    timings_ms: dict[str, float] = Field(default_factory=dict)
    hits: list[Hit]


class ChunkCitation(Citation):
    chunk_index: int
    content_hash: str


class ChunkResponse(Response):
    collection: str
    generation: int
    chunk: ChunkCitation
    verification: "VerificationModel"


class EmbeddingManifest(Response):
    provider: str
    model: str
    dimensions: int


class IndexStatus(Response):
    collection: str
    generation: int
    schema_version: int
    documents: int
    chunks: int
    embedding: EmbeddingManifest | None
    dense_available: bool
    dense_unavailable_reason: str | None = None
    ann_index: str | None = None
    chunker: dict | None = None
    bm25_terms: int
    vectors: int | None = Field(
        default=None,
        description="Chunks with a vector in this version; equals chunks when dense search covers "
                    "them all. None for a collection built without embeddings.",
    )


class CollectionsResponse(Response):
    collections: list[str]


from .citations import Verification as VerificationModel  # noqa: E402

ChunkResponse.model_rebuild()
