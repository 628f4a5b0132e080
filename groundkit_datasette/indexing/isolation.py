"""Work on untrusted file formats in a child process with a memory and a time limit.

Parsing a PDF or an Office file, or rendering a PDF page, can take any amount of memory or time
on a hostile file (issue 33: a 30 KB spreadsheet that becomes 1.9 GB, a 1.3 KB PDF that pdfium
renders for two minutes). Run in a child, such a file costs its own job: the child is killed at
the deadline or fails at its address-space limit, and the ingest or the server goes on.

Two ways to run a call, both answering as JSON plus raw byte frames, never as a pickle, so a
parser the file compromised cannot make the parent run code:

- ``run_in_worker`` (extraction): a worker is a child interpreter started with ``subprocess``
  (safe from a threaded server, a daemonic Dask worker or a forked map-stage child alike) with
  the parsers imported and warmed up; it takes calls one at a time, each under its own limits,
  and is ended after any failure. A call costs a round trip, not a process.
- ``run_isolated`` (pdfium's renders, adr/0052): a fresh child per call from a fork server (a
  clean interpreter started once per process), reached by one datagram on a private socket pair
  carrying a fresh connection. The server reaps the child and sends its exit status last, so a
  call that returns has no child left behind (one that answered is killed if it lingers).

See adr/0050-isolated-extraction.md.
"""

from __future__ import annotations

import threading

from .isolation_child import ChildFailed, ChildOutOfMemory, ChildTimeout, in_child
from .isolation_server import run_isolated, server_pid
from .isolation_workers import end_workers, run_in_worker, worker_pids

__all__ = ["Busy", "ChildFailed", "ChildTimeout", "ChildOutOfMemory", "Slots", "in_child",
           "end_workers", "run_in_worker", "run_isolated", "server_pid", "worker_pids"]


class Busy(Exception):
    """Every slot is taken and the queue for one is full, or the wait ran out."""


class Slots:
    """At most ``running`` isolated calls at once (each may take its memory limit), and at most
    ``waiting`` callers waiting for one; past that, ``Busy`` at once, so no queue grows."""

    def __init__(self, running: int, waiting: int):
        self._free = threading.BoundedSemaphore(running)
        self._lock = threading.Lock()
        self._waiting = 0
        self.max_waiting = waiting

    def acquire(self, wait: float) -> None:
        if self._free.acquire(blocking=False):
            return
        with self._lock:
            if self._waiting >= self.max_waiting:
                raise Busy()
            self._waiting += 1
        try:
            if not self._free.acquire(timeout=max(0.0, wait)):
                raise Busy()
        finally:
            with self._lock:
                self._waiting -= 1

    def release(self) -> None:
        self._free.release()
