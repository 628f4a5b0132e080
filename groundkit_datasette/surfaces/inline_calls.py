"""Which calls run on the event loop instead of a worker thread (adr/0044).

Handing a call to a thread and back wakes two threads. On the 2-CPU virtual machine this
project is measured on, that costs 0.9-1.1 ms a request, five times a BM25 search of 6,000
chunks (0.2 ms). A call whose recent runs were all brief runs in the loop: it holds the loop
less than the hand-off would. Every run, in either place, updates the estimate, so a call
that becomes slow moves back to threads.

An average says nothing about the next request, so only searches whose cost is bounded by
their shape are eligible (:func:`search_key`): BM25 alone, a short query, a first page of
few hits, no filters, and source checks that stay on a local file system. A model, a long
query, a deep page or a network mount always goes to a thread.
"""

from __future__ import annotations

import asyncio
import threading
import time

# Longer than this on average and a call goes to a thread: about what the hand-off itself
# costs on the measuring machine, and far below what an event loop tolerates (asyncio's
# slow-callback warning starts at 100 ms).
BRIEF_SECONDS = 0.001
# Weight of the newest run in the moving average: one run 3 ms longer than a 0.2 ms average
# moves the call to threads; it needs a few quick runs there to come back.
NEWEST = 0.3
# Runs timed in a thread before a call may run in the loop: the first runs read cold pages.
WARM_RUNS = 3


# The request shapes eligible to run in place: what bounds the postings a search touches
# (its query's terms) and the hits it builds.
MAX_QUERY_CHARS = 64
MAX_HITS = 20
# Versions of collections remembered (a publish starts a new one, with cold caches).
MAX_KEYS = 256


def search_key(collection, request, sources_local: bool):
    """The key a search is timed under, or None when its shape must go to a thread."""
    mode = request.mode or ("bm25" if collection.embedding is None else None)
    if (mode != "bm25" or request.rerank or request.vector is not None or request.offset
            or request.top_k > MAX_HITS or request.source is not None or request.document_id is not None
            or request.group_by_document or len(request.query) > MAX_QUERY_CHARS or not sources_local):
        return None
    # Per published version: a new file at the same path is opened cold and warms again.
    return collection.path, collection.identity, request.top_k


class InlineCalls:
    """Per kind of call (a :func:`search_key`): how long its runs take."""

    def __init__(self):
        self._average: dict[object, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def brief(self, key) -> bool:
        found = self._average.get(key)
        return found is not None and found[1] >= WARM_RUNS and found[0] <= BRIEF_SECONDS

    def record(self, key, seconds: float) -> None:
        with self._lock:
            if key not in self._average and len(self._average) >= MAX_KEYS:
                del self._average[next(iter(self._average))]  # the oldest first
            average, runs = self._average.get(key, (seconds, 0))
            # The warm runs are not averaged: the last of them starts the average.
            average = seconds if runs < WARM_RUNS else average + NEWEST * (seconds - average)
            self._average[key] = (average, runs + 1)

    def _timed(self, key, fn):
        started = time.perf_counter()
        try:
            return fn()
        finally:
            self.record(key, time.perf_counter() - started)

    async def run(self, key, fn):
        """``fn()`` here if calls of ``key`` have been brief, else in a worker thread."""
        if self.brief(key):
            return self._timed(key, fn)
        return await asyncio.to_thread(self._timed, key, fn)
