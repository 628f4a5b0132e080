"""Ingest's map stage on a Dask distributed cluster (``groundkit ingest --cluster ADDRESS``).

The calling process stays the one writer (adr/0002): it walks the files, skips the unchanged
ones, and applies every result to its private copy in walk order, then publishes. Only the
work in between goes to the cluster: batches of files (about ``BATCH_CHUNKS`` chunks' worth of
bytes) are extracted, chunked and embedded on the workers. Results come back in the order the
files were read, so the writer issues the same statements as a local run and publishes the
same file (tests/test_cluster.py). Why Dask and not Ray: adr/0029-distributed-ingest.md.

The workers are not trusted (adr/0048-cluster-workers-are-untrusted.md). A worker is sent a
file's name, hash and bytes, and sends back plain data only: the extracted text, chunk offsets
and headings, and float32 vectors as raw bytes. Everything else the writer stores (source,
document id, file hash, access list, size, mtime, content hash, extractor identity, line and
page numbers, chunk ids) comes from its own job record or is computed here from that text. A
result that disagrees with the record or breaks the chunker's rules fails its document. The
Dask client accepts only msgpack from workers, and while a ``ClusterMap`` is open this process
refuses to unpickle anything but plain builtin data (an audit hook), because Dask itself
unpickles some messages (task errors, result types) whatever the client's settings. Only
``tls://`` with certificates is accepted unless the caller says ``insecure``.

Dask reschedules a batch whose worker died; a batch that still fails (the scheduler gives up
after ``distributed.scheduler.allowed-failures`` deaths, or the task raised) is sent once more
on its own, then costs only its documents, reported as failed files. If this process dies,
nothing is published.
"""

from __future__ import annotations

import codecs
import json
import logging
import os
import pickle
import re
import sys
import threading
from bisect import bisect_left
from collections import deque

import numpy as np

from ..errors import InvalidRequest
from .chunking import Chunk, chunk_text
from .extract import MAX_TEXT_CHARS, Skipped, extract_bytes, extractor_available, extractor_for
from .prepared import (Outcome, Prepared, chunk_ids_for, document_id_for, embedding_text, prepared_from,
                       source_suffix)

log = logging.getLogger(__name__)

# Chunks of work per task: enough to amortise a task's round trip (tens of ms) against the
# embedding (about a second on one CPU), few enough that a lost worker loses little.
BATCH_CHUNKS = 64
INSTALL_HINT = "pip install 'groundkit-datasette[cluster]'"
# What a worker may report as its reason for skipping a file: short, one line.
MAX_REASON_CHARS = 200
# Keys of a worker's answer for one file: a document, or a skip, or a failure.
DOCUMENT_KEYS = frozenset({"source", "file_hash", "text", "title", "extractor", "extractor_version",
                           "encoding", "pages", "chunks", "vectors"})
SKIPPED_KEYS = frozenset({"source", "file_hash", "skipped"})
FAILED_KEYS = frozenset({"source", "file_hash", "failed"})
# Failure reasons a worker may report; any other is reported as the last one.
WORKER_FAILURES = ("extraction failed", "embedding failed", "worker failed")


class ClusterError(InvalidRequest):
    """The cluster cannot be used (engine not installed, unreachable, no workers, insecure)."""

    kind = "invalid_cluster"


def _client_class():
    try:
        from distributed import Client
    except ImportError:
        raise ClusterError(
            f"--cluster needs Dask distributed, which is not installed; install it with: {INSTALL_HINT}"
        ) from None
    return Client


def tls_security(ca_file: str, cert_file: str, key_file: str | None = None):
    """Dask ``Security`` for a ``tls://`` cluster: this machine's client certificate and key, and
    the cluster's CA (the scheduler and workers must present certificates it signed)."""
    try:
        from distributed.security import Security
    except ImportError:
        raise ClusterError(
            f"--cluster needs Dask distributed, which is not installed; install it with: {INSTALL_HINT}"
        ) from None
    for what, path in (("CA certificate", ca_file), ("client certificate", cert_file),
                       ("client key", key_file)):
        if path is not None and not os.access(path, os.R_OK):
            raise ClusterError(f"the cluster's {what} file cannot be read: {path}")
    return Security(tls_ca_file=ca_file, tls_client_cert=cert_file, tls_client_key=key_file,
                    require_encryption=True)


