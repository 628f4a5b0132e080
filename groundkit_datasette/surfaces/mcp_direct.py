"""A stateless JSON ``tools/call`` answered in the request's own task (adr/0058; first adr/0043).

For the handshake-era protocol versions (2024-11-05 to 2025-11-25) the SDK's
stateless manager builds a transport, memory streams, a dispatcher task and a
server runner for every POST, then tears them down: 1.5-2.8 ms a call on a slow
CPU, more than the search itself. A call whose params hold only a known tool's
``name`` and an ``arguments`` object needs none of it: there is no session, no
back channel and nothing for the SDK's params check to refuse. Such a call goes
straight to our handler, and its result is shaped by the SDK's own per-version
result check (``serialize_server_result``). Anything else (another method, an
unknown tool, ``_meta``, odd headers, a newer protocol version) returns False
having sent nothing, and the SDK answers it. tests/test_mcp_direct.py holds the
two answers equal, request by request.
"""

from __future__ import annotations

import logging

from mcp_types import DEFAULT_NEGOTIATED_VERSION, INTERNAL_ERROR
from mcp_types import methods as _methods
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from mcp.server.streamable_http import check_accept_headers
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from pydantic import ValidationError
from starlette.requests import Request

from . import serialize

log = logging.getLogger("groundkit.mcp")

_VERSION_HEADER = MCP_PROTOCOL_VERSION_HEADER.lower().encode("ascii")
_JSON = [(b"content-type", b"application/json")]


def _version(scope) -> str | None | bool:
    """The protocol version header as the SDK's manager reads it (the first one); False
    for a version the SDK routes elsewhere (2026-07-28, or one it does not know)."""
    found = next((v.decode("latin-1") for k, v in scope["headers"] if k == _VERSION_HEADER), None)
    if found is not None and found not in HANDSHAKE_PROTOCOL_VERSIONS:
        return False
    return found


def _plain_json_post(scope) -> bool:
    """The headers on which the SDK's transport goes straight to the call: JSON accepted, and
    sent as exactly ``application/json``; any other case is the SDK's to answer."""
    request = Request(scope)
    content_type = request.headers.get("content-type", "")
    # Both of the SDK's checks: its security middleware's prefix test (no leading space)
    # and its transport's media type.
    return (content_type.startswith("application/json") and content_type.split(";")[0].strip() == "application/json"
            and check_accept_headers(request)[0])


def plain_call(message, tool_names) -> tuple[str, dict] | None:
    """``(tool name, arguments)`` of a ``tools/call`` request whose params are only those two."""
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return None
    if not message.keys() <= {"jsonrpc", "id", "method", "params"}:  # the SDK may read it as another kind
        return None
    if type(message.get("id")) not in (int, str):  # the SDK would coerce 1.0 to 1, say
        return None
    params = message.get("params")
    if not isinstance(params, dict) or not params.keys() <= {"name", "arguments"}:
        return None
    name, arguments = params.get("name"), params.get("arguments", {})
    if not isinstance(name, str) or name not in tool_names or not isinstance(arguments, dict):
        return None
    return name, arguments


async def answer(message, tool_names, call, scope, send) -> bool:
    """Answer ``message`` (one parsed JSON-RPC message) through ``send`` if it is a plain
    ``tools/call``; False, having sent nothing, otherwise. ``call(name, arguments)`` returns
    the tool's ``CallToolResult`` and never raises (``mcp_server.answer_call``)."""
    found = plain_call(message, tool_names)
    if found is None:
        return False
    version = _version(scope)
    if version is False or not _plain_json_post(scope):
        return False
    result = await call(*found)
    try:
        # What the SDK's runner does with a handler's result: dump it, then let the
        # protocol version's schema validate and sieve it.
        reply = {"result": _methods.serialize_server_result(
            "tools/call", version or DEFAULT_NEGOTIATED_VERSION,
            result.model_dump(by_alias=True, mode="json", exclude_none=True))}
    except ValidationError:  # the SDK's words for the same defect; the detail is logged only
        log.exception("MCP tools/call returned an invalid result")
        reply = {"error": {"code": INTERNAL_ERROR, "message": "Handler returned an invalid result"}}
    body = serialize.dumps({"jsonrpc": "2.0", "id": message["id"], **reply})
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode()), *_JSON]})
    await send({"type": "http.response.body", "body": body})
    return True
