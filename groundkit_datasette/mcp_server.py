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
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field, create_model

from . import service
from .names import NAME_PATTERN
from .service import RequestRejected, ToolContext, map_exception
from .tools import Tool, all_tools

log = logging.getLogger("groundkit.mcp")

SURFACE_STDIO = "mcp-stdio"
SURFACE_HTTP = "mcp-http"

# Set by ``mcp_http_view`` on the ASGI scope it hands the SDK; the SDK hands that
# request back to the tool handler, which is how the HTTP caller's actor gets there.
ACTOR_SCOPE_KEY = "groundkit.actor"
STATUS_META_KEY = "groundkit/status"

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
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def render_text(tool: Tool, data: dict) -> str:
    """The readable twin of the structured result, for clients that show only text."""
    if tool.name == "search" and isinstance(data.get("hits"), list):
        hits = data["hits"]
        lines = [
            f"{len(hits)} hit(s) in {data.get('collection')} "
            f"(mode {data.get('mode')}, generation {data.get('generation')})"
        ]
        for hit in hits:
            lines.append(
                f"{hit['rank']}. {hit['source']}:{hit['line_start']}-{hit['line_end']}"
                f"  score {hit['score']:.4f}  chunk_id {hit['chunk_id']}"
            )
            if hit.get("heading"):
                lines.append(f"   {hit['heading']}")
            lines.append(f"   {_snippet(hit['content'])}")
        return "\n".join(lines)
    return json.dumps(data, indent=2, ensure_ascii=False)


def error_result(error: service.ErrorInfo, request_id: str) -> types.CallToolResult:
    body = error.body(request_id)
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(body, ensure_ascii=False))],
        structured_content=body,
        is_error=True,
        # The status the JSON API answers for the same error.
        _meta={STATUS_META_KEY: error.status},
    )


def _actor(ctx) -> Any:
    """The HTTP request's Datasette actor; None (anonymous) on stdio or any other transport."""
    request = getattr(ctx, "request", None)
    scope = getattr(request, "scope", None)
    if isinstance(scope, dict):
        return scope.get(ACTOR_SCOPE_KEY)
    return None


async def answer_call(datasette, tool: Tool, arguments, actor, surface: str) -> types.CallToolResult:
    """One MCP call of ``tool`` as ``actor``: its result, or the shared error result; never raises.

    Used by our own server and by the datasette-mcp bridge.
    """
    from .plugin import registry_for

    request_id = uuid.uuid4().hex
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
        data = response.model_dump(mode="json")
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
        return await answer_call(datasette, tool, params.arguments, _actor(ctx) or actor, surface)

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


async def run_stdio(datasette, *, stdout: io.TextIOBase | None = None, actor: dict | None = None) -> None:
    """Serve the tool table over stdio until stdin closes.

    The caller is whoever launched the process; it is anonymous unless ``actor``
    names the Datasette actor to answer as (permissions and access lists apply).

    Pass the stream from :func:`claim_stdout` as ``stdout``; without it the SDK
    claims fd 1 itself, but only while serving.
    """
    import anyio

    server = build_server(datasette, surface=SURFACE_STDIO, actor=actor)
    wire = anyio.wrap_file(stdout) if stdout is not None else None
    async with stdio_server(stdout=wire) as (read_stream, write_stream):
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
        from .plugin import MAX_BODY_BYTES

        self.loop = asyncio.get_running_loop()
        self.server = build_server(datasette, surface=SURFACE_HTTP)
        self.manager = StreamableHTTPSessionManager(
            app=self.server,
            # Stateless JSON: no session survives a request, so nothing is held per client
            # and each POST carries its own actor.
            stateless=True,
            json_response=True,
            # Host/Origin validation belongs to the Datasette side, for every route alike;
            # the SDK's own check would reject every host but loopback.
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            max_request_body_size=MAX_BODY_BYTES,
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


async def _send_error(send, exc: Exception) -> None:
    from datasette.utils.asgi import Response

    request_id = uuid.uuid4().hex
    error = map_exception(exc)
    response = Response.json(error.body(request_id), status=error.status)
    response.headers["X-Request-ID"] = request_id
    await response.asgi_send(send)


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


def _without_error_data(body: bytes) -> bytes:
    """Drop ``error.data`` from a JSON-RPC error: the SDK puts request input there
    (an unknown method's name). Our own tool errors travel as results, not here."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    if isinstance(data, dict) and isinstance(data.get("error"), dict) and "data" in data["error"]:
        del data["error"]["data"]
        return json.dumps(data, separators=(",", ":")).encode("utf-8")
    return body


def _shaped(send):
    """Rewrite what the SDK answers so it echoes nothing: its transport refusals become
    ``{"ok": false, "error", "detail", "request_id"}``, JSON-RPC errors lose ``data``."""
    held, chunks = None, []

    async def shaped_send(message):
        nonlocal held
        if message["type"] == "http.response.start":
            content_type = dict(message.get("headers") or []).get(b"content-type", b"")
            if message["status"] >= 400 or content_type.startswith(b"application/json"):
                held = message
                return
        if held is not None and message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks)
            status = held["status"]
            if status >= 400 and not _answers_a_request(body):
                kind, detail = _SDK_ERRORS.get(status, ("internal_error", "internal error"))
                await _send_error(send, RequestRejected(status, kind, detail))
                return
            body = _without_error_data(body)
            headers = [(k, v) for k, v in held.get("headers") or [] if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send(dict(held, headers=headers))
            await send({"type": "http.response.body", "body": body})
            return
        await send(message)

    return shaped_send


async def mcp_http_view(datasette, request, scope, receive, send):
    """Datasette route for ``/-/groundkit/mcp``: hands the request to the SDK, responds via ``send``.

    The body is read here first, so the 256 KiB limit (by Content-Length and by
    bytes received) answers in the JSON API's error shape; ``_shaped`` rewrites
    the SDK's own refusals (its validation errors quote the input back).
    """
    from .plugin import read_body

    try:
        endpoint = await _endpoint_for(datasette)
    except Exception:
        await _send_error(send, RequestRejected(503, "unavailable", "the MCP endpoint is unavailable"))
        return None
    if scope.get("method") == "POST":
        try:
            body = await read_body(receive, request.headers)
        except RequestRejected as exc:
            await _send_error(send, exc)
            return None
        receive = _replay(body, receive)
    await endpoint.manager.handle_request(
        dict(scope, **{ACTOR_SCOPE_KEY: request.actor}), receive, _shaped(send)
    )
    return None