def _checked_security(address: str, security, insecure: bool):
    """The ``Security`` to connect with, or a ClusterError saying why the address is refused."""
    scheme = address.split("://", 1)[0].lower() if "://" in address else "tcp"
    if scheme == "tls":
        if security is None:
            from distributed.security import Security

            security = Security()  # Dask's own distributed.comm.tls settings, if any
        if not (getattr(security, "tls_ca_file", None) and getattr(security, "tls_client_cert", None)):
            raise ClusterError(
                "a tls:// cluster needs its CA certificate and this machine's client certificate: "
                "give --cluster-tls-ca, --cluster-tls-cert and --cluster-tls-key (or Dask's "
                "distributed.comm.tls settings); see docs/scaling.md")
        return security
    if scheme == "tcp":
        if not insecure:
            raise ClusterError(
                "refusing a tcp:// cluster: it is neither encrypted nor authenticated, so anyone who "
                "can reach the scheduler can run code on the workers and feed this ingest; use "
                "tls:// with certificates (docs/scaling.md), or --cluster-insecure on a network you trust")
        return security
    raise ClusterError(f"unsupported cluster address scheme {scheme!r}: use tls:// (or tcp:// with "
                       "--cluster-insecure)")


# -- no unpickling while a cluster is open ------------------------------------
#
# Dask's client unpickles what the scheduler relays from workers in places no client setting
# reaches: a failed task's exception and traceback, a finished task's result type, and any
# message part marked as pickled. Each of those needs pickle's find_class for anything that
# could run code, and find_class raises an audit event first, so an audit hook can refuse it.
# Plain builtin data (what msgpack also carries) stays allowed.

PLAIN_GLOBALS = frozenset(("builtins", name) for name in (
    "list", "dict", "set", "frozenset", "tuple", "bytes", "bytearray", "str", "int", "float"))


class UnpicklingRefused(pickle.UnpicklingError, TypeError):
    """An unpickling in this process named a global while a cluster map was open.

    A TypeError too: Dask treats one as "could not deserialize" where it expects that."""


_guard_lock = threading.Lock()
_guard = {"installed": False, "open": 0, "refused": 0}


def _audit(event, args):
    if event == "pickle.find_class" and _guard["open"] and (args[0], args[1]) not in PLAIN_GLOBALS:
        _guard["refused"] += 1
        raise UnpicklingRefused(f"refused to unpickle {args[0]}.{args[1]} while a cluster map is open")


def _open_guard() -> None:
    with _guard_lock:
        if not _guard["installed"]:
            sys.addaudithook(_audit)  # for the process's life; idle while no map is open
            _guard["installed"] = True
        _guard["open"] += 1


def _close_guard() -> None:
    with _guard_lock:
        _guard["open"] = max(0, _guard["open"] - 1)


def unpicklings_refused() -> int:
    """How many unpicklings the guard refused in this process so far."""
    return _guard["refused"]


# -- on a worker -------------------------------------------------------------

_EMBEDDERS: dict = {}


def _embedder(name: str, options: dict):
    """One embedder per worker process and setting: the ONNX model loads once, on first use."""
    from ..embedding.embedders import get_embedder

    key = (name, json.dumps(options, sort_keys=True))
    if key not in _EMBEDDERS:
        _EMBEDDERS[key] = get_embedder(name, **options)
    return _EMBEDDERS[key]


def _extract_for_wire(source: str, file_hash: str, data: bytes, chunk_size: int, chunk_overlap: int,
                      title_header: bool) -> tuple[dict, list]:
    """One file's answer as plain data, and its chunks (for the embedding)."""
    head = {"source": source, "file_hash": file_hash}
    try:
        extracted = extract_bytes(data, source_suffix(source))
    except Skipped as skip:
        return {**head, "skipped": skip.reason}, []
    except Exception as exc:
        log.error("extraction failed for %s: %s", source, type(exc).__name__)
        return {**head, "failed": "extraction failed"}, []
    chunks = chunk_text(extracted.text, source_class=extracted.source_class, chunk_size=chunk_size,
                        chunk_overlap=chunk_overlap, title=extracted.title if title_header else None)
    return {**head, "text": extracted.text, "title": extracted.title, "extractor": extracted.extractor,
            "extractor_version": extracted.extractor_version, "encoding": extracted.encoding,
            "pages": list(extracted.page_starts), "chunks": [[c.start, c.end, c.heading] for c in chunks],
            "vectors": None}, chunks


