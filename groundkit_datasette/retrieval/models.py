"""Request and response models: the one schema shared by the Python API, CLI, JSON API and MCP."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_QUERY_CHARS = 4000
MAX_TOP_K = 50
DEFAULT_TOP_K = 10
MAX_VECTOR_DIMS = 4096
CHUNK_ID_PATTERN = r"^c_[0-9a-f]{24}$"
# Paging: hits ``offset+1 .. offset+top_k`` of one ranking; the window ends by MAX_WINDOW.
MAX_WINDOW = 500
MAX_OFFSET = MAX_WINDOW - MAX_TOP_K
_BUILTIN_MODE_NAMES = frozenset({"bm25", "dense", "hybrid"})  # modes.BUILTIN_MODES
EMPTY_QUERY = "must not be empty"  # after the field's name: "query: must not be empty"
# What pydantic puts before a validator's own ValueError text.
_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def readable_message(error: dict) -> str:
    """A validation error's message as users read it: a validator's own words, without
    pydantic's "Value error, " prefix. Every surface renders messages through this."""
    message = str(error.get("msg", ""))
    for prefix in _PYDANTIC_PREFIXES:
        if message.startswith(prefix):
            return message[len(prefix):]
    return message


def _mode_enum(schema: dict) -> None:
    """The registered search modes (modes.py), read when a schema is generated."""
    from .modes import mode_names

    for option in schema.get("anyOf", [schema]):
        if option.get("type") == "string":
            option["enum"] = mode_names()


class Request(BaseModel):
    """Requests are frozen and refuse unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class SearchRequest(Request):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, description="Free text; no query syntax.")
    mode: str | None = Field(
        default=None, max_length=64, json_schema_extra=_mode_enum,
        description="A registered search mode (bm25, dense, hybrid, or a plugin's); default hybrid "
        "when the collection has vectors this server can search, else bm25.",
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
    offset: int = Field(
        default=0, ge=0, le=MAX_OFFSET,
        description=f"Skip this many hits of the ranking, 0 to {MAX_OFFSET}: the next page starts at "
        "the previous response's next_offset. Pages of one collection generation are cuts of one "
        "ordering (ties broken deterministically).",
    )
    group_by_document: bool = Field(
        default=False,
        description="Also return the page's hits grouped by document (groups), each document in "
        "the order of its best hit.",
    )
    min_score: float | None = Field(
        default=None,
        allow_inf_nan=False,  # checked by pydantic-core: no Python call per request
        description="Drop hits scoring under this floor, in the mode's own terms: the BM25 score "
        "(bm25), the cosine similarity, -1 to 1 (dense); hybrid keeps a hit that matched a query "
        "word by BM25 (a bm25 component) or whose dense cosine is at least min_score. Applied "
        "before reranking and paging.",
    )
    vector: list[Annotated[float, Field(allow_inf_nan=False)]] | None = Field(
        default=None,
        max_length=MAX_VECTOR_DIMS,
        description="A query embedding computed by the caller, of the collection's dimensions.",
    )

    @field_validator("query")
    @classmethod
    def _has_text(cls, v):
        # Spaces alone hold no word: BM25 finds nothing and dense ranks arbitrary chunks.
        if not v.strip():
            raise ValueError(EMPTY_QUERY)
        return v

    @field_validator("mode")
    @classmethod
    def _registered_mode(cls, v):
        # The built-in modes are always registered (first, and no plugin replaces one).
        if v is not None and v not in _BUILTIN_MODE_NAMES:
            from .modes import registered_modes

            modes = registered_modes()
            if v not in modes:
                raise ValueError("mode must be one of: " + ", ".join(modes))
        return v

    @model_validator(mode="after")
    def _vector_needs_dense(self):
        # A vector BM25 would ignore is a caller's mistake, not a hint: say so.
        if self.vector is not None and self.mode is not None:
            from .modes import registered_modes

            if not registered_modes()[self.mode].needs_vectors:
                raise ValueError(f"vector is only used by modes that search vectors, not {self.mode}")
        return self


class FetchChunkRequest(Request):
    chunk_id: str = Field(pattern=CHUNK_ID_PATTERN, description="A chunk id from a search hit.")


class StatusRequest(Request):
    pass


class ListCollectionsRequest(Request):
    pass


class Response(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)


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


# Citation's fields in declaration order (a hit's first twelve, a hit row's first twelve columns).
CITATION_FIELDS = tuple(Citation.model_fields)


class Hit(Citation):
    rank: int
    score: float
    components: dict[str, ComponentScore] = Field(default_factory=dict)
    source_changed: bool | None = Field(
        default=None,
        description="True when the source file's size or mtime differs from ingest's record (the "
                    "hit's text may be stale: fetch_chunk verifies it); null when not recorded.")
    matched_terms: list[str] = Field(
        default_factory=list,
        description="The query's words (lower-cased, each once, in query order) that occur in "
                    "this chunk's indexed text as BM25 matches them (same stem); empty when the "
                    "hit is only semantically near, whatever the mode.")


class DocumentGroup(Response):
    """A page's hits from one document: ``chunk_ids`` in rank order, the first the best."""

    document_id: str
    source: str
    title: str | None
    best_rank: int
    chunk_ids: list[str]


