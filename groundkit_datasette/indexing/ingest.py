"""Writing a collection: incremental, per-document atomic, published by rename.

The live ``<name>.sqlite3`` is never written in place: an immutable reader
(Datasette) takes no locks, so rewriting its pages under it would show torn
state. Each run copies the file, applies changes there one document per
savepoint, rebuilds the BM25 postings, then swaps the copy in with
``os.replace``. See adr/0002-publish-by-rename.md.
"""

from __future__ import annotations

import datetime
import fcntl
import fnmatch
import hashlib
import json
import logging
import os
import re
import shutil
import sqlite3
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

from . import forked_map, safe_read
from .postings import keep_postings, settings as bm25_settings, track_removed_terms
from .terms import TermTable
from .tokenizer import TOKENIZER, cjk_terms, has_cjk
from .access_lists import ACLResolver
from .chunking import chunk_text
from ..errors import CollectionBusy, EmbedderError, IngestError, InvalidRequest
from .extract import MAX_FILE_BYTES, Skipped, extract_bytes, page_for_offset
from ..registry import DEFAULT_EMBEDDER
from .names import lance_path, sqlite_path, validate_name
from .schema import (add_cjk_tables, add_encoding_column, add_stat_columns, check_stamp, create_schema, index_new_chunks,
                     read_manifest, suspend_fts_trigger)
from .vectors import VectorWriter

log = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 1000
DEFAULT_CHUNK_OVERLAP = 100
DEFAULT_EXCLUDES = (
    ".*",
    "__pycache__",
    "node_modules",
    "*.sqlite3",
    "*.sqlite3-*",
    "*.lance",
    "*.pyc",
    "*.acl.json",  # access-list sidecars (acl.py) describe documents; they are not documents
)
# The contextual header rule recorded in the ``chunker`` manifest entry: a chunk's heading is
# the document title in front of its heading path (chunking.contextual_heading). A collection
# chunked without it (before adr/0035-contextual-title-header.md) is re-chunked once.
TITLE_HEADER = "title > headings"
# Chunks gathered before one embedding call: amortises batching across small documents.
EMBED_BATCH_CHUNKS = 256
# (file mode, directory mode) of what ingest creates: the files hold the corpus.
PRIVATE_MODES = (0o600, 0o700)
GROUP_READABLE_MODES = (0o640, 0o750)


# Files listed by name in a collection's ingest_report entry; the counts cover every file.
MAX_REPORTED_FILES = 200


def ingest_summary(report: "IngestReport") -> str:
    """The manifest's ``ingest_report``: what the publishing run skipped or could not ingest."""
    return json.dumps({
        "skipped": len(report.skipped_files),
        "failed": len(report.failed_files),
        "skipped_files": [[s, r] for s, r in report.skipped_files[:MAX_REPORTED_FILES]],
        "failed_files": [[s, r] for s, r in report.failed_files[:MAX_REPORTED_FILES]],
    })