def process_batch(jobs, have, settings) -> list:
    """Extract, chunk and embed ``jobs`` (``[source, file_hash, bytes]`` each); ``have[i]``: chunk
    ids of job i that already have a vector (not embedded again). One plain dict per job (see
    ``_extract_for_wire``), with ``vectors``: the new chunks' float32 vectors, little-endian, in
    chunk order. An embedding failure fails the batch's documents, as locally."""
    chunk_size, chunk_overlap, title_header, embedder_name, embedder_options = settings
    answers, texts, owners = [], [], []
    for (source, file_hash, data), known in zip(jobs, have):
        answer, chunks = _extract_for_wire(source, file_hash, data, chunk_size, chunk_overlap, title_header)
        answers.append(answer)
        if embedder_name is None or "text" not in answer:
            continue
        known = set(known)
        ids = chunk_ids_for(document_id_for(source), chunks)
        mine = [embedding_text(ch.heading, ch.text) for ch, cid in zip(chunks, ids) if cid not in known]
        texts.extend(mine)
        owners.append((answer, len(mine)))
    if embedder_name is None:
        return answers
    try:
        embedded = _embedder(embedder_name, embedder_options).embed(texts) if texts else []
    except Exception as exc:
        log.error("embedding failed for %d chunks: %s", len(texts), exc)
        return [{"source": a["source"], "file_hash": a["file_hash"], "failed": "embedding failed"}
                if "text" in a else a for a in answers]
    start = 0
    for answer, count in owners:
        block = np.asarray(embedded[start:start + count], dtype="<f4")
        answer["vectors"] = block.tobytes()
        start += count
    return answers


# -- on the calling machine: what a worker's answer may say -------------------


class Rejected(Exception):
    """A worker's answer for one file disagrees with the writer's record or the chunker's rules."""


def _expected_extractor(source: str) -> tuple[str | None, str | None]:
    """(source class, extractor name) this machine would use for ``source``: None, None if refused."""
    extractor = extractor_for(source_suffix(source))
    if extractor is None:
        return None, None
    return extractor.source_class, extractor.name


_NEWLINE = re.compile("\n")


def _int(value) -> int:
    if type(value) is not int:
        raise Rejected("offsets")
    return value


def _chunks(text: str, wire, chunk_size: int, chunk_overlap: int) -> list[Chunk]:
    """The chunks a worker described as ``[start, end, heading]``, held to the chunker's rules:
    inside the text, starts increasing, no longer than ``chunk_size``, overlapping the previous
    chunk by at most ``chunk_overlap``. Their text is cut here from the text."""
    if not isinstance(wire, (list, tuple)):
        raise Rejected("chunks")
    newlines = [m.start() for m in _NEWLINE.finditer(text)]
    out, last_start, last_end = [], -1, 0
    for i, item in enumerate(wire):
        if not isinstance(item, (list, tuple)) or len(item) != 3 or not isinstance(item[2], str):
            raise Rejected("chunks")
        a, b, heading = _int(item[0]), _int(item[1]), item[2]
        if not (0 <= a < b <= len(text)) or b - a > chunk_size or a <= last_start or a < last_end - chunk_overlap:
            raise Rejected("chunk offsets")
        out.append(Chunk(index=i, start=a, end=b, line_start=bisect_left(newlines, a) + 1,
                         line_end=bisect_left(newlines, b - 1) + 1, heading=heading, text=text[a:b]))
        last_start, last_end = a, b
    return out


