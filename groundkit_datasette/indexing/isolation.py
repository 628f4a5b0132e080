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

import importlib
import json
import os
import resource
import secrets
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

__all__ = ["Busy", "ChildFailed", "ChildTimeout", "ChildOutOfMemory", "Slots", "in_child",
           "end_workers", "run_in_worker", "run_isolated", "server_pid", "worker_pids"]

# What the fork server imports once, so each child starts with the parsers loaded.
# ("module:function" also calls the function once, after the import.) The fork server's
# children all inherit what it did; a worker does the rest on its first calls, as needed (a
# folder of PDFs never imports python-docx), so it starts in a fraction of the time.
PRELOAD = ("groundkit_datasette.indexing.extract", "pypdf", "pypdfium2", "docx", "pptx",
           "openpyxl", "groundkit_datasette.indexing.extract:warm_up")
WORKER_PRELOAD = ("groundkit_datasette.indexing.extract",)
# An answer larger than this is refused (the text budget keeps real ones far below).
MAX_ANSWER_BYTES = 512 * 1024 * 1024
# After a kill, how long to wait for the server to report the child reaped.
REAP_SECONDS = 10.0
_FRAME = struct.Struct("<Q")
_STATUS = 1 << 63  # the length field that marks the server's status frame
_RESERVE_BYTES = 4 * 1024 * 1024
_EXIT_NO_MEMORY = 75  # a child with no memory left even to say so
_MAX_DATAGRAM = 4096


class ChildFailed(Exception):
    """The child did not return an answer (crashed, or raised an exception not passed through)."""

    reason = "failed"


class ChildTimeout(ChildFailed):
    reason = "timed out"


class ChildOutOfMemory(ChildFailed):
    reason = "out of memory"


def run_isolated(fn, *args, timeout: float, memory_bytes: int, passthrough=()):
    """``fn(*args)`` in a child allowed ``memory_bytes`` of address space beyond what it holds
    when the call starts, and ``timeout`` seconds of wall time (it is killed then).

    ``fn`` must be a module-level function taking and returning plain data: ``None``, ``bool``,
    numbers, ``str``, ``bytes`` (anywhere), and lists/tuples/dicts of those (tuples come back
    as lists). An exception raised in the child whose class is in ``passthrough`` is raised
    here again, built from its first argument (a message, e.g. ``Skipped``'s reason);
    ``MemoryError`` (or the kernel's OOM kill) is ``ChildOutOfMemory``; the deadline is
    ``ChildTimeout``; anything else is ``ChildFailed``. When this returns or raises, the
    child is gone (reaped by the server).
    """
    names = {cls.__name__: cls for cls in passthrough}
    request = _encode_call(fn, args, timeout, memory_bytes)
    deadline = time.monotonic() + timeout
    token = secrets.token_hex(8)
    conn = _server().start(token)
    killed = False
    status = None
    frames = None
    try:
        try:
            conn.settimeout(max(0.001, deadline - time.monotonic()))
            _send_frames(conn, request)
            frames, status = _receive_answer(conn, deadline)
        except TimeoutError:  # socket.timeout
            frames = None
            _server().kill(token)
            killed = True
        except OSError:  # the child closed its end: it died
            frames = None
        if frames is not None:
            _server().kill(token)  # answered: a child that lingers (compromised) is not waited on
        if status is None:
            status = _wait_reaped(conn)  # what became of it, and that it is gone
    finally:
        conn.close()
    if killed:
        raise ChildTimeout()
    if frames is None:
        if status == -signal.SIGXCPU:  # the CPU backstop (a child the deadline did not reach)
            raise ChildTimeout()
        if status in (-signal.SIGKILL, _EXIT_NO_MEMORY):  # not ours: the kernel's OOM killer
            raise ChildOutOfMemory()
        raise ChildFailed()
    return _decode_answer(frames, names)[0]


