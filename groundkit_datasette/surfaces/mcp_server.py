"""The tool table served over MCP: the server both transports run (``mcp_stdio``,
``mcp_http``), each call's result and the checks of a raw JSON-RPC message.

Every MCP tool is a row of ``tools.all_tools()`` (its definition: ``mcp_schema``): the same
request model validates the arguments, ``service.call_tool`` runs it with the caller's
Datasette actor, and ``service.map_exception`` shapes every failure, so the MCP surface
answers exactly what the JSON API answers.
"""

from __future__ import annotations

import json
import logging
import uuid
from importlib.metadata import PackageNotFoundError, version

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from . import serialize, service, strictjson
from .mcp_schema import INSTRUCTIONS, CollectionArgument, mcp_tool
from .service import ToolContext, map_exception, registry_for
from .tools import Tool, all_tools

log = logging.getLogger("groundkit.mcp")
access_log = logging.getLogger("groundkit.access")

SURFACE_STDIO = "mcp-stdio"
SURFACE_HTTP = "mcp-http"

# Set by ``mcp_http.mcp_http_view`` on the ASGI scope it hands the SDK; the SDK hands that
# request back to the tool handler, which is how the HTTP caller's actor gets there.
ACTOR_SCOPE_KEY = "groundkit.actor"
# Set there too: the HTTP request's id, which the tool call then logs and answers.
REQUEST_ID_SCOPE_KEY = "groundkit.request_id"
STATUS_META_KEY = "groundkit/status"
ERROR_META_KEY = "groundkit/error"


# -- results ------------------------------------------------------------------


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
                CollectionArgument.model_validate(given)  # raises, worded like any field
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


def rpc_error(message_id, code: int, message: str, request_id: str) -> dict:
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
        return None, rpc_error(_message_id(exc.value), types.PARSE_ERROR,
                                "parse error: the message is not valid UTF-8 JSON", request_id)
    except strictjson.TooDeep as exc:
        return None, rpc_error(_message_id(exc.value), types.INVALID_REQUEST,
                                f"invalid request: JSON nested more than {strictjson.MAX_DEPTH} levels deep",
                                request_id)
    if isinstance(value, dict) and "id" in value and not _valid_id(value["id"]):
        return None, rpc_error(None, types.INVALID_REQUEST,
                                "invalid request: the id must be an integer or a string", request_id)
    try:
        types.jsonrpc_message_adapter.validate_python(value, by_name=False)
    except ValidationError:
        return None, rpc_error(_message_id(value), types.INVALID_REQUEST,
                                "invalid request: not a JSON-RPC 2.0 message", request_id)
    return value, None


def log_refusal(request_id: str, surface: str, status, kind: str) -> None:
    """One access line for a message refused before any tool ran, in the shape of the others."""
    from ..logs import REQUEST_LINE

    method, route = REQUEST_LINE.get()
    access_log.info("request_id=%s method=%s route=%s surface=%s refused status=%s error=%s",
                    request_id, method, route, surface, status, kind)


RPC_KINDS = {types.PARSE_ERROR: "parse_error", types.INVALID_REQUEST: "invalid_request"}


def drop_error_data(message) -> bool:
    """Drop ``error.data`` of a JSON-RPC error the SDK wrote: it puts request input there
    (an unknown method's name). Our tool errors travel as results, not here."""
    if isinstance(message, dict) and isinstance(message.get("error"), dict) and "data" in message["error"]:
        del message["error"]["data"]
        return True
    return False