def accept(job, answer, settings, have=(), dimensions: int | None = None) -> Prepared | Outcome:
    """The writer's document for ``job`` from a worker's ``answer``, or an Outcome.

    Source, document id, file hash, access list, size and mtime are the job's; the content hash,
    counts, line and page numbers and chunk ids are computed here; the extractor must be the one
    this machine would use for the file, at the version it would record. With ``dimensions``, the
    answer must carry exactly one finite vector per chunk not in ``have``. Raises Rejected."""
    chunk_size, chunk_overlap = settings[0], settings[1]
    if not isinstance(answer, dict):
        raise Rejected("not a record")
    if answer.get("source") != job.source:
        raise Rejected("source")
    if answer.get("file_hash") != job.file_hash:
        raise Rejected("file hash")
    keys = answer.keys()
    if keys == SKIPPED_KEYS:
        reason = answer["skipped"]
        if not (isinstance(reason, str) and 0 < len(reason) <= MAX_REASON_CHARS and reason.isprintable()):
            raise Rejected("skip reason")
        return Outcome(True, reason)
    if keys == FAILED_KEYS:
        reason = answer["failed"]
        return Outcome(False, reason if reason in WORKER_FAILURES else WORKER_FAILURES[-1])
    if keys != DOCUMENT_KEYS:
        raise Rejected("fields")
    text, title, encoding = answer["text"], answer["title"], answer["encoding"]
    # Over the extraction budget a local run skips the file; a worker cannot make this one hold more.
    if (not isinstance(text, str) or len(text) > MAX_TEXT_CHARS
            or not (title is None or isinstance(title, str))):
        raise Rejected("text")
    source_class, extractor = _expected_extractor(job.source)
    version = answer["extractor_version"]
    if (extractor is None or answer["extractor"] != extractor or not isinstance(version, str)
            or not extractor_available(extractor, version)):
        raise Rejected("extractor")
    if encoding is not None:
        if extractor not in ("text", "html") or not isinstance(encoding, str) or len(encoding) > 64:
            raise Rejected("encoding")
        try:
            codecs.lookup(encoding)
        except LookupError:
            raise Rejected("encoding") from None
    pages = answer["pages"]
    if (not isinstance(pages, (list, tuple)) or (pages and extractor != "pypdf")
            or any(type(p) is not int or not 0 <= p <= len(text) for p in pages)
            or any(a > b for a, b in zip(pages, pages[1:]))):
        raise Rejected("pages")
    pages = tuple(pages)
    chunks = _chunks(text, answer["chunks"], chunk_size, chunk_overlap)
    prepared = prepared_from(job, text, title, pages, chunks, (source_class, extractor, version, encoding))
    if dimensions is not None:
        wanted = [cid for cid in prepared.chunk_ids if cid not in have]
        blob = answer["vectors"]
        if not isinstance(blob, (bytes, bytearray)) or len(blob) != 4 * dimensions * len(wanted):
            raise Rejected("vectors")
        block = np.frombuffer(blob, dtype="<f4").astype(np.float32).reshape(len(wanted), dimensions)
        if not np.isfinite(block).all():
            raise Rejected("vectors")
        prepared.vectors = {cid: block[i] for i, cid in enumerate(wanted)}
    elif answer["vectors"] is not None:
        raise Rejected("vectors")
    return prepared


# -- on the calling machine --------------------------------------------------