def _encode_call(fn, args, timeout: float, memory_bytes: int, imports=()) -> list[bytes]:
    """The request frames: which function (by module and name), its arguments, the limits."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if (not module or module == "__main__" or not name.isidentifier()
            or getattr(sys.modules.get(module), name, None) is not fn):
        raise TypeError("run_isolated needs a function defined at the top of an importable module")
    blobs: list[bytes] = []
    header = json.dumps({"fn": [module, name], "args": _pack(list(args), blobs),
                         "memory": int(memory_bytes), "cpu": max(1, int(timeout) + 1),
                         "imports": [str(m) for m in imports]}).encode()
    return [header, *blobs]


def _decode_answer(frames, names):
    """``(value, header)`` from a child's answer frames, or the exception it stands for. A
    compromised child may send anything: it is parsed, never trusted."""
    try:
        header = json.loads(frames[0])
        if not isinstance(header, dict):
            raise ValueError
        if "error" not in header:
            return _unpack(header["value"], frames[1:]), header
        kind, message = str(header["error"]), str(header.get("message", ""))
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        raise ChildFailed() from None
    if kind == "MemoryError":
        raise ChildOutOfMemory()
    if kind in names:
        raise names[kind](message)
    raise ChildFailed()


def in_child() -> bool:
    """True inside a child run_isolated started: work there is isolated already."""
    return _IN_CHILD


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


def server_pid() -> int | None:
    """The pid of this process's fork server, if one is running (for tests and diagnostics)."""
    server = _servers.get(os.getpid())
    return server.process.pid if server is not None and server.process.poll() is None else None


# -- the calling side ----------------------------------------------------------------------

_IN_CHILD = False
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_servers: dict[int, "_Server"] = {}
_servers_lock = threading.Lock()
_abandoned: list = []


class _Server:
    """A fork server owned by this process: its control socket and its process."""

    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        alive_r, self._alive = os.pipe()  # the server ends when this process does
        os.set_inheritable(theirs.fileno(), True)
        try:
            config = json.dumps({"control": theirs.fileno(), "alive": alive_r,
                                 "path": list(dict.fromkeys(p for p in sys.path if isinstance(p, str))),
                                 "preload": list(PRELOAD)})
            self.process = subprocess.Popen(
                [sys.executable, "-c",
                 "import sys; from groundkit_datasette.indexing.isolation import _serve; "
                 "_serve(sys.argv[1])", config],
                pass_fds=(theirs.fileno(), alive_r), stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C of the terminal goes to the caller only
                stdout=subprocess.DEVNULL,  # stdout may be a protocol (MCP over stdio)
                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                    filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))},
            )
        finally:
            theirs.close()
            os.close(alive_r)
        self.control = ours
        os.set_inheritable(self._alive, False)

    def alive(self) -> bool:
        return self.process.poll() is None

    def start(self, token: str) -> socket.socket:
        """A connection to a new child, which reads its request from it."""
        mine, child = socket.socketpair()
        try:
            socket.send_fds(self.control, [json.dumps({"op": "run", "token": token}).encode()],
                            [child.fileno()])
        except OSError:
            mine.close()
            raise ChildFailed() from None
        finally:
            child.close()
        return mine

    def kill(self, token: str) -> None:
        try:
            self.control.send(json.dumps({"op": "kill", "token": token}).encode())
        except OSError:
            pass


def _server() -> _Server:
    pid = os.getpid()
    with _servers_lock:
        server = _servers.get(pid)
        if server is None or not server.alive():
            # A forked process (a map stage child) starts its own: it shares nothing of its
            # parent's server, whose descriptors it may have closed (so they are let go of
            # without closing: the numbers may name other files by now).
            for other in [p for p in _servers if p != pid]:
                stale = _servers.pop(other)
                stale.control.detach()
                _abandoned.append(stale)  # not collected: its Popen is not this process's
            server = _servers[pid] = _Server()
        return server


def _send_frames(conn, frames) -> None:
    for frame in frames:
        conn.sendall(_FRAME.pack(len(frame)))
        conn.sendall(frame)
    conn.sendall(_FRAME.pack(0))  # no frame is empty but the end marker


