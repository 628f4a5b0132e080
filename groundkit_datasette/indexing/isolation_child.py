"""What both kinds of isolated child share (indexing/isolation.py): how the caller starts one,
the wire format of a call and its answer (JSON plus raw byte frames, never a pickle), and how a
child runs a call under its limits. adr/0050-isolated-extraction.md.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import time

# An answer larger than this is refused (the text budget keeps real ones far below).
MAX_ANSWER_BYTES = 512 * 1024 * 1024
# After a kill, how long to wait for a child to be reported reaped.
REAP_SECONDS = 10.0
FRAME = struct.Struct("<Q")
STATUS = 1 << 63  # the length field that marks the fork server's status frame
_RESERVE_BYTES = 4 * 1024 * 1024
EXIT_NO_MEMORY = 75  # a child with no memory left even to say so
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_IN_CHILD = False


class ChildFailed(Exception):
    """The child did not return an answer (crashed, or raised an exception not passed through)."""

    reason = "failed"


class ChildTimeout(ChildFailed):
    reason = "timed out"


class ChildOutOfMemory(ChildFailed):
    reason = "out of memory"


def in_child() -> bool:
    """True inside an isolated child (a worker, or a fork server's child): work there is
    isolated already."""
    return _IN_CHILD


def mark_child() -> None:
    """Called first thing in a child process: ``in_child()`` is true from then on."""
    global _IN_CHILD
    _IN_CHILD = True


# -- the calling side ------------------------------------------------------------------------


def start_child(function: str, config: dict, pass_fds) -> subprocess.Popen:
    """A clean interpreter running ``function`` (``module:name``) on ``config`` (sent as JSON,
    with this process's ``sys.path`` added): nobody's fork, so safe from a threaded server, a
    daemonic Dask worker or a forked map-stage child alike."""
    module, name = function.split(":")
    config = dict(config, path=list(dict.fromkeys(p for p in sys.path if isinstance(p, str))))
    return subprocess.Popen(
        [sys.executable, "-c", f"import sys; from {module} import {name}; {name}(sys.argv[1])",
         json.dumps(config)],
        pass_fds=tuple(pass_fds), stdin=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C of the terminal goes to the caller only
        stdout=subprocess.DEVNULL,  # stdout may be a protocol (MCP over stdio)
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))},
    )


def encode_call(fn, args, timeout: float, memory_bytes: int, imports=()) -> list[bytes]:
    """The request frames: which function (by module and name), its arguments, the limits."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if (not module or module == "__main__" or not name.isidentifier()
            or getattr(sys.modules.get(module), name, None) is not fn):
        raise TypeError("run_isolated needs a function defined at the top of an importable module")
    blobs: list[bytes] = []
    header = json.dumps({"fn": [module, name], "args": pack(list(args), blobs),
                         "memory": int(memory_bytes), "cpu": max(1, int(timeout) + 1),
                         "imports": [str(m) for m in imports]}).encode()
    return [header, *blobs]


def decode_answer(frames, names):
    """``(value, header)`` from a child's answer frames, or the exception it stands for. A
    compromised child may send anything: it is parsed, never trusted."""
    try:
        header = json.loads(frames[0])
        if not isinstance(header, dict):
            raise ValueError
        if "error" not in header:
            return unpack(header["value"], frames[1:]), header
        kind, message = str(header["error"]), str(header.get("message", ""))
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        raise ChildFailed() from None
    if kind == "MemoryError":
        raise ChildOutOfMemory()
    if kind in names:
        raise names[kind](message)
    raise ChildFailed()


def send_frames(conn, frames) -> None:
    for frame in frames:
        conn.sendall(FRAME.pack(len(frame)))
        conn.sendall(frame)
    conn.sendall(FRAME.pack(0))  # no frame is empty but the end marker


def recv_exact(conn, n: int, deadline: float | None) -> bytes:
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


def receive_answer(conn, deadline: float):
    """``(frames, None)``: the child's frames up to its end marker; ``(None, status)`` if it
    ended without one and the server has said how; ``(None, None)`` if that is not known."""
    frames, total = [], 0
    try:
        while True:
            (length,) = FRAME.unpack(recv_exact(conn, FRAME.size, deadline))
            if length == 0:
                return frames, None
            if length == STATUS:  # the server's status: the child ended, and was reaped
                return None, struct.unpack("<q", recv_exact(conn, 8, deadline))[0]
            total += length
            if total > MAX_ANSWER_BYTES:
                return None, None
            frames.append(recv_exact(conn, length, deadline))
    except EOFError:
        return None, None


# -- the child's side ------------------------------------------------------------------------


def child_config(config_json: str) -> dict:
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


def read_request(conn) -> list[bytes] | None:
    """A request's frames, or None at the end of the connection."""
    frames = []
    try:
        while True:
            (length,) = FRAME.unpack(recv_exact(conn, FRAME.size, None))
            if length == 0:
                return frames
            frames.append(recv_exact(conn, length, None))
    except EOFError:
        return None


_reserve: list = []


def run_call(frames, hard_limits: bool, extra: dict | None = None):
    """Run one request under its limits: ``(answer frames or None, exit code)``. The address
    space may grow by the request's ``memory`` from here; CPU time by its ``cpu`` seconds (a
    backstop for the caller's kill: CPU seconds cannot exceed wall seconds). A fresh child's
    limits are hard; a worker's are soft, set again for each call under an unlimited hard one."""
    request = json.loads(frames[0])
    args = unpack(request["args"], frames[1:])
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
    memory = address_space() + int(request["memory"])
    cpu = int(sum(resource.getrusage(resource.RUSAGE_SELF)[:2])) + int(request["cpu"])
    as_hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    memory, cpu = within(memory, as_hard), within(cpu, cpu_hard)
    if hard_limits:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, within(cpu + 1, cpu_hard)))
    else:
        resource.setrlimit(resource.RLIMIT_AS, (memory, as_hard))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu_hard))
    blobs: list[bytes] = []
    try:
        value = fn(*args)
        del args
        header = {"value": pack(value, blobs)}
        code = 0
    except BaseException as exc:  # noqa: BLE001 - everything goes back as a name
        args = value = None
        if isinstance(exc, MemoryError):
            _reserve.clear()
        message = exc.args[0] if exc.args and isinstance(exc.args[0], str) else ""
        header = {"error": type(exc).__name__, "message": message[:1000]}
        blobs = []
        code = EXIT_NO_MEMORY if isinstance(exc, MemoryError) else 0
    if not hard_limits:  # between calls a worker is not held to the last call's limits
        resource.setrlimit(resource.RLIMIT_AS, (as_hard, as_hard))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_hard, cpu_hard))
    try:
        header.update(extra or {})
        if "value" in header:
            header["address_space"] = address_space()
        return [json.dumps(header).encode(), *blobs], code
    except MemoryError:
        return None, EXIT_NO_MEMORY


def within(value: int, hard: int) -> int:
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def preload(entries) -> None:
    for entry in entries:
        module, _, function = entry.partition(":")
        try:
            loaded = importlib.import_module(module)
            if function:  # a warm-up: what every call would otherwise do first, done once
                getattr(loaded, function)()
        except Exception:  # an optional parser that is not installed
            pass


def address_space() -> int:
    """This process's mapped address space in bytes (Linux: /proc; elsewhere the peak RSS)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return usage if sys.platform == "darwin" else usage * 1024


def pack(value, blobs):
    if isinstance(value, (bytes, bytearray, memoryview)):
        blobs.append(bytes(value))
        return {"$b": len(blobs) - 1}
    if isinstance(value, (list, tuple)):
        return [pack(v, blobs) for v in value]
    if isinstance(value, dict):
        if "$b" in value:
            raise ValueError("the key '$b' is reserved")
        return {str(k): pack(v, blobs) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"not plain data: {type(value).__name__}")


def unpack(value, blobs):
    if isinstance(value, list):
        return [unpack(v, blobs) for v in value]
    if isinstance(value, dict):
        if set(value) == {"$b"}:
            return blobs[value["$b"]]
        return {k: unpack(v, blobs) for k, v in value.items()}
    return value
