"""The extraction workers behind ``run_in_worker`` (adr/0050-isolated-extraction.md).

A fresh child per call costs a fork, its copy-on-write faults and its teardown: 10-20 ms on
this machine, as much as parsing a small docx. Extraction runs in workers instead: a child
interpreter (started with subprocess, so it is nobody's fork) that takes calls one at a time,
each under its own limits: address space beyond what it holds when the call starts, CPU
seconds from then, and the caller's wall-clock kill. A worker that fails in any way (killed,
out of memory, crashed, an answer that does not parse) is ended and never used again; one
that has answered MAX_WORKER_CALLS calls, or grown by WORKER_GROWTH_BYTES, is retired.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import threading
import time

from .isolation_child import (EXIT_NO_MEMORY, REAP_SECONDS, ChildFailed, ChildOutOfMemory,
                              ChildTimeout, child_config, decode_answer, encode_call,
                              mark_child, preload, read_request, receive_answer, run_call,
                              send_frames, start_child)

# What a worker imports before its first call; it does the rest on its first calls, as needed
# (a folder of PDFs never imports python-docx), so it starts in a fraction of the time.
WORKER_PRELOAD = ("groundkit_datasette.indexing.extract",)
_abandoned: list = []

MAX_WORKER_CALLS = 500
WORKER_GROWTH_BYTES = 256 * 1024 * 1024
# How long a worker may take to start and import the parsers (not counted in a call's time).
WORKER_START_SECONDS = 60.0


class _Worker:
    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        os.set_inheritable(theirs.fileno(), True)
        try:
            self.process = start_child(f"{__name__}:_work",
                                       {"conn": theirs.fileno(), "preload": list(WORKER_PRELOAD)},
                                       pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        self.conn = ours
        self.calls = 0
        self.started = False  # said it is ready: its imports are done
        self.first_space: int | None = None
        self.owner = os.getpid()

    def call(self, request: list[bytes], names: dict, timeout: float):
        """One call; on any failure the worker is ended (and reaped) before this raises."""
        if not self.started:  # its imports first, outside the call's own time
            try:
                ready, _status = receive_answer(self.conn, time.monotonic() + WORKER_START_SECONDS)
            except (TimeoutError, OSError):
                ready = None
            self.started = True
            if ready != [b"ready"]:
                self.end()
                raise ChildFailed()
        deadline = time.monotonic() + timeout
        try:
            self.conn.settimeout(max(0.001, deadline - time.monotonic()))
            send_frames(self.conn, request)
            frames, _status = receive_answer(self.conn, deadline)
        except TimeoutError:
            self.end()
            raise ChildTimeout() from None
        except OSError:
            frames = None
        if frames is None:  # it died: how?
            status = self.end()
            if status == -signal.SIGXCPU:
                raise ChildTimeout()
            if status in (-signal.SIGKILL, EXIT_NO_MEMORY):
                raise ChildOutOfMemory()
            raise ChildFailed()
        self.calls += 1
        try:
            value, header = decode_answer(frames, names)
        except BaseException as exc:
            if not isinstance(exc, tuple(names.values())) or isinstance(exc, ChildFailed):
                self.end()  # out of memory, or an answer that does not parse: not used again
            raise
        space = header.get("address_space")
        if isinstance(space, int):
            if self.first_space is None:
                self.first_space = space
            elif space - self.first_space > WORKER_GROWTH_BYTES:
                self.calls = MAX_WORKER_CALLS  # retired on return
        return value

    def usable(self) -> bool:
        return (self.owner == os.getpid() and self.calls < MAX_WORKER_CALLS
                and self.process.poll() is None)

    def end(self) -> int | None:
        """Kill and reap it; its exit status (``-signal`` if killed)."""
        if self.owner != os.getpid():
            return None
        try:
            self.conn.close()
        except OSError:
            pass
        if self.process.poll() is None:
            try:
                self.process.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            return self.process.wait(timeout=REAP_SECONDS)
        except subprocess.TimeoutExpired:
            return None


_idle: list[_Worker] = []
_idle_lock = threading.Lock()
_idle_owner = [os.getpid()]
# Workers kept waiting between calls (a server runs at most Slots' count at once).
MAX_IDLE_WORKERS = 2


def run_in_worker(fn, *args, timeout: float, memory_bytes: int, passthrough=(), imports=()):
    """``fn(*args)`` as :func:`run_isolated` runs it (the same rules for ``fn``, its arguments,
    its answer and its exceptions), in a reusable worker: the limits are per call, and a
    worker is ended after any failure, so a hostile input costs its own call only. The modules
    in ``imports`` are imported first, outside the memory limit (a library's code is not the
    input's cost)."""
    names = {cls.__name__: cls for cls in passthrough}
    request = encode_call(fn, args, timeout, memory_bytes, imports)
    worker = None
    with _idle_lock:
        if _idle_owner[0] != os.getpid():  # a forked process: its parent's workers are not its own
            for inherited in _idle:
                inherited.conn.detach()
                _abandoned.append(inherited)
            _idle.clear()
            _idle_owner[0] = os.getpid()
        while _idle and worker is None:
            candidate = _idle.pop()
            if candidate.usable():
                worker = candidate
            else:
                candidate.end()
    if worker is None:
        worker = _Worker()
    try:
        value = worker.call(request, names, timeout)  # a failure has ended the worker
    except ChildFailed:
        raise
    except BaseException:  # an exception passed through: an answer, the worker is sound
        _return(worker)
        raise
    _return(worker)
    return value


def _return(worker: _Worker) -> None:
    with _idle_lock:
        if worker.usable() and len(_idle) < MAX_IDLE_WORKERS:
            _idle.append(worker)
            return
    worker.end()


def end_workers() -> None:
    """End this process's idle workers (the memory they hold goes back at once)."""
    with _idle_lock:
        idle = [w for w in _idle if w.owner == os.getpid()]
        _idle.clear()
    for worker in idle:
        worker.end()


def worker_pids() -> list[int]:
    """The idle workers' pids (for tests and diagnostics)."""
    with _idle_lock:
        return [w.process.pid for w in _idle if w.owner == os.getpid()]


def _work(config_json: str) -> None:
    """A worker's main loop: a call at a time until the connection ends."""
    import gc

    mark_child()
    config = child_config(config_json)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the caller's to act on
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    preload(config["preload"])
    gc.collect()
    conn = socket.socket(fileno=config["conn"])
    send_frames(conn, [b"ready"])
    while True:
        frames = read_request(conn)
        if frames is None:
            return
        answer, code = run_call(frames, hard_limits=False)
        if answer is not None:
            send_frames(conn, answer)
        if code:  # out of memory: its heap is not to be trusted with another call
            os._exit(code)