@dataclass
class IngestReport:
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    removed: int = 0
    failed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    skipped_files: list[tuple[str, str]] = field(default_factory=list)
    failed_files: list[tuple[str, str]] = field(default_factory=list)
    chunks_written: int = 0
    chunks_embedded: int = 0
    seconds: float = 0.0
    generation: int = 0
    published: bool = False
    # Chunks whose vector was missing (a lost or incomplete <name>.lance) and was embedded again.
    vectors_restored: int = 0
    # Where files were extracted and chunked: "local", "forked" (forked_map.py) or "given".
    map_stage: str = "local"

    @property
    def chunks_per_second(self) -> float:
        return self.chunks_written / self.seconds if self.seconds > 0 else 0.0

    def skip(self, source: str, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self.skipped_files.append((source, reason))

    def as_dict(self) -> dict:
        return {
            "added": self.added,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "removed": self.removed,
            "failed": self.failed,
            "skipped": sum(self.skipped.values()),
            "skipped_by_reason": dict(self.skipped),
            "chunks_written": self.chunks_written,
            "chunks_embedded": self.chunks_embedded,
            "seconds": round(self.seconds, 3),
            "chunks_per_second": round(self.chunks_per_second, 1),
            "generation": self.generation,
            "published": self.published,
            "vectors_restored": self.vectors_restored,
            "map_stage": self.map_stage,
            "failed_files": [{"source": s, "reason": r} for s, r in self.failed_files],
            "skipped_files": [{"source": s, "reason": r} for s, r in self.skipped_files],
        }

    @property
    def written(self) -> int:
        """Documents this run added or rewrote (an access-list-only change counts)."""
        return self.added + self.updated


class _DocumentColumns(NamedTuple):
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
class _Prepared:
    source: str
    document_id: str
    file_hash: str
    # Computed where the text is, so the writer never needs the text itself.
    document: "_DocumentColumns"
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
class _Job:
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


def _suffix(source: str) -> str:
    """``PurePosixPath(source).suffix`` without building a path per document."""
    name = source.rpartition("/")[2]
    i = name.rfind(".")
    return name[i:] if 0 < i < len(name) - 1 else ""


def prepare_document(job: _Job, chunk_size: int, chunk_overlap: int,
                     title_header: bool = True) -> "_Prepared | Outcome":
    try:
        extracted = extract_bytes(job.data, _suffix(job.source))
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


def prepared_from(job: _Job, text: str, title, pages: tuple, chunks, identity,
                  vectors: dict | None = None) -> "_Prepared":
    """A document's columns and chunk rows from its extracted text: the one place they are
    derived, for a local run and for a cluster worker's checked answer alike.
    ``identity``: (source_class, extractor, extractor_version, encoding)."""
    source_class, extractor, version, encoding = identity
    document_id = document_id_for(job.source)
    return _Prepared(
        source=job.source,
        document_id=document_id,
        file_hash=job.file_hash,
        document=_DocumentColumns(source_class, extractor, version, title, _sha(text), len(text),
                                  text.count("\n") + 1, len(pages) or None, encoding),
        chunks=chunks,
        chunk_ids=chunk_ids_for(document_id, chunks),
        chunk_details=[(page_for_offset(pages, ch.start), page_for_offset(pages, max(ch.end - 1, ch.start)),
                        _sha(ch.text)) for ch in chunks],
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


def _read_job(source: str, real: str, existing: dict, acls, rechunk: bool) -> _Job:
    """One file read, hashed and compared with the collection's record of it.

    ``real`` is the file's path relative to the base (a link's resolved target), opened from
    the base's descriptor (safe_read.py): whatever the walk saw, a link to outside the base, a
    FIFO or a device now at that name is refused, and no more than MAX_FILE_BYTES is read."""
    try:
        data, info = acls.tree.read(real, MAX_FILE_BYTES)
    except safe_read.Refused as refused:
        log.warning("not read: %s (%s)", source, refused.reason)
        reason = "unreadable" if refused.reason == safe_read.NOT_FOUND else refused.reason
        return _Job(source, None, unreadable=True, refused=reason)
    size, mtime_ns = info.st_size, info.st_mtime_ns  # the file just read, not the name now
    file_hash = _sha(data)
    acl = acls.for_document(source, data)
    prior = existing.get(source)
    work = not (prior and not rechunk and prior[1] == file_hash)
    return _Job(source, data if work else None, file_hash, acl, prior, size, mtime_ns, work)


def _entry_kind(entry: os.DirEntry) -> str:
    try:
        if entry.is_symlink():
            return "link"
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        return "file" if entry.is_file(follow_symlinks=False) else "other"
    except OSError:  # vanished since listed: read as unreadable
        return "file"


def _vectors_for(embedder, pending, ids, texts):
    """The vectors for ``ids``: as the map stage computed them, else from ``embedder`` now."""
    if pending and all(p.vectors is not None for p in pending):
        given = {cid: vec for p in pending for cid, vec in p.vectors.items()}
        return [given[cid] for cid in ids]
    return embedder.embed(texts) if texts else []


def _sha(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


class _savepoint:
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


_DOCUMENT_COLUMNS = ("source, document_id, file_hash, extractor, extractor_version, acl, "
                     "source_size, source_mtime_ns")


def _existing_documents(conn, sources, prefixes, gone_files) -> dict:
    """``{source: (document_id, file_hash, ...)}`` of the stored documents a run can touch: those
    at the walked sources, under a walked directory (``prefixes``), or at a root now gone. Read
    by key, not by listing the collection, unless the run covers most of it."""
    total = conn.execute("SELECT max(rowid) FROM documents").fetchone()[0] or 0
    if "" in prefixes or len(sources) * 4 > total:
        return {row[0]: row[1:] for row in conn.execute(f"SELECT {_DOCUMENT_COLUMNS} FROM documents")}
    out = {}
    wanted = list(dict.fromkeys([*sources, *gone_files]))
    for i in range(0, len(wanted), 500):
        part = wanted[i : i + 500]
        out.update((row[0], row[1:]) for row in conn.execute(
            f"SELECT {_DOCUMENT_COLUMNS} FROM documents WHERE source IN ({','.join('?' * len(part))})", part))
    for prefix in prefixes:  # each ends with "/": the range [prefix, prefix with "/" -> "0")
        out.update((row[0], row[1:]) for row in conn.execute(
            f"SELECT {_DOCUMENT_COLUMNS} FROM documents WHERE source >= ? AND source < ?",
            (prefix, prefix[:-1] + "0")))
    return out


def _copy_file(src: Path, dst: Path) -> None:
    """Copy ``src`` over the (existing, empty) ``dst`` with ``copy_file_range``: a clone where the
    file system can share blocks (btrfs, XFS), a copy inside the kernel elsewhere (adr/0034-one-file-edit-cost.md)."""
    with open(src, "rb") as fi, open(dst, "r+b") as fo:
        size, done = os.fstat(fi.fileno()).st_size, 0
        try:
            while done < size:
                n = os.copy_file_range(fi.fileno(), fo.fileno(), size - done, done, done)
                if n == 0:
                    break
                done += n
        except OSError:  # not offered here (another file system, an old kernel): copy in Python
            done = 0
        if done < size:
            fi.seek(0)
            fo.seek(0)
            fo.truncate()
            shutil.copyfileobj(fi, fo, 1 << 20)


def _connect_private(work: Path) -> sqlite3.Connection:
    # The copy is private and discarded on failure: no fsyncs, from the schema's first
    # statement on (a new file's DDL synced statement by statement took 0.1 s). The journal
    # stays on disk (written without syncing): one run is one transaction, and an in-memory
    # journal would hold every page the run changes (a re-chunk changes them all).
    conn = sqlite3.connect(work)
    conn.execute("PRAGMA synchronous = OFF")
    return conn


def document_id_for(source: str) -> str:
    return "d_" + _sha(source)[:20]


def chunk_ids_for(document_id: str, chunks) -> list[str]:
    """Content-derived ids: an unchanged chunk keeps its id (and vector) across edits elsewhere."""
    seen: dict[str, int] = {}
    ids = []
    for ch in chunks:
        key = f"{document_id}\0{ch.heading}\0{ch.text}"
        n = seen.get(key, 0)
        seen[key] = n + 1
        ids.append("c_" + _sha(f"{key}\0{n}")[:24])
    return ids


# The manifest key of the embedder's ``max_length`` (word pieces a text is cut to), for the
# embedders that have one: queries are embedded at the same length (retrieval/collection.py).
MAX_LENGTH_KEY = "embedding_max_length"


def embedding_max_length(embedder) -> int | None:
    """The embedder's ``max_length`` when it declares one as an integer, else None."""
    value = getattr(embedder, "max_length", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# The manifest key of how the embedder computed the vectors (MiniLM's ``compute``: "fp32" or
# "int8", adr/0040), for the embedders that have one: queries are embedded the same way. A
# collection without the record was embedded in fp32 (embedders.UNRECORDED_COMPUTE).
COMPUTE_KEY = "embedding_compute"


def embedding_compute(embedder) -> str | None:
    """The embedder's ``compute`` mode when it declares one as a string, else None."""
    value = getattr(embedder, "compute", None)
    return value if isinstance(value, str) else None


def _default_max_length(get_embedder, name: str) -> int | None:
    try:
        return embedding_max_length(get_embedder(name))
    except EmbedderError:  # an embedder that cannot be built without options: nothing to assume
        return None


def embedding_text(heading: str, text: str) -> str:
    return f"{heading}\n\n{text}" if heading else text


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
        fork_map: bool = True,
        spare_copy: bool = True,
        title_header: bool = True,
    ):
        self.name = validate_name(name)
        # Turns files to (re)process into documents, in order: here (below), or on a cluster
        # (indexing/cluster.py).
        self.map_stage = map_stage or local_map
        # False keeps a BM25-only run's map stage in this process (forked_map.py).
        self.fork_map = bool(fork_map)
        self.index_dir = Path(index_dir)
        self.base_dir = Path(base_dir) if base_dir is not None else None
        self.embedder_name = embedder
        self.embedder_options = dict(embedder_options or {})
        if not isinstance(chunk_size, int) or chunk_size < 50:
            raise InvalidRequest("chunk size must be an integer of at least 50 characters")
        if not isinstance(chunk_overlap, int) or not 0 <= chunk_overlap < chunk_size // 2:
            raise InvalidRequest("chunk overlap must be at least 0 and less than half the chunk size")
        self.chunk_size = chunk_size
        self.chunk_overlap = chunk_overlap
        self.exclude = tuple(DEFAULT_EXCLUDES) + tuple(exclude)
        self._exclude_pattern = re.compile("|".join(fnmatch.translate(g) for g in self.exclude))
        self.progress = progress or (lambda event: None)
        self.ann_threshold = ann_threshold
        # None: a new collection is private, a re-ingest keeps whether its group could read it.
        self.group_readable = group_readable
        self._file_mode, self._dir_mode = PRIVATE_MODES
        self._created_lance: Path | None = None
        # Keep a copy of the published file for the next run's private copy, made after the
        # publish (adr/0002, "spare copy"): a run then starts without copying the file.
        self.spare_copy = spare_copy
        # False only to measure the chunks of before the contextual title (benchmarks/quality.py).
        self.title_header = bool(title_header)
        self._took_spare = False
        self._retired = self.index_dir / f".{self.name}.sqlite3.ingest-{os.getpid()}.old"

    # -- paths and files ---------------------------------------------------

    @property
    def path(self) -> Path:
        return sqlite_path(self.index_dir, self.name)

    def _resolve_inputs(self, paths, missing_ok: bool = False,
                        pinned: "safe_read.Base | None" = None) -> tuple[Path, list[Path]]:
        """The base directory and the roots, resolved. A ``pinned`` base (watch mode) is not
        resolved again: its path is the one resolved when it was opened."""
        if not paths:
            raise InvalidRequest("give at least one file or directory to ingest")
        resolved = []
        for p in paths:
            rp = Path(p).resolve()
            if not missing_ok and not rp.exists():
                raise InvalidRequest(f"path does not exist: {p}")
            resolved.append(rp)
        if pinned is not None:
            base = Path(pinned.path)
        elif self.base_dir is not None:
            base = self.base_dir.resolve()
        else:
            common = Path(os.path.commonpath([str(p) for p in resolved]))
            base = common if common.is_dir() else common.parent
        for rp in resolved:
            if rp != base and base not in rp.parents:
                raise InvalidRequest(f"path is outside the base directory: {rp}")
        return base, resolved

    def _excluded(self, rel: str) -> bool:
        name = rel.rsplit("/", 1)[-1]
        match = self._exclude_pattern.match
        return match(name) is not None or match(rel) is not None

    def _walk(self, tree: "safe_read.Base", root: Path, report: IngestReport):
        """Yield ``(source, real)`` for files under ``root`` that stay inside the base ``tree``:
        ``real`` is what to open, relative to the base (a link's resolved target).

        Directories are listed from the base's descriptor, never by a path (safe_read.py), and
        one at a time from a stack: a tree deeper than Python's recursion limit is walked too.
        Order is deterministic: a directory's files by name, then its subdirectories by name.
        """
        base = Path(tree.path)

        def symlink(rel: str):
            try:
                target = tree.resolve(rel)
            except safe_read.Refused as refused:
                report.skip(rel, refused.reason)
                if refused.reason == safe_read.OUTSIDE:
                    log.warning("refused symlink leaving the base directory: %s", rel)
                return None
            try:
                mode = tree.lstat(target).st_mode
            except safe_read.Refused:
                return rel, target  # dangling: reported as unreadable when read
            if stat.S_ISDIR(mode):
                report.skip(rel, "symlinked directory not followed")
                return None
            if not stat.S_ISREG(mode) and not stat.S_ISLNK(mode):  # a FIFO would block the read
                report.skip(rel, "not a regular file")
                return None
            return rel, target  # a link still (a loop): reported when read

        # Roots come resolved (_resolve_inputs): never a symlink themselves.
        rel_root = root.relative_to(base).as_posix() if root != base else ""
        try:
            mode = tree.lstat(rel_root).st_mode
        except safe_read.Refused:
            mode = 0
        if stat.S_ISREG(mode):
            if not self._excluded(rel_root):
                yield rel_root, rel_root
            return
        if not stat.S_ISDIR(mode):
            report.skip(rel_root or root.name, "not a regular file")
            return

        stack = [rel_root]
        while stack:
            directory = stack.pop()
            prefix = directory + "/" if directory else ""
            # os.scandir: file types come with the directory listing, no stat per file (asked
            # while the descriptor is open: where the listing has no types, they are statted).
            try:
                fd = tree.open_dir(directory)
                try:
                    with os.scandir(fd) as it:
                        entries = sorted((e.name, _entry_kind(e)) for e in it)
                finally:
                    os.close(fd)
            except (OSError, safe_read.Refused) as exc:  # one unreadable directory must not end the run
                report.skip(directory or ".", "unreadable directory")
                log.warning("cannot list %s: %s", directory or ".",
                            getattr(exc, "strerror", None) or getattr(exc, "reason", exc))
                continue
            subdirs = []
            for name, kind in entries:
                rel = prefix + name
                if self._excluded(rel):
                    continue
                if kind == "link":
                    item = symlink(rel)
                    if item:
                        yield item
                elif kind == "dir":
                    subdirs.append(rel)
                elif kind == "file":
                    yield rel, rel
                else:
                    report.skip(rel, "not a regular file")
            stack.extend(reversed(subdirs))

    # -- the run -----------------------------------------------------------

    def ingest(self, paths, *, missing_ok: bool = False,
               pinned: "safe_read.Base | None" = None) -> IngestReport:
        """``missing_ok``: a path that no longer exists is a root with nothing in it, so the
        documents under it are removed (watch mode, when a watched directory is renamed away).

        The base directory is resolved and opened once for the run (safe_read.Base), and every
        directory and file under it is reached from that descriptor; ``pinned``: one opened
        by the caller (watch mode, for all its batches)."""
        started = time.perf_counter()
        base, roots = self._resolve_inputs(paths, missing_ok, pinned)
        if pinned is not None:
            return self._ingest(pinned, base, roots, started)
        try:
            tree = safe_read.Base(base)
        except OSError as exc:
            raise InvalidRequest(f"base directory cannot be opened: {base} ({exc.strerror})") from None
        with tree:
            return self._ingest(tree, base, roots, started)

    def _ingest(self, tree: "safe_read.Base", base: Path, roots: list[Path], started: float) -> IngestReport:
        self._choose_modes()
        if not self.index_dir.exists():
            # Only a directory ingest creates is made private: an existing one is the user's.
            self.index_dir.mkdir(parents=True, mode=self._dir_mode)
            os.chmod(self.index_dir, self._dir_mode)  # mkdir's mode is filtered by the umask
        report = IngestReport()
        # Wall seconds per stage of this run (benchmarks/ingest.py prints them).
        self.timings: dict[str, float] = {}
        self._last_mark = time.perf_counter()
        with self._write_lock():
            self._remove_stale_copies()
            work = self.index_dir / f".{self.name}.sqlite3.ingest-{os.getpid()}"
            try:
                # The spare copy becomes the private copy (renamed to a free name: renaming over
                # a file would make ext4 start writing the whole spare out, adr/0034-one-file-edit-cost.md). Otherwise
                # the copy is created with its final mode before any corpus text is written.
                self._took_spare = self.path.exists() and self._take_spare(work)
                if not self._took_spare:
                    os.close(os.open(work, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self._file_mode))
                    os.chmod(work, self._file_mode)
                conn = self._open_private_copy(work)
                self._mark("open")
                try:
                    # One transaction for the run (the copy is private): per-document commits
                    # would make FTS5 write and merge a segment per document.
                    conn.execute("BEGIN")
                    changed, vectors = self._run(conn, base, roots, report, tree)
                    self._mark("documents")
                    if changed:
                        self._finish(conn, vectors)
                    else:
                        conn.execute("ROLLBACK")
                    conn.close()
                except BaseException:
                    conn.close()
                    raise
                if changed:
                    self._publish(work)
                    self._mark("publish")
                    report.published = True
                    self.published_seconds = time.perf_counter() - started
            finally:
                if not report.published and self._took_spare:
                    self._return_spare(work)
                if work.exists():
                    work.unlink()
                # The replaced version's last name, dropped once the new one is live.
                self._retired.unlink(missing_ok=True)
                self._mark("retire")
                if not report.published and self._created_lance is not None and not self.path.exists():
                    shutil.rmtree(self._created_lance, ignore_errors=True)  # nothing refers to it
            if report.published and self.spare_copy:
                self._make_spare()
                self._mark("spare")
        report.seconds = time.perf_counter() - started
        self.progress({"event": "done", "report": report})
        return report

    def _mark(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = self.timings.get(stage, 0.0) + now - self._last_mark
        self._last_mark = now

    def _choose_modes(self) -> None:
        group = self.group_readable
        if group is None:
            try:
                group = bool(self.path.stat().st_mode & stat.S_IRGRP)
            except FileNotFoundError:
                group = False
        self._file_mode, self._dir_mode = GROUP_READABLE_MODES if group else PRIVATE_MODES

    def _restrict_tree(self, root: Path) -> None:
        """Give ``root`` and everything under it this run's modes (LanceDB creates its files 0644)."""
        def chmod(path, mode):
            try:
                if stat.S_IMODE(os.lstat(path).st_mode) != mode:
                    os.chmod(path, mode)
            except FileNotFoundError:
                pass

        chmod(root, self._dir_mode)
        for dirpath, dirnames, filenames in os.walk(root):
            for d in dirnames:
                chmod(os.path.join(dirpath, d), self._dir_mode)
            for f in filenames:
                chmod(os.path.join(dirpath, f), self._file_mode)

    def _write_lock(self):
        lock_path = self.index_dir / f".{self.name}.lock"
        indexer = self

        class _Lock:
            def __enter__(self):
                self.fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, indexer._file_mode)
                try:
                    os.fchmod(self.fd, indexer._file_mode)
                except OSError:  # another user's lock file: its mode is theirs
                    pass
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(self.fd)
                    raise CollectionBusy(
                        f"collection '{indexer.name}' is being written by another ingest; "
                        "try again when it has finished"
                    ) from None

            def __exit__(self, *exc):
                fcntl.flock(self.fd, fcntl.LOCK_UN)
                os.close(self.fd)

        return _Lock()

    def _remove_stale_copies(self):
        # Only reachable while holding the lock, so any copy left here is from a dead run.
        for stale in self.index_dir.glob(f".{self.name}.sqlite3.ingest-*"):
            stale.unlink(missing_ok=True)
        spare = self._spare_path()
        for old in self.index_dir.glob(f".{self.name}.sqlite3.spare-*"):
            if old != spare:  # of another version, another boot, or half made
                old.unlink(missing_ok=True)

    def _spare_path(self) -> Path | None:
        """Where a spare copy of the live file as it is now would be: its name holds the boot
        and the live file's identity, so a copy of another version or one made before a crash
        (never synced) is not used."""
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                boot = f.read().strip()
            st = self.path.stat()
        except OSError:
            return None
        return self.index_dir / (f".{self.name}.sqlite3.spare-{boot}-{st.st_dev}-{st.st_ino}-"
                                 f"{st.st_size}-{st.st_mtime_ns}")

    def _make_spare(self) -> None:
        """Copy the file just published for the next run (under the lock, never read by anyone
        else). Synced here, after the publish, so that the next publish's fsync writes only what
        that run changed; a crash before then changes the boot id in its name, so a copy that
        may be torn is never used."""
        spare = self._spare_path()
        if spare is None:
            return
        tmp = self.index_dir / f".{self.name}.sqlite3.spare-{os.getpid()}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self._file_mode))
            os.chmod(tmp, self._file_mode)
            _copy_file(self.path, tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, spare)
        except OSError as exc:  # only the next run's speed depends on it
            log.warning("could not keep a spare copy of collection '%s': %s", self.name, exc.strerror)
            tmp.unlink(missing_ok=True)

    def _return_spare(self, work: Path) -> None:
        """A run that published nothing rolled its copy back (SQLite restores every page it
        changed, and the size): it is the spare again, unless something was committed to it
        (the header's change counter says so). So a refused run leaves the directory as it was."""
        spare = self._spare_path()
        try:
            with open(self.path, "rb") as a, open(work, "rb") as b:
                if spare is not None and a.read(100) == b.read(100):
                    os.replace(work, spare)
        except OSError:
            pass

    def _take_spare(self, work: Path) -> bool:
        """Make the spare copy of the live file the private copy, if there is one."""
        spare = self._spare_path()
        if spare is None or not spare.exists():
            return False
        try:
            with open(self.path, "rb") as a, open(spare, "rb") as b:
                same = a.read(100) == b.read(100)  # the header holds SQLite's change counter
            if not same:
                spare.unlink()
                return False
            work.unlink(missing_ok=True)  # a dead run's, with this pid
            os.rename(spare, work)
            os.chmod(work, self._file_mode)
        except OSError:
            return False
        return True

    def _open_private_copy(self, work: Path) -> sqlite3.Connection:
        live = self.path
        if live.exists():
            if not self._took_spare:
                _copy_file(live, work)
            conn = _connect_private(work)
            try:
                check_stamp(conn)
                add_encoding_column(conn)  # older collections: additive, NULL for their rows
                add_stat_columns(conn)
                add_cjk_tables(conn)
            except Exception:
                conn.close()
                raise
        else:
            conn = _connect_private(work)
            create_schema(conn)
        conn.execute("PRAGMA foreign_keys = ON")
        conn.isolation_level = None
        # The term ids of every chunk row the run deletes (by any path: an update, a removed
        # document, a cascade): the postings of just those terms are rewritten at the end.
        track_removed_terms(conn)
        return conn

    def _bind_embedder(self, conn, manifest: dict):
        """Pick the embedder and check it against the collection's manifest."""
        bound = manifest.get("embedder")
        name = self.embedder_name
        if name is None:
            name = bound or DEFAULT_EMBEDDER
        self._resolved_embedder = name
        has_docs = conn.execute("SELECT 1 FROM documents LIMIT 1").fetchone() is not None
        if name == "none":
            if bound and bound != "none":
                raise InvalidRequest(
                    f"collection '{self.name}' is bound to embedder {manifest.get('embedding_model')} "
                    "and --embedder none would leave new chunks without vectors"
                )
            return None, False
        from ..embedding.embedders import (  # not for BM25-only runs
            UNRECORDED_COMPUTE, first_embedder, get_embedder)

        recorded = manifest.get(MAX_LENGTH_KEY) if bound == name else None
        recorded_compute = manifest.get(COMPUTE_KEY) if bound == name else None
        options = dict(self.embedder_options)
        if recorded and "max_length" not in options:
            # Embed at the length the collection's vectors were embedded at.
            options["max_length"] = int(recorded)
        # Computed the way they were (a collection from before the record: fp32), for the
        # embedders that have a compute mode; the others are tried without it.
        attempts = [options]
        if bound == name and "compute" not in options:
            attempts.insert(0, {**options, "compute": recorded_compute or UNRECORDED_COMPUTE})
        if options != self.embedder_options:
            attempts.append(dict(self.embedder_options))  # a factory without the option: checked below
        embedder, options = first_embedder(name, attempts)
        self.embedder_options = options  # cluster workers build their embedder from these
        backfill = False
        if bound and bound != "none":
            want = (manifest.get("embedding_provider"), manifest.get("embedding_model"),
                    str(manifest.get("embedding_dimensions")))
            got = (embedder.provider, embedder.model_name, str(embedder.dimensions))
            if want != got:
                raise EmbedderError(
                    f"collection '{self.name}' was built with {want[0]}/{want[1]} ({want[2]} dimensions); "
                    f"refusing to add vectors from {got[0]}/{got[1]} ({got[2]} dimensions)"
                )
            got_length = embedding_max_length(embedder)
            if got_length is not None:
                # A collection from before the record was embedded at the embedder's default.
                want_length = int(recorded) if recorded else _default_max_length(get_embedder, name)
                if want_length is not None and want_length != got_length:
                    raise EmbedderError(
                        f"collection '{self.name}' was embedded at max_length {want_length}; refusing "
                        f"to add vectors embedded at {got_length} (give --embedder-option "
                        f"max_length={want_length}, or ingest into a new collection)"
                    )
            got_compute = embedding_compute(embedder)
            want_compute = recorded_compute or UNRECORDED_COMPUTE
            if got_compute is not None and got_compute != want_compute:
                raise EmbedderError(
                    f"collection '{self.name}' was embedded with compute {want_compute}; refusing "
                    f"to add vectors computed with {got_compute} (give --embedder-option "
                    f"compute={want_compute}, or ingest into a new collection)"
                )
        elif has_docs:
            backfill = True  # a BM25-only collection gains vectors for every chunk
        return embedder, backfill

    def _run(self, conn, base: Path, roots: list[Path], report: IngestReport, tree: "safe_read.Base") -> bool:
        manifest = read_manifest(conn)
        embedder, backfill = self._bind_embedder(conn, manifest)
        chunker = self.chunker_entry()
        rechunk = manifest.get("chunker") not in (None, chunker) or backfill
        generation = int(manifest.get("generation", "0")) + 1

        vectors = None
        if embedder is not None:
            lance_dir = lance_path(self.index_dir, self.name)
            if not lance_dir.exists():
                lance_dir.mkdir(mode=self._dir_mode)
                os.chmod(lance_dir, self._dir_mode)  # no one else may enter while LanceDB writes
                self._created_lance = lance_dir
            vectors = VectorWriter(lance_dir, embedder.dimensions,
                                   manifest.get("lance_version"),
                                   trained_rows=int(manifest.get("ann_trained_rows") or 0) or None,
                                   **({"ann_threshold": self.ann_threshold}
                                      if self.ann_threshold is not None else {}))
        # Every chunk has its vector at the published version when the table holds one row per
        # chunk there (chunk ids are unique): then no search for missing vectors is needed.
        self._vectors_complete = bool(
            vectors is not None and vectors.table is not None and manifest.get("lance_version")
            and not rechunk
            and vectors.start_rows == conn.execute("SELECT count(*) FROM chunks").fetchone()[0])
        acls = ACLResolver(tree)  # also the files' reader (_read_job): one pinned base
        terms = TermTable(conn)
        if manifest.get("tokenizer") != TOKENIZER and terms.has_cjk_terms():
            rechunk = True  # CJK text was indexed as whole runs: tokenize it again as bigrams
        self._next_row_id = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM chunks").fetchone()[0]
        first_new_row = self._first_new_row = self._next_row_id
        suspend_fts_trigger(conn)
        seen: set[str] = set()
        pending: list[_Prepared] = []
        pending_new_chunks = 0
        changed = False

        def flush():
            nonlocal pending, pending_new_chunks, changed
            if not pending:
                return
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
                    embedded = _vectors_for(embedder, pending, ids, texts)
                except Exception as exc:  # the whole batch keeps its previous state
                    for p in pending:
                        report.failed += 1
                        report.failed_files.append((p.source, "embedding failed"))
                    log.error("embedding failed for %d chunks: %s", len(texts), exc)
                    pending, pending_new_chunks = [], 0
                    return
                new_vectors = dict(zip(ids, embedded))
                report.chunks_embedded += len(ids)
            for p in self._write_documents(conn, pending, terms, generation, report):
                changed = True
                if vectors is not None:
                    vectors.replace_document(
                        p.document_id,
                        [(cid, new_vectors[cid]) for cid in p.chunk_ids if cid in new_vectors],
                        keep_ids=p.chunk_ids,
                    )
            pending, pending_new_chunks = [], 0

        # Overlapping paths (a directory and what is inside it) name each file once, and a
        # root inside another directory root is not walked twice.
        # One stat per root and a set lookup per parent: linear in the number of paths.
        unique_roots = list(dict.fromkeys(roots))
        dir_roots = {r for r in unique_roots if r.is_dir()}
        gone = {r for r in unique_roots if not r.exists()}  # only with ingest(missing_ok=True)
        walked = [r for r in unique_roots
                  if r not in gone and not any(p in dir_roots for p in r.parents)]
        files = list({item[0]: item for root in walked for item in self._walk(tree, root, report)}.values())
        # Prune documents whose files are gone from a directory root given in this run.
        prefixes = tuple("" if root == base else root.relative_to(base).as_posix() + "/"
                         for root in dir_roots | gone)
        gone_files = {root.relative_to(base).as_posix() for root in gone if root != base}
        existing = _existing_documents(conn, [s for s, _ in files], prefixes, gone_files)
        self.progress({"event": "start", "total": len(files)})
        for job, result in self._map(files, seen, existing, acls, rechunk, vectors, report):
            if job.unreadable:
                report.skip(job.source, job.refused or "unreadable")
                continue
            prior = job.prior
            if not job.work:
                if (prior[5], prior[6]) != (job.size, job.mtime_ns):
                    # Same bytes, new size/mtime record (touched, or an older collection):
                    # refreshed, so its hits do not say source_changed for ever.
                    conn.execute(
                        "UPDATE documents SET source_size = ?, source_mtime_ns = ? "
                        "WHERE document_id = ?", (job.size, job.mtime_ns, prior[0]))
                    changed = True
                if prior[4] == job.acl:
                    report.unchanged += 1
                else:  # only its access list changed: no re-chunking, no re-embedding
                    conn.execute(
                        "UPDATE documents SET acl = ?, generation = ? WHERE document_id = ?",
                        (job.acl, generation, prior[0]),
                    )
                    report.updated += 1
                    changed = True
                continue
            if isinstance(result, Outcome):
                if result.skipped:
                    report.skip(job.source, result.reason)
                else:
                    report.failed += 1
                    report.failed_files.append((job.source, result.reason))
                continue
            pending.append(result)
            pending_new_chunks += len(result.chunks)
            if pending_new_chunks >= EMBED_BATCH_CHUNKS:
                flush()
        flush()
        terms.flush()
        index_new_chunks(conn, first_new_row)

        if prefixes:
            for source, (document_id, *_rest) in existing.items():
                if source not in seen and (source.startswith(prefixes) or source in gone_files):
                    conn.execute("DELETE FROM documents WHERE document_id = ?", (document_id,))
                    if vectors is not None:
                        vectors.replace_document(document_id, [], keep_ids=[])
                    report.removed += 1
                    changed = True

        if vectors is not None and self._restore_missing_vectors(conn, embedder, vectors, report):
            changed = True
        if vectors is not None and vectors.index_missing():
            changed = True  # a collection from before the index file gets one (vectors.py)

        if manifest.get("generation") is None and report.written == 0:
            # A first run that wrote no document (every file failed or was skipped) publishes
            # nothing: an empty generation 1 would look like a collection that worked.
            return False, vectors
        # New BM25 settings (k1, b, IDF unit) re-weigh the postings of an unchanged corpus.
        rescore = manifest.get("bm25") != json.dumps(bm25_settings())
        # Postings are updated term by term unless every weight must change anyway.
        self._rebuild_postings = rechunk or rescore
        if changed or rechunk or rescore or manifest.get("chunker") is None:
            changed = True
            self._write_manifest(conn, manifest, embedder, chunker, generation, base, report)
        report.generation = generation if changed else int(manifest.get("generation", "0"))
        return changed, vectors

    def _map(self, files, seen, existing, acls, rechunk, vectors, report):
        """``(job, document or None)`` for each file, in walk order: from the map stage given,
        or for a BM25-only run of enough files, from forked children (forked_map.py)."""
        if not (self.fork_map and self.map_stage is local_map and vectors is None
                and forked_map.usable(len(files))):
            report.map_stage = "local" if self.map_stage is local_map else "given"
            yield from self.map_stage(self._jobs(files, seen, existing, acls, rechunk), self, vectors)
            return
        report.map_stage = "forked"

        def work(items):  # in a child
            acls.tree.reopen()  # the child closed the base's descriptor with the others
            out = []
            for source, real in items:
                job = _read_job(source, real, existing, acls, rechunk)
                result = self.prepare(job) if job.work else None
                job.data = None  # the writer needs what came of the bytes, not the bytes
                out.append((job, result))
            return out

        done = 0
        for out in forked_map.run(files, work, children=forked_map.processes()):
            for job, result in out:
                done += 1
                seen.add(job.source)
                self.progress({"event": "file", "source": job.source, "done": done, "total": len(files)})
                yield job, result

    def _jobs(self, files, seen, existing, acls, rechunk):
        """Each file in walk order, read, hashed and compared with the collection: an unchanged
        file is marked before any work is done on it, here or on a cluster."""
        for done, (source, real) in enumerate(files, 1):
            seen.add(source)
            self.progress({"event": "file", "source": source, "done": done, "total": len(files)})
            yield _read_job(source, real, existing, acls, rechunk)

    def chunker_entry(self) -> str:
        """The manifest's ``chunker``: a different one re-chunks every document on the next run."""
        entry = {"chunk_size": self.chunk_size, "chunk_overlap": self.chunk_overlap}
        if self.title_header:
            entry["header"] = TITLE_HEADER
        return json.dumps(entry)

    def prepare(self, job: "_Job") -> "_Prepared | Outcome":
        """Extract and chunk one file (the local map stage; cluster workers call the same)."""
        return prepare_document(job, self.chunk_size, self.chunk_overlap, self.title_header)

    def _restore_missing_vectors(self, conn, embedder, vectors, report: IngestReport) -> bool:
        """Embed every chunk that has no vector, so a publish never leaves chunks without one.

        Vectors go missing when ``<name>.lance`` is lost or incomplete; unchanged files are not
        re-embedded by the main pass, so without this a re-ingest would publish a vector table
        covering only the files that changed.
        """
        if self._vectors_complete:
            # Every chunk had its vector at the published version and each chunk this run
            # wrote got one: nothing to look for (adr/0034-one-file-edit-cost.md).
            return False
        missing: dict[str, list[str]] = {}
        vectors.load_all()
        # The chunk ids alone come from their index, not from the rows (which hold the text).
        known = vectors.ids
        listed = conn.execute("SELECT group_concat(chunk_id, ' ') FROM chunks").fetchone()[0]
        if not known.issuperset((listed or "").split()):  # chunk ids hold no spaces
            for chunk_id, document_id in conn.execute("SELECT chunk_id, document_id FROM chunks"):
                if chunk_id not in known:
                    missing.setdefault(document_id, []).append(chunk_id)
        total = sum(len(ids) for ids in missing.values())
        if not total:
            return False
        log.warning("%d chunks have no vector (the vector index was missing or incomplete); "
                    "embedding them again", total)
        items = [(did, cid) for did, ids in missing.items() for cid in ids]
        for i in range(0, len(items), EMBED_BATCH_CHUNKS):
            batch = items[i : i + EMBED_BATCH_CHUNKS]
            texts = []
            for _did, cid in batch:
                heading, content = conn.execute(
                    "SELECT heading, content FROM chunks WHERE chunk_id = ?", (cid,)
                ).fetchone()
                texts.append(embedding_text(heading, content))
            try:
                embedded = embedder.embed(texts)
            except Exception as exc:
                log.error("embedding missing vectors failed: %s", exc)
                raise EmbedderError(
                    f"{total} chunks of collection '{self.name}' have no vector (its vector index "
                    "is missing or incomplete) and embedding them failed; nothing was published"
                ) from None
            by_document: dict[str, list] = {}
            for (did, cid), vec in zip(batch, embedded):
                by_document.setdefault(did, []).append((cid, vec))
            for did, rows in by_document.items():
                keep = vectors.by_document.get(did, set()) | {cid for cid, _ in rows}
                vectors.replace_document(did, rows, keep_ids=keep)
            report.chunks_embedded += len(batch)
            report.vectors_restored += len(batch)
        return True

    def _write_documents(self, conn, batch: list[_Prepared], terms, generation, report) -> list[_Prepared]:
        """Write a batch of documents; return those written.

        The batch goes in under one savepoint. If that fails, each document is
        retried under its own, so a bad document costs only itself and keeps its
        previous rows.
        """
        try:
            with _savepoint(conn):
                self._insert_documents(conn, batch, terms, generation)
            written = batch
        except Exception:
            written = []
            for p in batch:
                try:
                    with _savepoint(conn):
                        self._insert_documents(conn, [p], terms, generation)
                    written.append(p)
                except Exception as exc:
                    report.failed += 1
                    report.failed_files.append((p.source, "write failed"))
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

    def _insert_documents(self, conn, batch: list[_Prepared], terms, generation) -> None:
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
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
                    d.page_count, len(p.chunks), p.acl, generation, now, d.encoding, p.size,
                    p.mtime_ns,
                )
                for p in batch for d in (p.document,)
            ],
        )
        # Row ids are assigned here (not by SQLite), so the term rows can name them.
        rows = []
        next_id = self._next_row_id
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
        encoded = terms.encode_many([embedding_text(ch.heading, ch.text) for p in batch for ch in p.chunks])
        conn.executemany(
            "INSERT INTO bm25_chunk_terms(id, length, term_ids, term_freqs) VALUES (?, ?, ?, ?)",
            [(row[0], *values) for row, values in zip(rows, encoded)],
        )
        self._next_row_id = next_id

    def _write_manifest(self, conn, manifest, embedder, chunker, generation, base, report=None):
        values = {
            "generation": str(generation),
            "chunker": chunker,
            "base_dir": os.path.relpath(base, self.index_dir.resolve()),
            "bm25": json.dumps(bm25_settings()),
            "ingested_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "tokenizer": TOKENIZER,
        }
        if report is not None:
            values["ingest_report"] = ingest_summary(report)
        # Sticky: once any version had an access list, every later one says so, so a publish
        # that drops the last list cannot open Datasette's raw views mid-flight (adr/0011).
        if conn.execute("SELECT 1 FROM documents WHERE acl IS NOT NULL LIMIT 1").fetchone():
            values["access_lists"] = "1"
        if "created_at" not in manifest:
            values["created_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"
            )
        if embedder is None:
            if not manifest.get("embedder"):
                values["embedder"] = "none"
        else:
            values.update(
                embedder=self._resolved_embedder,
                embedding_provider=embedder.provider,
                embedding_model=embedder.model_name,
                embedding_dimensions=str(embedder.dimensions),
            )
            length = embedding_max_length(embedder)
            if length is not None:
                values[MAX_LENGTH_KEY] = str(length)
            compute = embedding_compute(embedder)
            if compute is not None:
                values[COMPUTE_KEY] = compute
        conn.executemany(
            "INSERT INTO groundkit_manifest(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            list(values.items()),
        )

    def _finish(self, conn, vectors) -> None:
        self.progress({"event": "postings"})
        self._keep_postings(conn)
        self._mark("postings")
        if vectors is not None:
            version = vectors.commit()
            self.ann_action = vectors.index_action
            self._restrict_tree(lance_path(self.index_dir, self.name))
            conn.executemany(
                "INSERT INTO groundkit_manifest(key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                vectors.manifest_entries(),
            )
            self._mark("vectors")
        conn.execute("COMMIT")
        # Immutable readers ignore WAL content: leave a plain rollback-journal file.
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("PRAGMA optimize")
        self._mark("commit")

    def _keep_postings(self, conn) -> None:
        self.postings_rebuilt = keep_postings(conn, self._first_new_row,
                                              getattr(self, "_rebuild_postings", True))

    def _publish(self, work: Path) -> None:
        with open(work, "rb") as f:
            os.fsync(f.fileno())
        try:
            # A second name for the version being replaced, so that the rename does not free
            # its blocks (a large file takes a while); it is unlinked after the publish.
            os.link(self.path, self._retired)
        except OSError:
            pass
        os.replace(work, self.path)
        dir_fd = os.open(self.index_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def ingest(paths, *, collection: str, **options) -> IngestReport:
    """Convenience wrapper: ``ingest(["docs"], collection="docs", index_dir=".")``."""
    return Indexer(collection, **options).ingest(paths)


__all__ = ["Indexer", "IngestReport", "ingest", "IngestError"]
