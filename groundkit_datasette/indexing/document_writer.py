"""The document writer: a run's documents, chunks, term rows and manifest, written to the private
copy inside the run's one transaction, one savepoint per batch (a failed batch is retried one
document at a time, so a bad document costs only itself)."""

from __future__ import annotations

import datetime
import json
import logging

from .postings import settings as bm25_settings
from .prepared import Job, Prepared, embedding_text
from .report import IngestReport, ingest_summary
from .schema import index_new_chunks
from .terms import TermTable
from .tokenizer import TOKENIZER, cjk_terms, has_cjk

log = logging.getLogger(__name__)


class _Savepoint:
    """All or nothing for the statements inside (nested in the run's transaction)."""

    def __init__(self, conn):
        self.conn = conn

    def __enter__(self):
        self.conn.execute("SAVEPOINT write")

    def __exit__(self, exc_type, *exc):
        if exc_type is not None:
            self.conn.execute("ROLLBACK TO write")
        self.conn.execute("RELEASE write")
        return False


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class DocumentWriter:
    """Writes one run's documents into ``conn`` at ``generation``."""

    def __init__(self, conn, generation: int, progress):
        self.conn, self.generation, self.progress = conn, generation, progress
        self.terms = TermTable(conn)
        # Row ids are assigned here (not by SQLite), so the term rows can name them; the rows
        # from ``first_new_row`` on are this run's (their postings are added at the end).
        self.next_row_id = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM chunks").fetchone()[0]
        self.first_new_row = self.next_row_id

    def write(self, batch: list[Prepared], report: IngestReport) -> list[Prepared]:
        """Write a batch of documents; return those written.

        The batch goes in under one savepoint. If that fails, each document is
        retried under its own, so a bad document costs only itself and keeps its
        previous rows.
        """
        try:
            with _Savepoint(self.conn):
                self._insert(batch)
            written = batch
        except Exception:
            written = []
            for p in batch:
                try:
                    with _Savepoint(self.conn):
                        self._insert([p])
                    written.append(p)
                except Exception as exc:
                    report.fail(p.source, "write failed")
                    log.error("writing %s failed, its previous state is kept: %s",
                              p.source, type(exc).__name__)
        for p in written:
            if p.is_new:
                report.added += 1
            else:
                report.updated += 1
            report.chunks_written += len(p.chunks)
            self.progress({"event": "document", "source": p.source, "chunks": len(p.chunks)})
        return written

    def _insert(self, batch: list[Prepared]) -> None:
        conn = self.conn
        now = _now()
        conn.executemany(
            "DELETE FROM chunks WHERE document_id = ?",
            [(p.document_id,) for p in batch if not p.is_new],
        )
        conn.executemany(
            """INSERT INTO documents(document_id, source, source_class, extractor,
                   extractor_version, title, content_hash, file_hash, char_count, line_count,
                   page_count, chunk_count, acl, generation, ingested_at, encoding,
                   source_size, source_mtime_ns)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT(document_id) DO UPDATE SET
                   source_class=excluded.source_class, extractor=excluded.extractor,
                   extractor_version=excluded.extractor_version, title=excluded.title,
                   content_hash=excluded.content_hash, file_hash=excluded.file_hash,
                   char_count=excluded.char_count, line_count=excluded.line_count,
                   page_count=excluded.page_count, chunk_count=excluded.chunk_count,
                   acl=excluded.acl, generation=excluded.generation,
                   ingested_at=excluded.ingested_at, encoding=excluded.encoding,
                   source_size=excluded.source_size, source_mtime_ns=excluded.source_mtime_ns""",
            [
                (
                    p.document_id, p.source, d.source_class, d.extractor, d.extractor_version,
                    d.title, d.content_hash, p.file_hash, d.char_count, d.line_count,
                    d.page_count, len(p.chunks), p.acl, self.generation, now, d.encoding, p.size,
                    p.mtime_ns,
                )
                for p in batch for d in (p.document,)
            ],
        )
        rows = []
        next_id = self.next_row_id
        for p in batch:
            for ch, cid, (page_start, page_end, content_hash) in zip(p.chunks, p.chunk_ids, p.chunk_details):
                rows.append((
                    next_id, cid, p.document_id, ch.index, ch.start, ch.end, ch.line_start,
                    ch.line_end, page_start, page_end, ch.heading, ch.text, content_hash,
                ))
                next_id += 1
        conn.executemany(
            """INSERT INTO chunks(id, chunk_id, document_id, chunk_index, start_offset,
                   end_offset, line_start, line_end, page_start, page_end, heading,
                   content, content_hash)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            rows,
        )
        cjk = []
        for row in rows:
            if has_cjk(row[10]) or has_cjk(row[11]):
                cjk.append((row[0], row[1], " ".join(cjk_terms(row[10] + "\n" + row[11]))))
        if cjk:
            conn.executemany("INSERT INTO chunks_cjk(id, chunk_id, bigrams) VALUES (?, ?, ?)", cjk)
        encoded = self.terms.encode_many([embedding_text(ch.heading, ch.text) for p in batch for ch in p.chunks])
        conn.executemany(
            "INSERT INTO bm25_chunk_terms(id, length, term_ids, term_freqs) VALUES (?, ?, ?, ?)",
            [(row[0], *values) for row, values in zip(rows, encoded)],
        )
        self.next_row_id = next_id

    def keep_unchanged(self, job: Job, report: IngestReport) -> bool:
        """A file whose bytes the collection holds: its stat record and access list brought up
        to date, nothing re-chunked or re-embedded. True when a row changed."""
        prior, changed = job.prior, False
        if (prior[5], prior[6]) != (job.size, job.mtime_ns):
            # Same bytes, new size/mtime record (touched, or an older collection):
            # refreshed, so its hits do not say source_changed for ever.
            self.conn.execute(
                "UPDATE documents SET source_size = ?, source_mtime_ns = ? "
                "WHERE document_id = ?", (job.size, job.mtime_ns, prior[0]))
            changed = True
        if prior[4] == job.acl:
            report.unchanged += 1
        else:  # only its access list changed: no re-chunking, no re-embedding
            self.conn.execute(
                "UPDATE documents SET acl = ?, generation = ? WHERE document_id = ?",
                (job.acl, self.generation, prior[0]),
            )
            report.updated += 1
            changed = True
        return changed

    def remove(self, document_id: str) -> None:
        self.conn.execute("DELETE FROM documents WHERE document_id = ?", (document_id,))

    def close_documents(self) -> None:
        """After the last document: new terms stored, the new chunks put in the text index."""
        self.terms.flush()
        index_new_chunks(self.conn, self.first_new_row)

    def write_manifest(self, manifest: dict, embedding: dict | None, chunker: str, base_dir: str,
                       report: IngestReport | None = None) -> None:
        """The run's manifest entries; ``embedding``: the embedder's (vector_upkeep.py), None
        for a BM25-only run."""
        values = {
            "generation": str(self.generation),
            "chunker": chunker,
            "base_dir": base_dir,
            "bm25": json.dumps(bm25_settings()),
            "ingested_at": _now(),
            "tokenizer": TOKENIZER,
        }
        if report is not None:
            values["ingest_report"] = ingest_summary(report)
        # Sticky: once any version had an access list, every later one says so, so a publish
        # that drops the last list cannot open Datasette's raw views mid-flight (adr/0011).
        if self.conn.execute("SELECT 1 FROM documents WHERE acl IS NOT NULL LIMIT 1").fetchone():
            values["access_lists"] = "1"
        if "created_at" not in manifest:
            values["created_at"] = _now()
        if embedding is None:
            if not manifest.get("embedder"):
                values["embedder"] = "none"
        else:
            values.update(embedding)
        set_manifest(self.conn, values.items())


def set_manifest(conn, entries) -> None:
    conn.executemany(
        "INSERT INTO groundkit_manifest(key, value) VALUES (?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        list(entries),
    )