class PlainResponse:
    """A response held as the plain values ``model_dump(mode="json")`` gives (``payload``:
    dicts in the model's field order, every default filled in), the model built only when
    a caller asks for one (``model()``).

    The JSON API writes ``payload`` as it is and MCP hands it over (surfaces/serialize.py);
    the HTML pages and the Python API read models. A search of a built-in mode answers the
    surfaces this way: no pydantic model is built or serialized per hit (adr/0038).
    ``payload`` and the model may share inner values: neither is ever changed in place.
    """

    __slots__ = ("payload", "_model", "_build")

    def __init__(self, payload: dict, *, model=None, build=None):
        self.payload = payload
        self._model = model
        self._build = build

    def model(self):
        if self._model is None:
            self._model = self._build(self.payload)
        return self._model


class SearchResponse(Response):
    collection: str
    mode: str
    generation: int
    top_k: int
    offset: int = 0
    next_offset: int | None = Field(
        default=None, description="The offset of the next page, or None when this is the last one.")
    top_score: float | None = Field(
        default=None, description="The score of the ranking's first hit (also on later pages).")
    groups: list[DocumentGroup] | None = Field(
        default=None, description="With group_by_document: the hits grouped by document.")
    reranked: bool = False
    rerank_model: str | None = None
    rerank_depth: int | None = None
    complete: bool = True
    lexical_match: bool = Field(
        default=True,
        description="False when no chunk this search may return contains any of the query's "
                    "words (after stemming; stop words aside): dense and hybrid hits are then "
                    "only semantically near, and BM25 finds nothing.")
    note: str | None = Field(
        default=None, description="A sentence for the reader when lexical_match is false.")
    timings_ms: dict[str, float] = Field(default_factory=dict)
    hits: list[Hit]


# -- a citation checked against its source (citations.verify_citation) ------------------


class Relocation(BaseModel):
    """Where the cited text sits in the current source."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    start_offset: int
    end_offset: int
    line_start: int
    line_end: int
    occurrences: int


class Verification(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    status: Literal["verified", "drifted", "unresolvable"]
    reason: str
    source_text: str | None = None
    context_before: str | None = None
    context_after: str | None = None
    relocated: Relocation | None = None
    # What the chunk's ``content`` is: always the text as indexed at ingest. This says how it
    # stands against the current source, so an agent never quotes stale text unknowingly.
    indexed_text: Literal["matches_source", "moved_in_source", "not_in_source", "unchecked"] = (
        "unchecked")


class ChunkCitation(Citation):
    chunk_index: int
    content_hash: str


class ChunkResponse(Response):
    collection: str
    generation: int
    chunk: ChunkCitation
    verification: Verification


class EmbeddingManifest(Response):
    provider: str
    model: str
    dimensions: int


class IngestFile(Response):
    source: str
    reason: str


class LastIngest(Response):
    """What the run that published this generation left out. ``files`` is None when the
    collection has (or ever had) access lists: then only the counts are shown."""

    ingested_at: str | None = None
    skipped: int = 0
    failed: int = 0
    skipped_files: list[IngestFile] | None = None
    failed_files: list[IngestFile] | None = None


class IndexStatus(Response):
    collection: str
    generation: int
    schema_version: int
    documents: int
    chunks: int
    embedding: EmbeddingManifest | None
    dense_available: bool
    dense_unavailable_reason: str | None = None
    # The search modes this server can run on the collection (registered modes, modes.py).
    modes: list[str] = Field(default_factory=list)
    ann_index: str | None = None
    chunker: dict | None = None
    bm25_terms: int
    vectors: int | None = Field(
        default=None,
        description="Chunks with a vector in this version; equals chunks when dense search covers "
                    "them all. None for a collection built without embeddings.",
    )
    last_ingest: LastIngest | None = Field(
        default=None, description="When this generation was ingested, and the files that run "
        "skipped or failed with their reasons. None for collections written before it was kept.")


class CollectionsResponse(Response):
    collections: list[str]


# -- one document, read whole (fetch_document) ---------------------------------------

DOCUMENT_ID_PATTERN = r"^d_[0-9a-f]{20}$"


class FetchDocumentRequest(Request):
    document_id: str = Field(pattern=DOCUMENT_ID_PATTERN,
                             description="A document_id from a search hit or fetched chunk.")


class DocumentHeading(Response):
    """One entry of a document's table of contents: a heading path and the chunk it starts."""

    heading: str
    depth: int
    chunk_id: str


class DocumentChunk(Response):
    chunk_id: str
    chunk_index: int
    start_offset: int
    end_offset: int
    line_start: int
    line_end: int
    page_start: int | None = None
    page_end: int | None = None
    heading: str
    content: str
    shown_from: int = Field(
        default=0, description="Characters at the start of content the previous chunk already "
        "covers (chunk overlap): content[shown_from:] continues the document's text.")


class DocumentVerification(Response):
    status: Literal["unchanged", "changed", "missing", "unresolvable"]
    reason: str


class DocumentResponse(Response):
    collection: str
    generation: int
    document_id: str
    source: str
    title: str | None
    char_count: int
    line_count: int
    page_count: int | None = None
    ingested_at: str
    verification: DocumentVerification
    headings: list[DocumentHeading]
    chunks: list[DocumentChunk]