def _recv_exact(conn, n: int, deadline: float | None) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout()
            conn.settimeout(left)
        k = conn.recv_into(view[got:], n - got)
        if not k:
            raise EOFError
        got += k
    return bytes(buf)


def _receive_answer(conn, deadline: float):
    """``(frames, None)``: the child's frames up to its end marker; ``(None, status)`` if it
    ended without one and the server has said how; ``(None, None)`` if that is not known."""
    frames, total = [], 0
    try:
        while True:
            (length,) = _FRAME.unpack(_recv_exact(conn, _FRAME.size, deadline))
            if length == 0:
                return frames, None
            if length == _STATUS:  # the server's status: the child ended, and was reaped
                return None, struct.unpack("<q", _recv_exact(conn, 8, deadline))[0]
            total += length
            if total > MAX_ANSWER_BYTES:
                return None, None
            frames.append(_recv_exact(conn, length, deadline))
    except EOFError:
        return None, None


def _wait_reaped(conn) -> int | None:
    """Read to the end of the connection: the server closes its end once it has reaped the
    child (the child's end closed with it), after sending the child's exit status (``-signal``
    if killed) as the last bytes. The status, or None if the server did not say so within
    REAP_SECONDS."""
    deadline = time.monotonic() + REAP_SECONDS
    tail = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            conn.settimeout(left)
            data = conn.recv(1 << 16)
            if not data:
                break
            tail = (tail + data)[-16:]  # what a child sent past its answer is dropped
    except OSError:
        return None
    if len(tail) == 16 and _FRAME.unpack(tail[:8])[0] == _STATUS:
        return struct.unpack("<q", tail[8:])[0]
    return None


# -- the fork server -------------------------------------------------------------------------


def _child_config(config_json: str) -> dict:
    """What a fork server and a worker both do first: read the config, find the package."""
    import logging
    import warnings

    config = json.loads(config_json)
    for path in reversed(config["path"]):
        if path not in sys.path:
            sys.path.insert(0, path)
    # Parsers' warnings about a broken file are not the caller's log: the answer says it.
    warnings.simplefilter("ignore")
    logging.root.addHandler(logging.NullHandler())
    logging.root.setLevel(logging.CRITICAL)
    return config


def _serve(config_json: str) -> None:
    """The fork server's main loop: fork a child per "run" datagram, kill on "kill", and tell
    each caller its child's exit status once reaped. Ends when its owner ends."""
    config = _child_config(config_json)
    _preload(config["preload"])
    import gc

    gc.collect()
    gc.freeze()  # children's collections leave the preloaded objects' pages shared
    control = socket.socket(fileno=config["control"])
    alive = config["alive"]
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.set_wakeup_fd(wake_w)
    children: dict[int, tuple[str, socket.socket]] = {}  # pid -> (token, connection)
    by_token: dict[str, int] = {}
    try:
        while True:
            try:
                ready, _, _ = select.select([control, alive, wake_r], [], [])
            except InterruptedError:
                continue
            if alive in ready or control in ready and not _serve_control(
                    control, children, by_token, (control, alive, wake_r, wake_w)):
                return
            if wake_r in ready:
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            _reap(children, by_token)
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _serve_control(control, children, by_token, own_fds) -> bool:
    """Handle one datagram; False when the owner has closed the control socket."""
    try:
        message, fds, _flags, _addr = socket.recv_fds(control, _MAX_DATAGRAM, 1)
    except InterruptedError:
        return True
    if not message and not fds:
        return False
    try:
        request = json.loads(message)
        op, token = request["op"], str(request["token"])
    except (ValueError, KeyError, TypeError):
        for fd in fds:
            os.close(fd)
        return True
    if op == "kill":
        pid = by_token.get(token)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return True
    if op != "run" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        return True
    conn = socket.socket(fileno=fds[0])
    try:
        pid = os.fork()
    except OSError:  # no process to be had: the caller sees its connection end
        conn.close()
        return True
    if pid == 0:  # the child: never returns
        code = 70
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            for other_pid, (_t, other) in children.items():
                other.close()
            for fd in own_fds:
                os.close(fd if isinstance(fd, int) else fd.detach())
            code = _child(conn)
        finally:
            os._exit(code)
    children[pid] = (token, conn)
    by_token[token] = pid
    return True


