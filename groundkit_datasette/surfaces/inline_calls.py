"""Which calls run on the event loop instead of a worker thread (adr/0044).

Handing a call to a thread and back wakes two threads. On the 2-CPU virtual machine this
project is measured on, that costs 0.9-1.1 ms a request, five times a BM25 search of 6,000
chunks (0.2 ms). A call whose recent runs were all brief runs in the loop: it holds the loop
less than the hand-off would. Anything slower (a model embedding a query, a large collection,
a cold page cache) keeps going to a thread. Every run, in either place, updates the estimate,
so a call that becomes slow moves back to threads.
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


class InlineCalls:
    """Per kind of call (a collection and a search mode, say): how long its runs take."""

    def __init__(self):
        self._average: dict[object, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def brief(self, key) -> bool:
        found = self._average.get(key)
        return found is not None and found[1] >= WARM_RUNS and found[0] <= BRIEF_SECONDS

    def record(self, key, seconds: float) -> None:
        with self._lock:
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
