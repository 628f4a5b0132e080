"""Writing a collection: incremental, per-document atomic, published by rename.

An ingest is made of parts, each in its module (adr/0055-what-an-ingest-is-made-of.md):
the workspace (write lock, private copy, spare, publish: workspace.py), the scanner (walk,
excludes, jobs: scanner.py), the map stage (extract and chunk: prepared.py, in this process or
on a cluster: cluster.py), the document writer (documents, chunks, term rows, manifest: document_writer.py),
postings upkeep (postings.py) and vector upkeep (vector_upkeep.py). ``Indexer`` composes them:
each run copies the live file, applies changes there one document per savepoint, rebuilds the
BM25 postings, then swaps the copy in with ``os.replace`` (adr/0002-publish-by-rename.md).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from . import extract, safe_read
from .access_lists import ACLResolver
from ..errors import IngestError, InvalidRequest
from .document_writer import DocumentWriter, set_manifest
from .names import lance_path, validate_name
from .postings import keep_postings, settings as bm25_settings, track_removed_terms
from .prepared import Outcome, Prepared, embedding_text, local_map, prepare_document
from .report import IngestReport
from .scanner import Scanner, existing_documents
from .schema import read_manifest, suspend_fts_trigger
from .tokenizer import TOKENIZER
from .vector_upkeep import (Binding, bind_embedder, open_vectors, restore_missing_vectors, vectors_complete,
                            vectors_for)
from .workspace import Workspace

log = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 1000
DEFAULT_CHUNK_OVERLAP = 100
# The contextual header rule recorded in the ``chunker`` manifest entry: a chunk's heading is
# the document title in front of its heading path (chunking.contextual_heading). A collection
# chunked without it (before adr/0035-contextual-title-header.md) is re-chunked once.
TITLE_HEADER = "title > headings"
# Chunks gathered before one embedding call: amortises batching across small documents.
EMBED_BATCH_CHUNKS = 256


@dataclass
class _Run:
    """One run's state, from the private copy's opening to its publish."""
    conn: object
    report: IngestReport
    writer: DocumentWriter
    binding: Binding
    vectors: object | None
    pending: list[Prepared] = field(default_factory=list)
    pending_chunks: int = 0
    changed: bool = False
    # Whether every posting must be rewritten (new chunks for all, or new BM25 settings).
    rebuild: bool = True


class Indexer:
    """Ingest files into the collection ``name`` under ``index_dir``.

    >>> Indexer("docs", index_dir=".").ingest(["docs/"])
    """

    def __init__(
        self,
        name: str,
        *,
        index_dir: str | Path = ".",
        base_dir: str | Path | None = None,
        embedder: str | None = None,
        embedder_options: dict | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        chunk_overlap: int = DEFAULT_CHUNK_OVERLAP,
        exclude: Iterable[str] = (),
        progress: Callable[[dict], None] | None = None,
        ann_threshold: int | None = None,
        group_readable: bool | None = None,
        map_stage: Callable | None = None,
        spare_copy: bool = True,
        title_header: bool = True,
    ):
        self.name = validate_name(name)
        # Turns files to (re)process into documents, in order: here (prepared.local_map), or
        # on a cluster (indexing/cluster.py).
        self.map_stage = map_stage or local_map
        self.index_dir = Path(index_dir)
        self.base_dir = Path(base_dir) if base_dir is not None else None
        self.embedder_name = embedder
        # Cluster workers build their embedder from these, as the run bound them (a map stage
        # reads both).
        self.embedder_options = dict(embedder_options or {})
        self.bound_embedder: str | None = None
        if not isinstance(chunk_size, int) or chunk_size < 50:
            raise InvalidRequest("chunk size must be an integer of at least 50 characters")
        if not isinstance(chunk_overlap, int) or not 0 <= chunk_overlap < chunk_size // 2:
            raise InvalidRequest("chunk overlap must be at least 0 and less than half the chunk size")
        self.chunk_size = chunk_size
        self.chunk_overlap = chunk_overlap
        self.scanner = Scanner(exclude)
        self.progress = progress or (lambda event: None)
        self.ann_threshold = ann_threshold
        # None: a new collection is private, a re-ingest keeps whether its group could read it.
        self.group_readable = group_readable
        self.workspace = Workspace(self.index_dir, self.name, spare_copy)
        # False only to measure the chunks of before the contextual title (benchmarks/quality.py).
        self.title_header = bool(title_header)
        # What the last run did, beside its report (benchmarks read them): wall seconds per
        # stage, until the publish, whether the postings were rebuilt, the ANN index's action.
        self.timings: dict[str, float] = {}
        self._last_mark = time.perf_counter()
        self.published_seconds: float | None = None
        self.postings_rebuilt: bool | None = None
        self.ann_action: str | None = None

    @property
    def path(self) -> Path:
        return self.workspace.path

    def chunker_entry(self) -> str:
        """The manifest's ``chunker``: a different one re-chunks every document on the next run."""
        entry = {"chunk_size": self.chunk_size, "chunk_overlap": self.chunk_overlap}
        if self.title_header:
            entry["header"] = TITLE_HEADER
        return json.dumps(entry)

    def prepare(self, job) -> Prepared | Outcome:
        """Extract and chunk one file (the local map stage; cluster workers call the same)."""
        return prepare_document(job, self.chunk_size, self.chunk_overlap, self.title_header)

    # -- the run -----------------------------------------------------------

    def ingest(self, paths, *, missing_ok: bool = False,
               pinned: "safe_read.Base | None" = None) -> IngestReport:
        """``missing_ok``: a path that no longer exists is a root with nothing in it, so the
        documents under it are removed (watch mode, when a watched directory is renamed away).

        The base directory is resolved and opened once for the run (safe_read.Base), and every
        directory and file under it is reached from that descriptor; ``pinned``: one opened
        by the caller (watch mode, for all its batches)."""
        started = time.perf_counter()
        extract.check_extractors()
        base, roots = self.scanner.resolve_inputs(paths, self.base_dir, missing_ok, pinned)
        if pinned is not None:
            return self._ingest(pinned, base, roots, started)
        try:
            tree = safe_read.Base(base)
        except OSError as exc:
            raise InvalidRequest(f"base directory cannot be opened: {base} ({exc.strerror})") from None
        with tree:
            return self._ingest(tree, base, roots, started)

    def _ingest(self, tree: "safe_read.Base", base: Path, roots: list[Path], started: float) -> IngestReport:
        ws = self.workspace
        ws.choose_modes(self.group_readable)
        ws.make_dir(self.index_dir)
        report = IngestReport()
        self.timings = {}
        self._last_mark = time.perf_counter()
        self.published_seconds = self.postings_rebuilt = self.ann_action = None
        created_lance: list[Path] = []
        with ws.lock():
            ws.remove_stale_copies()
            work = ws.work_path()
            try:
                conn = ws.open_copy(work)
                try:
                    track_removed_terms(conn)
                    self._mark("open")
                    # One transaction for the run (the copy is private): per-document commits
                    # would make FTS5 write and merge a segment per document.
                    conn.execute("BEGIN")
                    run = self._run(conn, base, roots, report, tree, created_lance)
                    changed = run.changed
                    self._mark("documents")
                    if changed:
                        self._finish(run)
                    else:
                        conn.execute("ROLLBACK")
                    conn.close()
                except BaseException:
                    conn.close()
                    raise
                if changed:
                    ws.publish(work)
                    self._mark("publish")
                    report.published = True
                    self.published_seconds = time.perf_counter() - started
            finally:
                ws.discard(work, report.published)
                self._mark("retire")
                if not report.published and created_lance and not self.path.exists():
                    shutil.rmtree(created_lance[0], ignore_errors=True)  # nothing refers to it
            if report.published and ws.spare_copy:
                ws.make_spare()
                self._mark("spare")
        report.seconds = time.perf_counter() - started
        self.progress({"event": "done", "report": report})
        return report

    def _mark(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = self.timings.get(stage, 0.0) + now - self._last_mark
        self._last_mark = now

    def _run(self, conn, base: Path, roots: list[Path], report: IngestReport, tree: "safe_read.Base",
             created_lance: list[Path]) -> _Run:
        """Apply the files under ``roots`` to the private copy; the run says whether anything
        changed (then it is published)."""
        manifest = read_manifest(conn)
        binding = bind_embedder(conn, manifest, self.name, self.embedder_name, self.embedder_options)
        self.bound_embedder, self.embedder_options = binding.name, binding.options
        embedder = binding.embedder
        chunker = self.chunker_entry()
        rechunk = manifest.get("chunker") not in (None, chunker) or binding.backfill
        generation = int(manifest.get("generation", "0")) + 1

        vectors = None
        complete = False
        if embedder is not None:
            lance_dir = lance_path(self.index_dir, self.name)
            if self.workspace.make_dir(lance_dir):  # no one else may enter while LanceDB writes
                created_lance.append(lance_dir)
            vectors = open_vectors(lance_dir, embedder.dimensions, manifest, self.ann_threshold)
            complete = vectors_complete(conn, vectors, manifest, rechunk)
        acls = ACLResolver(tree)  # also the files' reader (scanner.read_job): one pinned base
        writer = DocumentWriter(conn, generation, self.progress)
        if manifest.get("tokenizer") != TOKENIZER and writer.terms.has_cjk_terms():
            rechunk = True  # CJK text was indexed as whole runs: tokenize it again as bigrams
        suspend_fts_trigger(conn)
        run = _Run(conn, report, writer, binding, vectors)
        seen: set[str] = set()
        files, prefixes, gone_files = self.scanner.files(tree, base, roots, report)
        existing = existing_documents(conn, [s for s, _ in files], prefixes, gone_files)
        self.progress({"event": "start", "total": len(files)})
        for job, result in self._map(files, seen, existing, acls, rechunk, vectors, report):
            if job.unreadable:
                report.skip(job.source, job.refused or "unreadable")
            elif not job.work:
                run.changed |= writer.keep_unchanged(job, report)
            elif isinstance(result, Outcome):
                if result.skipped:
                    report.skip(job.source, result.reason)
                else:
                    report.fail(job.source, result.reason)
            else:
                run.pending.append(result)
                run.pending_chunks += len(result.chunks)
                if run.pending_chunks >= EMBED_BATCH_CHUNKS:
                    self._flush(run)
        self._flush(run)
        writer.close_documents()

        if prefixes:  # documents whose files are gone from a directory root given in this run
            for source, (document_id, *_rest) in existing.items():
                if source not in seen and (source.startswith(prefixes) or source in gone_files):
                    writer.remove(document_id)
                    if vectors is not None:
                        vectors.replace_document(document_id, [], keep_ids=[])
                    report.removed += 1
                    run.changed = True

        # Unless every chunk had its vector at the published version and each chunk this run
        # wrote got one (adr/0034-one-file-edit-cost.md), look for chunks without one.
        if vectors is not None and not complete and restore_missing_vectors(
                conn, embedder, vectors, report, self.name, EMBED_BATCH_CHUNKS):
            run.changed = True
        if vectors is not None and vectors.index_missing():
            run.changed = True  # a collection from before the index file gets one (vectors.py)

        if manifest.get("generation") is None and report.written == 0:
            # A first run that wrote no document (every file failed or was skipped) publishes
            # nothing: an empty generation 1 would look like a collection that worked.
            run.changed = False
            return run
        # New BM25 settings (k1, b, IDF unit) re-weigh the postings of an unchanged corpus.
        rescore = manifest.get("bm25") != json.dumps(bm25_settings())
        if run.changed or rechunk or rescore or manifest.get("chunker") is None:
            run.changed = True
            writer.write_manifest(manifest, binding.manifest_entries(), chunker,
                                  os.path.relpath(base, self.index_dir.resolve()), report)
        report.generation = generation if run.changed else int(manifest.get("generation", "0"))
        # Postings are updated term by term unless every weight must change anyway.
        run.rebuild = rechunk or rescore
        return run

    def _flush(self, run: _Run) -> None:
        """Embed the pending documents' new chunks (one call) and write the documents."""
        pending, report, vectors, embedder = run.pending, run.report, run.vectors, run.binding.embedder
        if not pending:
            return
        run.pending, run.pending_chunks = [], 0
        new_vectors = {}
        if embedder is not None:
            keep = vectors.existing_ids([cid for p in pending for cid in p.chunk_ids],
                                        [p.document_id for p in pending])
            texts, ids = [], []
            for p in pending:
                for ch, cid in zip(p.chunks, p.chunk_ids):
                    if cid not in keep and cid not in new_vectors:
                        new_vectors[cid] = None
                        ids.append(cid)
                        texts.append(embedding_text(ch.heading, ch.text))
            try:
                embedded = vectors_for(embedder, pending, ids, texts)
            except Exception as exc:  # the whole batch keeps its previous state
                for p in pending:
                    report.fail(p.source, "embedding failed")
                log.error("embedding failed for %d chunks: %s", len(texts), exc)
                return
            new_vectors = dict(zip(ids, embedded))
            report.chunks_embedded += len(ids)
        for p in run.writer.write(pending, report):
            run.changed = True
            if vectors is not None:
                vectors.replace_document(
                    p.document_id,
                    [(cid, new_vectors[cid]) for cid in p.chunk_ids if cid in new_vectors],
                    keep_ids=p.chunk_ids,
                )

    def _map(self, files, seen, existing, acls, rechunk, vectors, report):
        """``(job, document or None)`` for each file, in walk order, from the map stage. One
        path: the forked map stage of adr/0046 measured slower than this one (adr/0055)."""
        report.map_stage = "local" if self.map_stage is local_map else "given"
        jobs = self.scanner.jobs(files, seen, existing, acls, rechunk, self.progress)
        return self.map_stage(jobs, self, vectors)

    def _finish(self, run: _Run) -> None:
        conn, vectors = run.conn, run.vectors
        self.progress({"event": "postings"})
        self.postings_rebuilt = keep_postings(conn, run.writer.first_new_row, run.rebuild)
        self._mark("postings")
        if vectors is not None:
            vectors.commit()
            self.ann_action = vectors.index_action
            self.workspace.restrict_tree(lance_path(self.index_dir, self.name))
            set_manifest(conn, vectors.manifest_entries())
            self._mark("vectors")
        conn.execute("COMMIT")
        # Immutable readers ignore WAL content: leave a plain rollback-journal file.
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("PRAGMA optimize")
        self._mark("commit")


def ingest(paths, *, collection: str, **options) -> IngestReport:
    """Convenience wrapper: ``ingest(["docs"], collection="docs", index_dir=".")``."""
    return Indexer(collection, **options).ingest(paths)


__all__ = ["Indexer", "IngestReport", "ingest", "IngestError"]
