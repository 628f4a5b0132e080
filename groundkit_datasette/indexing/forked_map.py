"""Ingest's map stage in forked child processes (adr/0046-forked-map-stage.md).

Reading, extracting and chunking files is about half of a BM25-only run (most of one over
Debian's HTML documentation), and the writer needs none of it done in its own process: on
another core it overlaps with writing the files before. Each child inherits the run's state
by ``fork`` and never touches the collection (it has no use for the SQLite connection it
inherits). Batches are dealt to the children in turn and taken back in the same turn, so the
writer sees them in walk order; each child's pipe bounds how far it runs ahead. Only a process
running no other Python thread forks: a thread holding a lock at the fork would leave the
child's copy of it held for ever.
"""

from __future__ import annotations

import fcntl
import logging
import os
import pickle
import signal
import sys
import threading
import warnings
from collections import deque
from multiprocessing.connection import Pipe

# Fewer files than this are done in process: the forks and pipes would cost more.
MIN_FILES = 64
# Items per batch (one message): enough that the work dominates a message's round trip.
BATCH = 32
# How far a child may run ahead of the writer: its pipe's buffer (Linux's default limit for an
# unprivileged process), then the messages taken in while the writer works.
PIPE_BYTES = 1 << 20
# Native libraries whose thread pools do not prepare for a fork (OpenBLAS, numpy's, does:
# it stops its threads around one). A process that has loaded one keeps the map stage local.
UNPREPARED = ("lancedb", "onnxruntime", "torch")
_MAX_FD = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536


class MapStageError(RuntimeError):
    """A map stage process ended without finishing."""


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def processes() -> int:
    """Children for a run: a core for the writer, the others for the map stage. (On two
    cores a second child, reniced or not, made text corpora slower: the writer is their
    slower side, and it waits on each child in turn; adr/0046.)"""
    return max(1, cpus() - 1)


def fork_safe() -> bool:
    """True when only this thread runs Python and no unprepared native pool is loaded."""
    return (threading.active_count() == 1 and threading.current_thread() is threading.main_thread()
            and not any(name in sys.modules for name in UNPREPARED))


def usable(files: int) -> bool:
    return hasattr(os, "fork") and files >= MIN_FILES and cpus() > 1 and fork_safe()


class _Collect(logging.Handler):
    """A child's log records, flattened to pickle and re-issued by the parent in order."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        record.msg = record.getMessage()
        record.args = None
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        self.records.append(record)


def _child(items, work, size: int, turn: int, children: int, writer) -> int:
    collect = _Collect()
    logging.root.handlers = [collect]  # the parent writes them; nothing is printed twice
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):
            logger.handlers = []

    def send(kind, payload):
        writer.send_bytes(pickle.dumps((kind, payload, collect.records), protocol=5))
        collect.records = []

    try:
        batch, number = [], 0
        for item in items:
            batch.append(item)
            if len(batch) >= size:
                if number % children == turn:
                    send("ok", work(batch))
                batch, number = [], number + 1
        if batch and number % children == turn:
            send("ok", work(batch))
        send("end", None)
        return 0
    except BrokenPipeError:
        return 1  # the parent stopped listening: its run failed or was closed
    except BaseException as exc:  # re-raised by the parent, as a local run would have
        try:
            send("error", exc)
        except Exception:
            send("error", MapStageError(f"the map stage failed: {type(exc).__name__}"))
        return 1


def run(items, work, size: int = BATCH, children: int = 1):
    """Yield ``work(batch)`` for consecutive batches of ``size`` of ``items``, in order,
    computed by ``children`` forked processes. Closing the generator early (the run failed)
    stops them."""
    readers, pids = [], []
    finished = False
    try:
        for turn in range(children):
            reader, writer = Pipe(duplex=False)
            _widen(writer.fileno())
            with warnings.catch_warnings():  # 3.12+ warns of OpenBLAS's threads (fork_safe)
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:  # a child: never returns
                code = 1
                try:
                    _close_inherited(writer.fileno())
                    code = _child(items, work, size, turn, children, writer)
                finally:
                    try:
                        sys.stderr.flush()
                    finally:
                        os._exit(code)
            writer.close()
            readers.append(reader)
            pids.append(pid)
        inboxes = [deque() for _ in readers]
        number = 0
        while True:
            turn = number % children
            reader, inbox = readers[turn], inboxes[turn]
            if not inbox:
                inbox.append(_receive(reader))
            message = inbox.popleft()
            # Take in whatever else has arrived, so the children's next writes find room in
            # their pipes while this process writes (a reader thread would instead make them
            # wait for the GIL on every read: 5 ms at a time while the writer runs).
            for other, waiting in zip(readers, inboxes):
                while other.poll(0):  # readable: a message, or the child's end after its last
                    try:
                        waiting.append(other.recv_bytes())
                    except (EOFError, OSError):
                        break
            kind, payload, records = pickle.loads(message)
            for record in records:
                logging.getLogger(record.name).handle(record)
            if kind == "error":
                raise payload
            if kind == "end":  # this turn's child has no batch ``number``: nor has anyone
                finished = True
                return
            yield payload
            number += 1
    finally:
        for reader in readers:
            reader.close()
        for pid in pids:
            if not finished:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os.waitpid(pid, 0)


def _close_inherited(keep: int) -> None:
    """Close every descriptor but stdio and ``keep``: the writer's lock, its private copy and
    the other children's pipes must not outlive the writer in a child (a killed ingest's
    lock would stay held until its children ended)."""
    os.closerange(3, keep)
    os.closerange(keep + 1, _MAX_FD)



def _receive(reader) -> bytes:
    try:
        return reader.recv_bytes()
    except (EOFError, OSError):
        raise MapStageError("a map stage process ended before finishing") from None


def _widen(fd: int) -> None:
    """Let the pipe hold PIPE_BYTES (Linux; elsewhere, or past the system's limit, as it is)."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (AttributeError, OSError):
        pass
