"""A file on its way to the collection: the job the scanner reads (indexing/scanner.py), and the
document the map stage makes of it (here, in forked children, or on a cluster: indexing/cluster.py)
for the document writer (indexing/document_writer.py) to store. Ids and hashes are derived here,
in one place, whoever did the extraction.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import NamedTuple

from .chunking import chunk_text
from .extract import Skipped, extract_bytes, page_for_offset

log = logging.getLogger(__name__)


class DocumentColumns(NamedTuple):
    """The documents row's columns that come of extraction."""
    source_class: str
    extractor: str
    extractor_version: str
    title: str | None
    content_hash: str
    char_count: int
    line_count: int
    page_count: int | None
    encoding: str | None


@dataclass
class Prepared:
    source: str
    document_id: str
    file_hash: str
    # Computed where the text is, so the writer never needs the text itself.
    document: DocumentColumns
    chunks: list
    chunk_ids: list[str]
    # Per chunk: (page_start, page_end, content_hash).
    chunk_details: list[tuple]
    is_new: bool
    acl: str | None = None
    # The file's size and mtime when read: a hit whose file differs now says source_changed.
    size: int | None = None
    mtime_ns: int | None = None
    # Vectors of the chunks the collection lacks, when the map stage embedded them (a cluster).
    vectors: dict | None = None


@dataclass
class Job:
    """One file in walk order, read and compared with the collection before any work is done."""
    source: str
    data: bytes | None  # None once sent to a cluster, or when no work is needed
    file_hash: str | None = None
    acl: str | None = None
    prior: tuple | None = None
    size: int | None = None
    mtime_ns: int | None = None
    work: bool = False  # extraction, chunking and embedding needed
    unreadable: bool = False
    refused: str | None = None  # why an unreadable file was not read (safe_read's reason)


@dataclass
class Outcome:
    """A file the map stage did not turn into a document: skipped, or failed (a safe reason)."""
    skipped: bool
    reason: str


def source_suffix(source: str) -> str:
    """``PurePosixPath(source).suffix`` without building a path per document."""
    name = source.rpartition("/")[2]
    i = name.rfind(".")
    return name[i:] if 0 < i < len(name) - 1 else ""


def sha(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def document_id_for(source: str) -> str:
    return "d_" + sha(source)[:20]


def chunk_ids_for(document_id: str, chunks) -> list[str]:
    """Content-derived ids: an unchanged chunk keeps its id (and vector) across edits elsewhere."""
    seen: dict[str, int] = {}
    ids = []
    for ch in chunks:
        key = f"{document_id}\0{ch.heading}\0{ch.text}"
        n = seen.get(key, 0)
        seen[key] = n + 1
        ids.append("c_" + sha(f"{key}\0{n}")[:24])
    return ids


def embedding_text(heading: str, text: str) -> str:
    return f"{heading}\n\n{text}" if heading else text


def prepare_document(job: Job, chunk_size: int, chunk_overlap: int,
                     title_header: bool = True) -> Prepared | Outcome:
    try:
        extracted = extract_bytes(job.data, source_suffix(job.source))
    except Skipped as skip:
        return Outcome(True, skip.reason)
    except Exception as exc:
        log.error("extraction failed for %s: %s", job.source, type(exc).__name__)
        return Outcome(False, "extraction failed")
    chunks = chunk_text(
        extracted.text,
        source_class=extracted.source_class,
        chunk_size=chunk_size,
        chunk_overlap=chunk_overlap,
        title=extracted.title if title_header else None,
    )
    return prepared_from(job, extracted.text, extracted.title, extracted.page_starts, chunks,
                         (extracted.source_class, extracted.extractor, extracted.extractor_version,
                          extracted.encoding))


def prepared_from(job: Job, text: str, title, pages: tuple, chunks, identity,
                  vectors: dict | None = None) -> Prepared:
    """A document's columns and chunk rows from its extracted text: the one place they are
    derived, for a local run and for a cluster worker's checked answer alike.
    ``identity``: (source_class, extractor, extractor_version, encoding)."""
    source_class, extractor, version, encoding = identity
    document_id = document_id_for(job.source)
    return Prepared(
        source=job.source,
        document_id=document_id,
        file_hash=job.file_hash,
        document=DocumentColumns(source_class, extractor, version, title, sha(text), len(text),
                                 text.count("\n") + 1, len(pages) or None, encoding),
        chunks=chunks,
        chunk_ids=chunk_ids_for(document_id, chunks),
        chunk_details=[(page_for_offset(pages, ch.start), page_for_offset(pages, max(ch.end - 1, ch.start)),
                        sha(ch.text)) for ch in chunks],
        is_new=job.prior is None,
        acl=job.acl,
        size=job.size,
        mtime_ns=job.mtime_ns,
        vectors=vectors,
    )


def local_map(jobs, indexer, vectors):
    """The map stage in this process: each job's document, lazily and in order."""
    for job in jobs:
        yield job, (indexer.prepare(job) if job.work else None)
