"""The reader's typed rows: what :class:`~.collection.Collection` returns for a hit and for a
fetched chunk, read by name (a column added to a query cannot shift another's meaning)."""

from __future__ import annotations

from typing import NamedTuple


class HitRow(NamedTuple):
    """A hit's columns as :meth:`Collection.hit_rows` reads them: the citation's fields in
    ``Citation``'s order (search.py checks it), ingest's record of the source file, the row id."""

    chunk_id: str
    document_id: str
    source: str
    title: str | None
    start_offset: int
    end_offset: int
    line_start: int
    line_end: int
    page_start: int | None
    page_end: int | None
    heading: str
    content: str
    source_size: int | None  # None: not recorded (a file written before the columns)
    source_mtime_ns: int | None
    row_id: int  # chunks.id, the postings' chunk row id


CITATION_COLUMNS = HitRow._fields[:12]

HIT_SQL = """SELECT c.chunk_id, c.document_id, d.source, d.title, c.start_offset, c.end_offset,
                     c.line_start, c.line_end, c.page_start, c.page_end, c.heading, c.content,
                     {stat}, c.id
              FROM chunks c JOIN documents d USING (document_id) WHERE c.{key} IN ({marks})"""


class ChunkRow(NamedTuple):
    """A fetched chunk's columns (:meth:`Collection.fetch_chunk`)."""

    chunk_id: str
    document_id: str
    chunk_index: int
    source: str
    title: str | None
    start_offset: int
    end_offset: int
    line_start: int
    line_end: int
    page_start: int | None
    page_end: int | None
    heading: str
    content: str
    content_hash: str
    source_class: str
    extractor: str
    extractor_version: str
    encoding: str | None


class DocumentChunkRow(NamedTuple):
    """One chunk of a fetched document (``documents.fetch_document``)."""

    chunk_id: str
    chunk_index: int
    start_offset: int
    end_offset: int
    line_start: int
    line_end: int
    page_start: int | None
    page_end: int | None
    heading: str
    content: str


class SourceRow(NamedTuple):
    """A document as a quote is verified in it (``quotes.py``): where its source is and how it
    was extracted."""

    document_id: str
    source: str
    title: str | None
    source_class: str
    extractor: str
    extractor_version: str
    encoding: str | None


class ChunkSpan(NamedTuple):
    """Where a chunk lies in its document's text."""

    document_id: str
    start_offset: int
    end_offset: int
