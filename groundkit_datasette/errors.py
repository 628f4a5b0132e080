"""Every error a caller can cause, in one hierarchy.

Messages name the problem and never echo paths, URLs or secrets: the
service surfaces pass ``str(error)`` of allow-listed types to callers.
"""

from dataclasses import dataclass


class GroundkitError(Exception):
    """Base class; its message is safe to show to a caller."""

    kind = "internal_error"


class InvalidRequest(GroundkitError):
    kind = "invalid_request"


class InvalidCollectionName(InvalidRequest):
    kind = "invalid_collection_name"


class CollectionNotFound(GroundkitError):
    kind = "collection_not_found"


class ChunkNotFound(GroundkitError):
    kind = "chunk_not_found"


class DocumentNotFound(GroundkitError):
    kind = "document_not_found"


class NotACollection(GroundkitError):
    kind = "not_a_collection"


class SchemaMismatch(GroundkitError):
    kind = "schema_mismatch"


class IndexInconsistent(GroundkitError):
    """The collection's parts disagree (vectors vs SQLite, stale index)."""

    kind = "index_inconsistent"


class DenseUnavailable(GroundkitError):
    """Dense search asked of a collection or server that cannot do it."""

    kind = "dense_unavailable"


class EmbedderMismatch(DenseUnavailable):
    kind = "embedder_mismatch"


class RerankNotConfigured(GroundkitError):
    kind = "rerank_not_configured"


class EmbedderError(GroundkitError):
    """The embedder failed (model missing, endpoint refused, bad reply)."""

    kind = "embedder_error"


class RerankerError(GroundkitError):
    kind = "reranker_error"


class UnsafeEndpoint(GroundkitError):
    """An outbound URL failed validation; the message never repeats it."""

    kind = "unsafe_endpoint"


class RedirectRefused(UnsafeEndpoint):
    """An outbound endpoint replied 3xx; redirects are never followed."""


class CollectionBusy(GroundkitError):
    """Another ingest holds the collection's write lock."""

    kind = "collection_busy"


class IngestError(GroundkitError):
    kind = "ingest_error"


class TooManyDocuments(GroundkitError):
    """A call would re-read more documents than its bound allows (verify_quote)."""

    kind = "too_many_documents"


class NoPageImage(GroundkitError):
    """The chunk has no page image: not from a PDF, or the page is not part of its citation."""

    kind = "no_page_image"


class SourceChanged(GroundkitError):
    """The source is not the file ingest read (changed, missing, unreadable): nothing is drawn
    on it, since the cited offsets may point at other text now."""

    kind = "source_changed"


class PageImageTooLarge(GroundkitError):
    """Past a page image bound: the source file's size, its page count, or the page's pixels."""

    kind = "page_image_too_large"


class RenderTimeout(GroundkitError):
    """The page image was not ready within the render time bound."""

    kind = "render_timeout"


@dataclass(frozen=True)
class ErrorInfo:
    """One error as every surface answers it: status, kind and a text that echoes nothing."""

    status: int
    kind: str
    detail: str

    def body(self, request_id: str) -> dict:
        return {"ok": False, "error": self.kind, "detail": self.detail, "request_id": request_id}