class ClusterMap:
    """A map stage for ``Indexer(map_stage=...)`` that runs on the cluster at ``address``.

    >>> security = tls_security("ca.pem", "client.pem", "client-key.pem")
    >>> with ClusterMap("tls://10.0.0.5:8786", security=security) as stage:
    ...     Indexer("docs", index_dir="index", map_stage=stage).ingest(["corpus"])

    ``tcp://`` is refused unless ``insecure=True``. While the map is open, this process refuses
    to unpickle anything but plain builtin data (see the module's docstring).
    """

    def __init__(self, address: str, *, security=None, insecure: bool = False,
                 batch_chunks: int = BATCH_CHUNKS, window: int | None = None, timeout: float = 20):
        Client = _client_class()
        security = _checked_security(address, security, insecure)
        _open_guard()  # before the first message from the scheduler is read
        self._guarded = True
        try:
            # Results come through the scheduler (this machine connects to nothing else), which
            # asks the workers for msgpack on our behalf; a pickled answer is refused, not loaded.
            self.client = Client(address, security=security, timeout=timeout, set_as_default=False,
                                 deserializers=["msgpack"], direct_to_workers=False)
        except Exception as exc:
            self._guarded = False
            _close_guard()
            raise ClusterError(f"cannot reach the cluster's scheduler ({type(exc).__name__})") from None
        workers = self.client.scheduler_info().get("workers", {})
        threads = sum(w.get("nthreads", 1) for w in workers.values())
        if not workers:
            try:
                self.client.wait_for_workers(1, timeout=timeout)
            except Exception:
                self.close()
                raise ClusterError("the cluster has no workers") from None
            threads = 1
        self.batch_chunks = batch_chunks
        # Batches in flight at once: every worker thread busy, one more queued each, bounded
        # so the files read ahead stay a few batches' worth.
        self.window = window or max(2, 2 * threads)
        self.documents_sent = 0
        self.batches_sent = 0
        self.batches_failed = 0
        self.batches_retried = 0
        # Documents failed because a worker's answer disagreed with the writer's record.
        self.documents_rejected = 0
        # future key -> what it was sent, for the one retry of a failed batch.
        self._sent: dict = {}

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            if getattr(self, "_guarded", False):
                self._guarded = False
                _close_guard()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __call__(self, jobs, indexer, vectors):
        embedder = indexer.bound_embedder if vectors is not None else None
        settings = (indexer.chunk_size, indexer.chunk_overlap, indexer.title_header,
                    embedder, dict(indexer.embedder_options) if embedder else {})
        dimensions = vectors.dimensions if embedder else None
        target_bytes = self.batch_chunks * indexer.chunk_size
        slots: deque = deque()  # [job] (nothing to do) or [jobs, future, have] in walk order
        open_batch: list | None = None
        open_bytes = 0
        running = 0

        def send():
            nonlocal open_batch, open_bytes, running
            batch = open_batch
            payload = [[job.source, job.file_hash, job.data] for job in batch[0]]
            have = [sorted(vectors.by_document.get(document_id_for(job.source), ()))
                    if embedder else [] for job in batch[0]]
            batch[1] = self.client.submit(process_batch, payload, have, settings, pure=False)
            batch[2] = [frozenset(h) for h in have]
            self._sent[batch[1].key] = (payload, have, settings)
            for job in batch[0]:
                job.data = None  # the payload keeps the bytes until the task has them
            self.documents_sent += len(payload)
            self.batches_sent += 1
            running += 1
            open_batch, open_bytes = None, 0

        def ready(final: bool):
            """Yield from the head while its results are in, or must be waited for."""
            nonlocal running
            while slots:
                head = slots[0]
                if len(head) == 1:
                    slots.popleft()
                    yield head[0], None
                    continue
                future = head[1]
                if future is None or not (final or running >= self.window or future.done()):
                    return
                slots.popleft()
                running -= 1
                answers = self._results(head[0], future)
                yield from zip(head[0], self._accepted(head[0], answers, head[2], settings, dimensions))

        try:
            for job in jobs:
                if not job.work:
                    slots.append([job])
                else:
                    if open_batch is None:
                        open_batch = [[], None, None]
                        slots.append(open_batch)
                    open_batch[0].append(job)
                    open_bytes += len(job.data)
                    if open_bytes >= target_bytes:
                        send()
                yield from ready(False)
            if open_batch is not None:
                send()
            yield from ready(True)
        finally:
            for slot in slots:
                if len(slot) == 3 and slot[1] is not None:
                    slot[1].cancel()

    def _accepted(self, jobs, answers, haves, settings, dimensions) -> list:
        if answers is None:
            return [Outcome(False, "cluster batch failed") for _ in jobs]
        out = []
        for job, answer, have in zip(jobs, answers, haves):
            try:
                out.append(accept(job, answer, settings, have, dimensions))
            except Rejected as why:
                self.documents_rejected += 1
                log.warning("a cluster worker's answer for %s was rejected (%s); the document is "
                            "not published", job.source, why)
                out.append(Outcome(False, f"cluster result rejected: {why}"))
        return out

    def _results(self, jobs, future):
        """The batch's answers (one per job), or None when the batch failed."""
        sent = self._sent.pop(future.key, None)
        while True:
            try:
                results = future.result()
            except Exception as exc:
                future.release()
                if sent is not None:
                    # A worker that dies takes the batches running beside the one that killed
                    # it; sent again on its own, only the batch that kills workers is lost. (The
                    # error's type is not known here: its pickle is refused.)
                    future = self.client.submit(process_batch, *sent, pure=False)
                    sent = None
                    self.batches_retried += 1
                    continue
                return self._failed(jobs, type(exc).__name__)
            future.release()
            if not isinstance(results, (list, tuple)) or len(results) != len(jobs):
                return self._failed(jobs, "a batch returned the wrong number of results")
            return results

    def _failed(self, jobs, why: str):
        self.batches_failed += 1
        log.error("a cluster batch of %d files failed: %s", len(jobs), why)
        return None