def _reap(children, by_token) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        token, conn = children.pop(pid, (None, None))
        by_token.pop(token, None)
        if conn is None:
            continue
        try:
            conn.setblocking(False)  # a caller that stopped reading does not stall the server
            conn.sendall(_FRAME.pack(_STATUS) + struct.pack("<q", os.waitstatus_to_exitcode(status)))
        except OSError:
            pass
        finally:
            conn.close()


def _child(conn: socket.socket) -> int:
    """Read the request, set the limits, run the function, send the answer."""
    global _IN_CHILD
    _IN_CHILD = True
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashing parser leaves no core file
    frames = _read_request(conn)
    answer, code = _run_call(frames, hard_limits=True)
    if answer is not None:
        _send_frames(conn, answer)
    return code


def _read_request(conn) -> list[bytes] | None:
    """A request's frames, or None at the end of the connection."""
    frames = []
    try:
        while True:
            (length,) = _FRAME.unpack(_recv_exact(conn, _FRAME.size, None))
            if length == 0:
                return frames
            frames.append(_recv_exact(conn, length, None))
    except EOFError:
        return None


_reserve: list = []


def _run_call(frames, hard_limits: bool, extra: dict | None = None):
    """Run one request under its limits: ``(answer frames or None, exit code)``. The address
    space may grow by the request's ``memory`` from here; CPU time by its ``cpu`` seconds (a
    backstop for the caller's kill: CPU seconds cannot exceed wall seconds). A fresh child's
    limits are hard; a worker's are soft, set again for each call under an unlimited hard one."""
    request = json.loads(frames[0])
    args = _unpack(request["args"], frames[1:])
    del frames
    module, name = request["fn"]
    fn = getattr(importlib.import_module(module), name)
    for library in request.get("imports", ()):
        try:
            importlib.import_module(library)
        except ImportError:
            pass  # not installed: the call says so itself
    if not _reserve:  # memory to answer with once the work has taken all it may
        _reserve.append(bytearray(_RESERVE_BYTES))
    memory = _address_space() + int(request["memory"])
    cpu = int(sum(resource.getrusage(resource.RUSAGE_SELF)[:2])) + int(request["cpu"])
    as_hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    memory, cpu = _within(memory, as_hard), _within(cpu, cpu_hard)
    if hard_limits:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, _within(cpu + 1, cpu_hard)))
    else:
        resource.setrlimit(resource.RLIMIT_AS, (memory, as_hard))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu_hard))
    blobs: list[bytes] = []
    try:
        value = fn(*args)
        del args
        header = {"value": _pack(value, blobs)}
        code = 0
    except BaseException as exc:  # noqa: BLE001 - everything goes back as a name
        args = value = None
        if isinstance(exc, MemoryError):
            _reserve.clear()
        message = exc.args[0] if exc.args and isinstance(exc.args[0], str) else ""
        header = {"error": type(exc).__name__, "message": message[:1000]}
        blobs = []
        code = _EXIT_NO_MEMORY if isinstance(exc, MemoryError) else 0
    if not hard_limits:  # between calls a worker is not held to the last call's limits
        resource.setrlimit(resource.RLIMIT_AS, (as_hard, as_hard))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_hard, cpu_hard))
    try:
        header.update(extra or {})
        if "value" in header:
            header["address_space"] = _address_space()
        return [json.dumps(header).encode(), *blobs], code
    except MemoryError:
        return None, _EXIT_NO_MEMORY


def _within(value: int, hard: int) -> int:
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


