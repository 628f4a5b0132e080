"""The tool table over MCP's stdio transport (``groundkit mcp``): the SDK's ``stdio_server``
with our own reader and writer of the process's streams.

The reader answers a line that is not one well-formed JSON-RPC message itself (the SDK
would drop it and the client would wait for its timeout); the writer drops ``error.data``
from whatever the SDK writes, as the HTTP transport does.
"""

from __future__ import annotations

import io
import json
import os
import sys
import uuid

import mcp_types as types
from mcp.server.stdio import stdio_server

from .mcp_server import (
    RPC_KINDS, SURFACE_STDIO, build_server, drop_error_data, log_refusal, refuse_malformed, rpc_error,
)


def claim_stdout() -> io.TextIOBase:
    """Reserve the process's stdout for JSON-RPC frames and return the stream that writes them.

    fd 1 and ``sys.stdout`` are pointed at stderr, so a stray ``print`` or a
    library writing to fd 1 cannot corrupt the protocol stream; the returned
    stream writes to a private duplicate of the original stdout.
    """
    sys.stdout.flush()
    wire_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return open(wire_fd, "w", encoding="utf-8", newline="\n", closefd=True)


def claim_stdin() -> io.BufferedIOBase:
    """Reserve the process's stdin for JSON-RPC frames: fd 0 then reads the null device,
    so nothing else (a handler, a child process) can consume a frame."""
    wire_fd = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return open(wire_fd, "rb", closefd=True)


def too_large(limit: int) -> str:
    from .json_api import too_large

    return str(too_large(limit)).replace("request body", "message")


class _StdioWire:
    """The SDK's stdout: every line it writes loses ``error.data``; refusals are written here too."""

    def __init__(self, stream: io.TextIOBase):
        import anyio

        self._file = anyio.wrap_file(stream)
        self._lock = anyio.Lock()  # one whole line at a time

    async def write(self, text: str) -> None:
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if drop_error_data(data):
            text = json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n"
        async with self._lock:
            await self._file.write(text)

    async def flush(self) -> None:
        async with self._lock:
            await self._file.flush()

    async def refuse(self, message: dict) -> None:
        log_refusal(message["error"]["data"]["request_id"], SURFACE_STDIO, "-",
                    RPC_KINDS.get(message["error"]["code"], "invalid_request"))
        async with self._lock:
            await self._file.write(json.dumps(message, separators=(",", ":")) + "\n")
            await self._file.flush()


class _StdioLines:
    """The SDK's stdin: yields only lines that are one well-formed JSON-RPC message and
    answers every other line with a JSON-RPC error, so no client waits on silence."""

    def __init__(self, stream: io.BufferedIOBase, wire: _StdioWire, limit: int):
        self._stream = stream
        self._wire = wire
        self._limit = limit  # the max_body_bytes setting, as for an HTTP body

    def __aiter__(self):
        return self

    async def _readline(self, limit: int) -> bytes:
        import anyio

        return await anyio.to_thread.run_sync(self._stream.readline, limit)

    async def __anext__(self) -> str:
        while True:
            line = await self._readline(self._limit + 2)
            if not line:
                raise StopAsyncIteration
            request_id = uuid.uuid4().hex
            if len(line) > self._limit + 1 or (len(line) > self._limit and not line.endswith(b"\n")):
                while line and not line.endswith(b"\n"):  # skip the rest of the oversized line
                    line = await self._readline(64 * 1024)
                await self._wire.refuse(rpc_error(
                    None, types.INVALID_REQUEST, f"invalid request: {too_large(self._limit)}", request_id))
                continue
            line = line.strip(b" \t\r\n")
            if not line:
                continue
            refusal = refuse_malformed(line, request_id)
            if refusal is not None:
                await self._wire.refuse(refusal)
                continue
            return line.decode("utf-8")


async def run_stdio(
    datasette,
    *,
    stdin: io.BufferedIOBase | None = None,
    stdout: io.TextIOBase | None = None,
    actor: dict | None = None,
) -> None:
    """Serve the tool table over stdio until stdin closes.

    The caller is whoever launched the process; it is anonymous unless ``actor``
    names the Datasette actor to answer as (permissions and access lists apply).

    Pass the stream from :func:`claim_stdout` as ``stdout`` (claimed here otherwise);
    ``stdin`` is a binary stream, by default the process's own (:func:`claim_stdin`).
    """
    from .service import settings_for

    server = build_server(datasette, surface=SURFACE_STDIO, actor=actor)
    wire = _StdioWire(stdout if stdout is not None else claim_stdout())
    limit = settings_for(datasette).max_body_bytes
    lines = _StdioLines(stdin if stdin is not None else claim_stdin(), wire, limit)
    async with stdio_server(stdin=lines, stdout=wire) as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
