"""The fork server behind ``run_isolated`` (pdfium's renders, adr/0052): a fresh child per
call, forked from a clean interpreter started once per process with the parsers imported,
reached by one datagram on a private socket pair carrying a fresh connection. The server reaps
the child and sends its exit status last, so a call that returns has no child left behind (one
that answered is killed if it lingers). adr/0050-isolated-extraction.md.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import select
import signal
import socket
import struct
import threading
import time

from .isolation_child import (FRAME, REAP_SECONDS, STATUS, EXIT_NO_MEMORY, ChildFailed,
                              ChildOutOfMemory, ChildTimeout, child_config, decode_answer,
                              encode_call, mark_child, preload, read_request, receive_answer,
                              run_call, send_frames, start_child)

# What the fork server imports once, so each child starts with the parsers loaded.
# ("module:function" also calls the function once, after the import.) Its children all
# inherit what it did.
PRELOAD = ("groundkit_datasette.indexing.extract", "pypdf", "pypdfium2", "docx", "pptx",
           "openpyxl", "groundkit_datasette.indexing.extract:warm_up")
_MAX_DATAGRAM = 4096


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
    request = encode_call(fn, args, timeout, memory_bytes)
    deadline = time.monotonic() + timeout
    token = secrets.token_hex(8)
    conn = _server().start(token)
    killed = False
    status = None
    frames = None
    try:
        try:
            conn.settimeout(max(0.001, deadline - time.monotonic()))
            send_frames(conn, request)
            frames, status = receive_answer(conn, deadline)
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
        if status in (-signal.SIGKILL, EXIT_NO_MEMORY):  # not ours: the kernel's OOM killer
            raise ChildOutOfMemory()
        raise ChildFailed()
    return decode_answer(frames, names)[0]


def server_pid() -> int | None:
    """The pid of this process's fork server, if one is running (for tests and diagnostics)."""
    server = _servers.get(os.getpid())
    return server.process.pid if server is not None and server.process.poll() is None else None


# -- the calling side ----------------------------------------------------------------------

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
            self.process = start_child(
                f"{__name__}:_serve",
                {"control": theirs.fileno(), "alive": alive_r, "preload": list(PRELOAD)},
                pass_fds=(theirs.fileno(), alive_r))
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
    if len(tail) == 16 and FRAME.unpack(tail[:8])[0] == STATUS:
        return struct.unpack("<q", tail[8:])[0]
    return None


# -- the fork server -------------------------------------------------------------------------


def _serve(config_json: str) -> None:
    """The fork server's main loop: fork a child per "run" datagram, kill on "kill", and tell
    each caller its child's exit status once reaped. Ends when its owner ends."""
    config = child_config(config_json)
    preload(config["preload"])
    import gc

    gc.collect()
    # Children's collections leave the preloaded objects' pages shared. Process-wide, but this
    # is the fork server's own interpreter (``start_child``), never the caller's.
    gc.freeze()
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
            conn.sendall(FRAME.pack(STATUS) + struct.pack("<q", os.waitstatus_to_exitcode(status)))
        except OSError:
            pass
        finally:
            conn.close()


def _child(conn: socket.socket) -> int:
    """Read the request, set the limits, run the function, send the answer."""
    mark_child()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashing parser leaves no core file
    frames = read_request(conn)
    answer, code = run_call(frames, hard_limits=True)
    if answer is not None:
        send_frames(conn, answer)
    return code
