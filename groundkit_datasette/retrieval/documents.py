"""One document read whole: its chunks in order, its headings, and whether its source changed.

Read-only, like every operation: the source file is read (bounded, under the base
directory, by the same rules as a citation's check) only to compare its hash.
"""

from __future__ import annotations

import hashlib

from ..errors import DocumentNotFound
from .citations import SOURCE_NOT_FOUND, Unresolvable, read_bounded, resolve_source
from .rows import DocumentChunkRow
from .models import (
    DocumentChunk,
    DocumentHeading,
    DocumentResponse,
    DocumentVerification,
    FetchDocumentRequest,
)

HEADING_SEPARATOR = " > "


def fetch_document(collection, document_id: str, hidden_documents=()) -> DocumentResponse:
    """The document ``document_id``; a document in ``hidden_documents`` is not found, like a
    missing one (the same words, so an answer never tells the two apart)."""
    FetchDocumentRequest(document_id=document_id)
    if document_id in set(hidden_documents):
        raise DocumentNotFound("document not found")
    rows = collection.query(
        """SELECT source, title, char_count, line_count, page_count, ingested_at, file_hash
           FROM documents WHERE document_id = ?""", (document_id,))
    if not rows:
        raise DocumentNotFound("document not found")
    source, title, char_count, line_count, page_count, ingested_at, file_hash = rows[0]
    chunks, headings, covered, last_heading = [], [], 0, None
    for r in collection.query(
        """SELECT chunk_id, chunk_index, start_offset, end_offset, line_start, line_end,
                  page_start, page_end, heading, content
           FROM chunks WHERE document_id = ? ORDER BY chunk_index""", (document_id,),
            row=DocumentChunkRow):
        start, end = r.start_offset, r.end_offset
        chunks.append(DocumentChunk(
            **r._asdict(), shown_from=min(len(r.content), max(0, covered - start))))
        covered = max(covered, end)
        if r.heading and r.heading != last_heading:
            headings.append(DocumentHeading(heading=r.heading,
                                            depth=r.heading.count(HEADING_SEPARATOR),
                                            chunk_id=r.chunk_id))
        last_heading = r.heading
    return DocumentResponse(
        collection=collection.name, generation=collection.generation, document_id=document_id,
        source=source, title=title, char_count=char_count, line_count=line_count,
        page_count=page_count, ingested_at=ingested_at,
        verification=source_state(collection.base_dir, source, file_hash),
        headings=headings, chunks=chunks,
    )


def source_state(base_dir, source: str, file_hash: str) -> DocumentVerification:
    """Whether the file the document was ingested from is still byte for byte the same."""
    if base_dir is None:
        return DocumentVerification(status="unresolvable", reason="no base directory configured")
    try:
        real_base, path = resolve_source(base_dir, source)
        data = read_bounded(path, real_base)
    except Unresolvable as exc:
        if exc.reason == SOURCE_NOT_FOUND:
            return DocumentVerification(status="missing", reason=exc.reason)
        return DocumentVerification(status="unresolvable", reason=exc.reason)
    if hashlib.sha256(data).hexdigest() == file_hash:
        return DocumentVerification(status="unchanged", reason="the source file is as ingested")
    return DocumentVerification(status="changed",
                                reason="the source file changed since it was ingested")
