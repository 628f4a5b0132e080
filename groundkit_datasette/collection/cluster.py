"""Ingest's map stage on a Dask distributed cluster (``groundkit ingest --cluster ADDRESS``).

The calling process stays the one writer (adr/0002): it walks the files, skips the unchanged
ones, and applies every result to its private copy in walk order, then publishes. Only the
work in between goes to the cluster: batches of files (about ``BATCH_CHUNKS`` chunks' worth of
bytes) are extracted, chunked and embedded on the workers. Results come back in the order the
files were read, so the writer issues the same statements as a local run and publishes the
same file (tests/test_cluster.py). Why Dask and not Ray: adr/0029-distributed-ingest.md.

Dask reschedules a batch whose worker died; a batch that still fails (the scheduler gives up
after ``distributed.scheduler.allowed-failures`` deaths, or the task raised) costs only its
documents, reported as failed files. If this process dies, nothing is published.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import deque

import numpy as np

from ..errors import InvalidRequest
from .ingest import Outcome, _Prepared, document_id_for, embedding_text, prepare_document

log = logging.getLogger(__name__)

# Chunks of work per task: enough to amortise a task's round trip (tens of ms) against the
# embedding (about a second on one CPU), few enough that a lost worker loses little.
BATCH_CHUNKS = 64
INSTALL_HINT = "pip install 'groundkit-datasette[cluster]'"


class ClusterError(InvalidRequest):
    """The cluster cannot be used (engine not installed, unreachable, no workers)."""

    kind = "invalid_cluster"


def _client_class():
    try:
        from distributed import Client
    except ImportError:
        raise ClusterError(
            f"--cluster needs Dask distributed, which is not installed; install it with: {INSTALL_HINT}"
        ) from None
    return Client


# -- on a worker -------------------------------------------------------------

_EMBEDDERS: dict = {}


def _embedder(name: str, options: dict):
    """One embedder per worker process and setting: the ONNX model loads once, on first use."""
    from ..embedding.embedders import get_embedder

    key = (name, json.dumps(options, sort_keys=True))
    if key not in _EMBEDDERS:
        _EMBEDDERS[key] = get_embedder(name, **options)
    return _EMBEDDERS[key]


def process_batch(jobs, have, settings) -> list:
    """Extract, chunk and embed ``jobs``; ``have[i]``: chunk ids of job i that already have a
    vector (not embedded again). One result per job: a document (``_Prepared`` with the new
    vectors) or an ``Outcome``. An embedding failure fails the batch's documents, as locally."""
    chunk_size, chunk_overlap, embedder_name, embedder_options = settings
    results = [prepare_document(job, chunk_size, chunk_overlap) for job in jobs]
    if embedder_name is None:
        return results
    texts, owners = [], []
    for result, known in zip(results, have):
        if isinstance(result, _Prepared):
            result.vectors = {}
            known = set(known)
            for chunk, cid in zip(result.chunks, result.chunk_ids):
                if cid not in known:
                    texts.append(embedding_text(chunk.heading, chunk.text))
                    owners.append((result, cid))
    try:
        embedded = _embedder(embedder_name, embedder_options).embed(texts) if texts else []
    except Exception as exc:
        log.error("embedding failed for %d chunks: %s", len(texts), exc)
        return [Outcome(False, "embedding failed") if isinstance(r, _Prepared) else r for r in results]
    for (result, cid), vector in zip(owners, embedded):
        result.vectors[cid] = np.asarray(vector, dtype=np.float32)
    return results


# -- on the calling machine --------------------------------------------------


class ClusterMap:
    """A map stage for ``Indexer(map_stage=...)`` that runs on the cluster at ``address``.

    >>> with ClusterMap("tcp://10.0.0.5:8786") as stage:
    ...     Indexer("docs", index_dir="index", map_stage=stage).ingest(["corpus"])
    """

    def __init__(self, address: str, *, batch_chunks: int = BATCH_CHUNKS, window: int | None = None,
                 timeout: float = 20):
        Client = _client_class()
        try:
            self.client = Client(address, timeout=timeout, set_as_default=False)
        except Exception as exc:
            raise ClusterError(f"cannot reach the cluster's scheduler ({type(exc).__name__})") from None
        workers = self.client.scheduler_info().get("workers", {})
        threads = sum(w.get("nthreads", 1) for w in workers.values())
        if not workers:
            try:
                self.client.wait_for_workers(1, timeout=timeout)
            except Exception:
                self.client.close()
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
        # future key -> what it was sent, for the one retry of a batch lost with a worker.
        self._sent: dict = {}

    def close(self) -> None:
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __call__(self, jobs, indexer, vectors):
        embedder = getattr(indexer, "_resolved_embedder", None) if vectors is not None else None
        settings = (indexer.chunk_size, indexer.chunk_overlap, embedder,
                    dict(indexer.embedder_options) if embedder else {})
        target_bytes = self.batch_chunks * indexer.chunk_size
        slots: deque = deque()  # [job] (nothing to do) or [jobs, future] in walk order
        open_batch: list | None = None
        open_bytes = 0
        running = 0

        def send():
            nonlocal open_batch, open_bytes, running
            batch = open_batch
            payload = [dataclasses.replace(job) for job in batch[0]]
            have = [sorted(vectors.by_document.get(document_id_for(job.source), ()))
                    if vectors is not None else [] for job in payload]
            batch[1] = self.client.submit(process_batch, payload, have, settings, pure=False)
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
                yield from zip(head[0], self._results(head[0], future))

        try:
            for job in jobs:
                if not job.work:
                    slots.append([job])
                else:
                    if open_batch is None:
                        open_batch = [[], None]
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
                if len(slot) == 2 and slot[1] is not None:
                    slot[1].cancel()

    def _results(self, jobs, future) -> list:
        sent = self._sent.pop(future.key, None)
        while True:
            try:
                results = future.result()
            except Exception as exc:
                future.release()
                if sent is not None and type(exc).__name__ == "KilledWorker":
                    # A worker that dies takes the batches running beside the one that killed
                    # it; sent again on its own, only the batch that kills workers is lost.
                    future = self.client.submit(process_batch, *sent, pure=False)
                    sent = None
                    self.batches_retried += 1
                    continue
                return self._failed(jobs, type(exc).__name__)
            future.release()
            if len(results) != len(jobs):
                return self._failed(jobs, "a batch returned the wrong number of results")
            return results

    def _failed(self, jobs, why: str) -> list:
        self.batches_failed += 1
        log.error("a cluster batch of %d files failed: %s", len(jobs), why)
        return [Outcome(False, "cluster batch failed") for _ in jobs]