# -- reusable workers ----------------------------------------------------------------------------
#
# A fresh child per call costs a fork, its copy-on-write faults and its teardown: 10-20 ms on
# this machine, as much as parsing a small docx. Extraction runs in workers instead: a child
# interpreter (started with subprocess, so it is nobody's fork) that takes calls one at a time,
# each under its own limits: address space beyond what it holds when the call starts, CPU
# seconds from then, and the caller's wall-clock kill. A worker that fails in any way (killed,
# out of memory, crashed, an answer that does not parse) is ended and never used again; one
# that has answered MAX_WORKER_CALLS calls, or grown by WORKER_GROWTH_BYTES, is retired.

MAX_WORKER_CALLS = 500
WORKER_GROWTH_BYTES = 256 * 1024 * 1024
# How long a worker may take to start and import the parsers (not counted in a call's time).
WORKER_START_SECONDS = 60.0


class _Worker:
    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        os.set_inheritable(theirs.fileno(), True)
        try:
            config = json.dumps({"conn": theirs.fileno(),
                                 "path": list(dict.fromkeys(p for p in sys.path if isinstance(p, str))),
                                 "preload": list(WORKER_PRELOAD)})
            self.process = subprocess.Popen(
                [sys.executable, "-c",
                 "import sys; from groundkit_datasette.indexing.isolation import _work; "
                 "_work(sys.argv[1])", config],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                    filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))},
            )
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
                ready, _status = _receive_answer(self.conn, time.monotonic() + WORKER_START_SECONDS)
            except (TimeoutError, OSError):
                ready = None
            self.started = True
            if ready != [b"ready"]:
                self.end()
                raise ChildFailed()
        deadline = time.monotonic() + timeout
        try:
            self.conn.settimeout(max(0.001, deadline - time.monotonic()))
            _send_frames(self.conn, request)
            frames, _status = _receive_answer(self.conn, deadline)
        except TimeoutError:
            self.end()
            raise ChildTimeout() from None
        except OSError:
            frames = None
        if frames is None:  # it died: how?
            status = self.end()
            if status == -signal.SIGXCPU:
                raise ChildTimeout()
            if status in (-signal.SIGKILL, _EXIT_NO_MEMORY):
                raise ChildOutOfMemory()
            raise ChildFailed()
        self.calls += 1
        try:
            value, header = _decode_answer(frames, names)
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
    request = _encode_call(fn, args, timeout, memory_bytes, imports)
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
    global _IN_CHILD
    import gc

    _IN_CHILD = True
    config = _child_config(config_json)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the caller's to act on
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _preload(config["preload"])
    gc.collect()
    conn = socket.socket(fileno=config["conn"])
    _send_frames(conn, [b"ready"])
    while True:
        frames = _read_request(conn)
        if frames is None:
            return
        answer, code = _run_call(frames, hard_limits=False)
        if answer is not None:
            _send_frames(conn, answer)
        if code:  # out of memory: its heap is not to be trusted with another call
            os._exit(code)


def _preload(entries) -> None:
    for entry in entries:
        module, _, function = entry.partition(":")
        try:
            loaded = importlib.import_module(module)
            if function:  # a warm-up: what every call would otherwise do first, done once
                getattr(loaded, function)()
        except Exception:  # an optional parser that is not installed
            pass


def _address_space() -> int:
    """This process's mapped address space in bytes (Linux: /proc; elsewhere the peak RSS)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return usage if sys.platform == "darwin" else usage * 1024


def _pack(value, blobs):
    if isinstance(value, (bytes, bytearray, memoryview)):
        blobs.append(bytes(value))
        return {"$b": len(blobs) - 1}
    if isinstance(value, (list, tuple)):
        return [_pack(v, blobs) for v in value]
    if isinstance(value, dict):
        if "$b" in value:
            raise ValueError("the key '$b' is reserved")
        return {str(k): _pack(v, blobs) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"not plain data: {type(value).__name__}")


def _unpack(value, blobs):
    if isinstance(value, list):
        return [_unpack(v, blobs) for v in value]
    if isinstance(value, dict):
        if set(value) == {"$b"}:
            return blobs[value["$b"]]
        return {k: _unpack(v, blobs) for k, v in value.items()}
    return value
