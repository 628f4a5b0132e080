"""The tool table over MCP's streamable HTTP transport: ``/-/groundkit/mcp`` inside Datasette.

The SDK's ``StreamableHTTPSessionManager`` serves it, stateless, with JSON answers. Around
it: the body limit and malformed messages are answered here first, the SDK's own refusals
are re-worded in the JSON API's error shape (they quote input back), and every answer
carries the request's ``X-Request-ID``.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import uuid

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from . import mcp_direct
from ..logs import IN_STATELESS_MCP
from .mcp_server import (
    ACTOR_SCOPE_KEY, REQUEST_ID_SCOPE_KEY, RPC_KINDS, SURFACE_HTTP, answer_call, build_server,
    drop_error_data, log_refusal, parse_message,
)
from .service import RequestRejected, map_exception
from .tools import all_tools

log = logging.getLogger("groundkit.mcp")

# Kept beside the SDK's transport: MCP p50 over HTTP 30-49% lower (adr/0058, benchmarks/mcp_paths.py).
# False: every HTTP call goes through the SDK's stateless transport (the parity tests' oracle).
DIRECT_CALLS = True


def _without_error_data(body: bytes) -> bytes:
    if b'"error"' not in body:  # no error member: skip parsing a whole result (5-50 KB)
        return body
    try:
        data = json.loads(body)
    except ValueError:
        return body
    return json.dumps(data, separators=(",", ":")).encode("utf-8") if drop_error_data(data) else body


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
    log_refusal(request_id, SURFACE_HTTP, error.status, error.kind)
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
                log_refusal(request_id, SURFACE_HTTP, status, "json_rpc_error")
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
        log_refusal(request_id, SURFACE_HTTP, 400, RPC_KINDS.get(refusal["error"]["code"], "invalid_request"))
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
