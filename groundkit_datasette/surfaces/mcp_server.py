"""The tool table served over MCP: stdio (``groundkit mcp``) and streamable HTTP
(``/-/groundkit/mcp`` inside Datasette).

Every MCP tool is a row of ``tools.all_tools()``: the same request model
validates the arguments, ``service.call_tool`` runs it with the caller's
Datasette actor, and ``service.map_exception`` shapes every failure, so the MCP
surface answers exactly what the JSON API answers.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import json
import logging
import os
import sys
import uuid
from importlib.metadata import PackageNotFoundError, version

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from . import mcp_direct, serialize, service, strictjson
from ..indexing.names import NAME_PATTERN
from ..logs import IN_STATELESS_MCP
from .service import RequestRejected, ToolContext, map_exception
from .tools import Tool, all_tools

log = logging.getLogger("groundkit.mcp")
access_log = logging.getLogger("groundkit.access")

SURFACE_STDIO = "mcp-stdio"
SURFACE_HTTP = "mcp-http"

# Set by ``mcp_http_view`` on the ASGI scope it hands the SDK; the SDK hands that
# request back to the tool handler, which is how the HTTP caller's actor gets there.
ACTOR_SCOPE_KEY = "groundkit.actor"
# Set by ``mcp_http_view`` too: the HTTP request's id, which the tool call then logs and answers.
REQUEST_ID_SCOPE_KEY = "groundkit.request_id"
# False: every HTTP call goes through the SDK's stateless transport (the parity tests' oracle).
DIRECT_CALLS = True
STATUS_META_KEY = "groundkit/status"
ERROR_META_KEY = "groundkit/error"

READ_ONLY = types.ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)

INSTRUCTIONS = (
    "Search private document collections and cite them. Call list_collections, then search "
    "with a collection name; every hit carries source, line range and chunk_id. Cite hits as "
    "source:line_start-line_end and use fetch_chunk to re-verify a citation against the source."
)

_COLLECTION_FIELD = Field(
    description="Collection name, from list_collections.",
    min_length=1,
    max_length=64,
    pattern=NAME_PATTERN.pattern,
)


# -- schemas ------------------------------------------------------------------


def arguments_model(tool: Tool) -> type[BaseModel]:
    """The model an MCP caller's arguments follow: the request model, plus ``collection``
    for collection tools (the JSON API takes it from the URL instead)."""
    if tool.scope != "collection":
        return tool.request_model
    return create_model(
        f"{tool.request_model.__name__}Arguments",
        __base__=tool.request_model,
        collection=(str, _COLLECTION_FIELD),
    )


def input_schema(tool: Tool) -> dict:
    schema = arguments_model(tool).model_json_schema()
    schema["additionalProperties"] = False  # the table's request models forbid extra fields
    return schema


def output_schema(tool: Tool) -> dict:
    return tool.response_model.model_json_schema(mode="serialization")


def mcp_tool(tool: Tool) -> types.Tool:
    return types.Tool(
        name=tool.name,
        description=tool.summary,
        input_schema=input_schema(tool),
        output_schema=output_schema(tool),
        annotations=READ_ONLY,
    )


# -- results ------------------------------------------------------------------


class _CollectionArgument(BaseModel):
    """Only to word a missing or non-string ``collection`` the way pydantic words any other field."""

    model_config = ConfigDict(strict=True)
    collection: str


def _snippet(text: str, limit: int = 240) -> str:
    """``text`` with its whitespace runs made single spaces, cut to ``limit`` characters."""
    # The flattened head of a text is a prefix of the flattened whole, so a head that is
    # already too long gives the same cut without flattening a 2,000-character chunk.
    head = " ".join(text[: limit * 2].split())
    if len(head) > limit:
        return head[: limit - 3] + "..."
    flat = head if len(text) <= limit * 2 else " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def render_text(tool: Tool, data: dict) -> str:
    """The readable twin of the structured result, for clients that show only text."""
    if tool.name == "search" and isinstance(data.get("hits"), list):
        hits = data["hits"]
        lines = [
            f"{len(hits)} hit(s) in {data.get('collection')} "
            f"(mode {data.get('mode')}, generation {data.get('generation')})"
        ]
        if data.get("note"):
            lines.append(f"Note: {data['note']}")
        for hit in hits:
            lines.append(
                f"{hit['rank']}. {hit['source']}:{hit['line_start']}-{hit['line_end']}"
                f"  score {hit['score']:.4f}  chunk_id {hit['chunk_id']}"
            )
            if hit.get("heading"):
                lines.append(f"   {hit['heading']}")
            if "matched_terms" in hit:
                lines.append("   matched: " + (", ".join(hit["matched_terms"]) or "no query word"))
            lines.append(f"   {_snippet(hit['content'])}")
        return "\n".join(lines)
    return json.dumps(data, indent=2, ensure_ascii=False)


def error_result(error: service.ErrorInfo, request_id: str) -> types.CallToolResult:
    """A tool error as every client reads it: the JSON API's error body as text and in ``_meta``.

    No ``structuredContent``: it would have to match the tool's ``outputSchema``
    (the success body), and clients that check it (the TypeScript SDK) throw on
    an error body there instead of showing it.
    """
    body = error.body(request_id)
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(body, ensure_ascii=False))],
        is_error=True,
        # The status the JSON API answers for the same error, and its body.
        _meta={STATUS_META_KEY: error.status, ERROR_META_KEY: body},
    )


def _scope(ctx) -> dict:
    """The ASGI scope of the HTTP request carrying this call; empty on stdio."""
    request = getattr(ctx, "request", None)
    scope = getattr(request, "scope", None)
    return scope if isinstance(scope, dict) else {}


async def answer_call(
    datasette, tool: Tool, arguments, actor, surface: str, request_id: str | None = None
) -> types.CallToolResult:
    """One MCP call of ``tool`` as ``actor``: its result, or the shared error result; never raises.

    Used by our own server and by the datasette-mcp bridge.
    """
    from .service import registry_for

    request_id = request_id or uuid.uuid4().hex
    # Everything below is caught: the SDK's own exception-to-error path would show
    # the caller an exception's message; ours answers with the shared mapping only.
    try:
        tool_ctx = ToolContext(registry_for(datasette), actor, surface, request_id)
        arguments = dict(arguments or {})
        collection = None
        if tool.scope == "collection":
            collection = arguments.pop("collection", None)
            if not isinstance(collection, str):
                given = {} if collection is None else {"collection": collection}
                _CollectionArgument.model_validate(given)  # raises, worded like any field
        response, error = await service.call_tool(tool, tool_ctx, collection, arguments)
        if error is not None:
            return error_result(error, request_id)
        data = serialize.payload(response)  # what the JSON API's body holds
        return types.CallToolResult(
            content=[types.TextContent(text=render_text(tool, data))],
            structured_content=data,
        )
    except Exception as exc:
        error = map_exception(exc)
        if error.status >= 500:
            log.error("request %s: MCP %s failed", request_id, tool.name, exc_info=exc)
        return error_result(error, request_id)


# -- the server ---------------------------------------------------------------


def _package_version() -> str:
    try:
        return version("groundkit-datasette")
    except PackageNotFoundError:  # a checkout that was not pip-installed
        return "0"


def build_server(datasette, *, surface: str, actor: dict | None = None) -> Server:
    """A low-level MCP server whose tools are exactly ``all_tools()``.

    ``actor`` answers calls that carry none (stdio); over HTTP each request brings its own.
    """
    table = {tool.name: tool for tool in all_tools()}
    listed = [mcp_tool(tool) for tool in table.values()]
    schemas = {t.name: t.input_schema for t in listed}

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = table.get(params.name)
        if tool is None:
            raise MCPError(types.INVALID_PARAMS, "unknown tool")
        scope = _scope(ctx)
        return await answer_call(
            datasette, tool, params.arguments, scope.get(ACTOR_SCOPE_KEY) or actor, surface,
            scope.get(REQUEST_ID_SCOPE_KEY),
        )

    return Server(
        "groundkit",
        version=_package_version(),
        title="groundkit",
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        # Lets the SDK check Mcp-Param-* headers without re-running tools/list.
        get_tool_input_schema=schemas.get,
    )


# -- malformed messages --------------------------------------------------------


def _rpc_error(message_id, code: int, message: str, request_id: str) -> dict:
    """A JSON-RPC error in fixed words; ``data`` carries only our request id for the logs."""
    return {"jsonrpc": "2.0", "id": message_id,
            "error": {"code": code, "message": message, "data": {"request_id": request_id}}}


def _message_id(value):
    """The id of a request we refuse, so the client can match the answer: a numeric id only.

    A string id is the caller's text, which no refusal repeats; the answer then
    names ``null``, as for a message whose id could not be read.
    """
    if isinstance(value, dict):
        mid = value.get("id")
        if not isinstance(mid, str) and _valid_id(mid):
            return mid
    return None


# JSON-RPC ids a client can round-trip exactly: text, or an integer a JavaScript number holds.
_MAX_ID = 2**53 - 1


def _valid_id(value) -> bool:
    """MCP ids are text or integers, never null. Without this check a message with a float id
    (NaN, 1.5, 1e400) validates as a *notification*, which nobody answers."""
    if isinstance(value, str):
        return True
    return isinstance(value, int) and not isinstance(value, bool) and -_MAX_ID <= value <= _MAX_ID


def refuse_malformed(raw: bytes, request_id: str) -> dict | None:
    """None when ``raw`` is one well-formed JSON-RPC message; otherwise the error that answers it."""
    return parse_message(raw, request_id)[1]


def parse_message(raw: bytes, request_id: str) -> tuple[object, dict | None]:
    """``(message, None)`` when ``raw`` is one well-formed JSON-RPC message; otherwise
    ``(None, the error that answers it)``.

    The SDK would drop a line it cannot parse on stdio (the client waits for its
    timeout) and word its own HTTP refusals; both transports answer these here,
    before the SDK sees the message: -32700 for text that is not UTF-8 JSON (lone
    surrogates included), -32600 for JSON that is not a JSON-RPC message or is
    nested too deep.
    """
    try:
        value = strictjson.loads(raw)
    except strictjson.NotJSON as exc:
        return None, _rpc_error(_message_id(exc.value), types.PARSE_ERROR,
                                "parse error: the message is not valid UTF-8 JSON", request_id)
    except strictjson.TooDeep as exc:
        return None, _rpc_error(_message_id(exc.value), types.INVALID_REQUEST,
                                f"invalid request: JSON nested more than {strictjson.MAX_DEPTH} levels deep",
                                request_id)
    if isinstance(value, dict) and "id" in value and not _valid_id(value["id"]):
        return None, _rpc_error(None, types.INVALID_REQUEST,
                                "invalid request: the id must be an integer or a string", request_id)
    try:
        types.jsonrpc_message_adapter.validate_python(value, by_name=False)
    except ValidationError:
        return None, _rpc_error(_message_id(value), types.INVALID_REQUEST,
                                "invalid request: not a JSON-RPC 2.0 message", request_id)
    return value, None


def _too_large(limit: int) -> str:
    from .json_api import _too_large as too_large

    return str(too_large(limit)).replace("request body", "message")


def _log_refusal(request_id: str, surface: str, status, kind: str) -> None:
    """One access line for a message refused before any tool ran, in the shape of the others."""
    from ..logs import REQUEST_LINE

    method, route = REQUEST_LINE.get()
    access_log.info("request_id=%s method=%s route=%s surface=%s refused status=%s error=%s",
                    request_id, method, route, surface, status, kind)


_RPC_KINDS = {types.PARSE_ERROR: "parse_error", types.INVALID_REQUEST: "invalid_request"}


def _drop_error_data(message) -> bool:
    """Drop ``error.data`` of a JSON-RPC error the SDK wrote: it puts request input there
    (an unknown method's name). Our tool errors travel as results, not here."""
    if isinstance(message, dict) and isinstance(message.get("error"), dict) and "data" in message["error"]:
        del message["error"]["data"]
        return True
    return False


def _without_error_data(body: bytes) -> bytes:
    if b'"error"' not in body:  # no error member: skip parsing a whole result (5-50 KB)
        return body
    try:
        data = json.loads(body)
    except ValueError:
        return body
    return json.dumps(data, separators=(",", ":")).encode("utf-8") if _drop_error_data(data) else body


# -- stdio ----------------------------------------------------------------------


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
        if _drop_error_data(data):
            text = json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n"
        async with self._lock:
            await self._file.write(text)

    async def flush(self) -> None:
        async with self._lock:
            await self._file.flush()

    async def refuse(self, message: dict) -> None:
        _log_refusal(message["error"]["data"]["request_id"], SURFACE_STDIO, "-",
                     _RPC_KINDS.get(message["error"]["code"], "invalid_request"))
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
                await self._wire.refuse(_rpc_error(
                    None, types.INVALID_REQUEST, f"invalid request: {_too_large(self._limit)}", request_id))
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


# -- streamable HTTP --------------------------------------------------------------


class _HttpEndpoint:
    """One SDK session manager for one Datasette instance on one event loop.

    The manager only serves inside its ``run()`` context, normally entered by an
    ASGI lifespan. Our hooks cannot wrap Datasette's lifespan from here, so the
    context is entered on first use by a background task that lives until the
    event loop shuts down (uvicorn cancels it then, which exits ``run()``).
    """

    def __init__(self, datasette):
        from .service import settings_for

        self.loop = asyncio.get_running_loop()
        self.server = build_server(datasette, surface=SURFACE_HTTP)
        self.tools = {tool.name: tool for tool in all_tools()}
        self.manager = StreamableHTTPSessionManager(
            app=self.server,
            # Stateless JSON: no session survives a request, so nothing is held per client
            # and each POST carries its own actor.
            stateless=True,
            json_response=True,
            # Host/Origin validation belongs to the Datasette side, for every route alike;
            # the SDK's own check would reject every host but loopback.
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            max_request_body_size=settings_for(datasette).max_body_bytes,
        )
        self.ready: asyncio.Future = self.loop.create_future()
        # A fresh context: the manager's tasks must not inherit the first request's context.
        self.task = self.loop.create_task(
            self._run(), name="groundkit-mcp-session-manager", context=contextvars.Context()
        )

    async def _run(self) -> None:
        try:
            async with self.manager.run():
                self.ready.set_result(None)
                await asyncio.Event().wait()
        except asyncio.CancelledError:  # the event loop is shutting down
            self._fail()
            raise
        except Exception as exc:  # logged here; the waiting requests answer 503
            log.error("MCP session manager stopped", exc_info=exc)
            self._fail()

    def _fail(self) -> None:
        if not self.ready.done():
            self.ready.set_exception(RuntimeError("MCP session manager not running"))

    def usable(self) -> bool:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        return loop is self.loop and not self.task.done()


async def _endpoint_for(datasette) -> _HttpEndpoint:
    endpoint = getattr(datasette, "_groundkit_mcp_http", None)
    if endpoint is None or not endpoint.usable():
        # First request, or the instance is now served from another event loop (tests).
        endpoint = _HttpEndpoint(datasette)
        datasette._groundkit_mcp_http = endpoint
    await asyncio.shield(endpoint.ready)
    return endpoint


def _with_request_id(headers, request_id: str, *, drop_length: bool = False) -> list:
    skip = {b"x-request-id", b"content-length"} if drop_length else {b"x-request-id"}
    out = [(k, v) for k, v in headers or [] if k.lower() not in skip]
    out.append((b"x-request-id", request_id.encode()))
    return out


async def _send_json(send, status: int, body: dict, request_id: str, extra_headers=()) -> None:
    data = json.dumps(body, separators=(",", ":")).encode("utf-8")
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        (b"cache-control", b"no-store"),
        (b"x-request-id", request_id.encode()),
        *extra_headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _send_error(send, exc: Exception, request_id: str, extra_headers=()) -> None:
    """A transport refusal in the JSON API's error shape, logged under its request id."""
    error = map_exception(exc)
    _log_refusal(request_id, SURFACE_HTTP, error.status, error.kind)
    await _send_json(send, error.status, error.body(request_id), request_id, extra_headers)


def _replay(body: bytes, receive):
    """A ``receive`` that hands the SDK the body already read, then the client's own messages."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


# Fixed words for the SDK's own HTTP refusals, re-shaped into the service's error body.
_SDK_ERRORS = {
    400: ("malformed_request", "the request is not a valid MCP message"),
    404: ("not_found", "no such MCP session"),
    405: ("method_not_allowed", "use POST for MCP requests"),
    406: ("not_acceptable", "the client must accept application/json"),
    409: ("conflict", "the request conflicts with the session state"),
    413: ("payload_too_large", "request body exceeds 256 KiB"),
    415: ("unsupported_media_type", "the body must be application/json"),
}


def _answers_a_request(body: bytes) -> bool:
    """A JSON-RPC error naming a request id is the protocol's answer to that request
    (clients read it); one without an id is a transport refusal."""
    try:
        data = json.loads(body)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("jsonrpc") == "2.0" and data.get("id") is not None


def _shaped(send, request_id: str):
    """Rewrite what the SDK answers so it echoes nothing: its transport refusals become
    ``{"ok": false, "error", "detail", "request_id"}``, JSON-RPC errors lose ``data``,
    and every answer carries ``X-Request-ID``."""
    held, chunks = None, []

    async def shaped_send(message):
        nonlocal held
        if message["type"] == "http.response.start":
            content_type = dict(message.get("headers") or []).get(b"content-type", b"")
            if message["status"] >= 400 or content_type.startswith(b"application/json"):
                held = message
                return
            message = dict(message, headers=_with_request_id(message.get("headers"), request_id))
        if held is not None and message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks)
            status = held["status"]
            if status >= 400 and not _answers_a_request(body):
                kind, detail = _SDK_ERRORS.get(status, ("internal_error", "internal error"))
                await _send_error(send, RequestRejected(status, kind, detail), request_id)
                return
            if status >= 400:
                _log_refusal(request_id, SURFACE_HTTP, status, "json_rpc_error")
            body = _without_error_data(body)
            headers = _with_request_id(held.get("headers"), request_id, drop_length=True)
            headers.append((b"content-length", str(len(body)).encode()))
            await send(dict(held, headers=headers))
            await send({"type": "http.response.body", "body": body})
            return
        await send(message)

    return shaped_send


async def mcp_http_view(datasette, request, scope, receive, send):
    """Datasette route for ``/-/groundkit/mcp``: hands the request to the SDK, responds via ``send``.

    Only POST is served: the endpoint is stateless JSON, so there is no stream for
    a GET to open and no session for a DELETE to end (405, ``Allow: POST``). The
    body is read and checked here first, so the 256 KiB limit answers in the JSON
    API's error shape and a malformed message with a JSON-RPC error; ``_shaped``
    rewrites the SDK's own refusals (its validation errors quote the input back).
    One request id names the answer (``X-Request-ID``), its log lines and its tool call.
    """
    from .json_api import read_body
    from .service import settings_for

    request_id = uuid.uuid4().hex
    if scope.get("method") != "POST":
        await _send_error(
            send, RequestRejected(405, "method_not_allowed", "use POST for MCP requests"),
            request_id, extra_headers=[(b"allow", b"POST")],
        )
        return None
    try:
        body = await read_body(receive, request.headers, settings_for(datasette).max_body_bytes)
    except RequestRejected as exc:
        await _send_error(send, exc, request_id)
        return None
    message, refusal = parse_message(body, request_id)
    if refusal is not None:
        _log_refusal(request_id, SURFACE_HTTP, 400, _RPC_KINDS.get(refusal["error"]["code"], "invalid_request"))
        await _send_json(send, 400, refusal, request_id)
        return None
    try:
        endpoint = await _endpoint_for(datasette)
    except Exception:
        await _send_error(send, RequestRejected(503, "unavailable", "the MCP endpoint is unavailable"),
                          request_id)
        return None
    scope = dict(scope, **{ACTOR_SCOPE_KEY: request.actor, REQUEST_ID_SCOPE_KEY: request_id})
    replay, shaped = _replay(body, receive), _shaped(send, request_id)

    async def call(name, arguments):
        return await answer_call(datasette, endpoint.tools[name], arguments, request.actor,
                                 SURFACE_HTTP, request_id)

    if DIRECT_CALLS and await mcp_direct.answer(message, endpoint.tools, call, scope, shaped):
        return None
    quiet = IN_STATELESS_MCP.set(True)
    try:
        await endpoint.manager.handle_request(scope, replay, shaped)
    finally:
        IN_STATELESS_MCP.reset(quiet)
    return None
