"""The JSON API: one route per tool of the table, GET and POST validated by the same
request model, bodies bounded and parsed strictly, errors in the one shape; plus the
routes that describe the API (OpenAPI) and the process (health)."""

from __future__ import annotations

import difflib
import json
import logging
import time

from datasette.utils.asgi import Response

from . import serialize, service
from .service import (
    MalformedBody, RequestRejected, ToolContext, call_tool, log_call, map_exception,
    registry_for, settings_for,
)
from .tools import Tool, all_tools

log = logging.getLogger("groundkit")

MAX_BODY_BYTES = service.LIMITS["max_body_bytes"][0]  # the default of the max_body_bytes setting
MAX_QUERY_FIELDS = 5000  # query parameters per GET (a vector takes one per dimension)
MCP_ROUTE = "/-/groundkit/mcp"
OPENAPI_ROUTE = "/-/groundkit/openapi.json"
HEALTH_ROUTE = "/-/groundkit/health"


def _json(body, status=200, request_id=None) -> Response:
    """``body``: a JSON-ready value, or the bytes ``serialize.body`` wrote."""
    if isinstance(body, bytes):
        response = Response(body, status=status, content_type="application/json; charset=utf-8")
    else:
        response = Response.json(body, status=status)
    if request_id:
        response.headers["X-Request-ID"] = request_id
    if status == 503:
        response.headers["Retry-After"] = str(service.BUSY_RETRY_AFTER)
    return response


def too_large(limit: int) -> RequestRejected:
    size = f"{limit // 1024} KiB" if limit % 1024 == 0 else f"{limit} bytes"
    return RequestRejected(413, "payload_too_large", f"request body exceeds {size}")


async def read_body(receive, headers, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request body, refused with 413 past ``limit`` by header and by bytes received."""
    declared = headers.get("content-length")
    if declared is not None:
        try:
            declared_size = int(declared)
        except ValueError:
            raise RequestRejected(400, "invalid_request", "invalid Content-Length") from None
        if declared_size > limit:
            raise too_large(limit)
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        body = message.get("body", b"")
        size += len(body)
        if size > limit:
            raise too_large(limit)
        chunks.append(body)
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _parse_json_object(raw: bytes) -> dict:
    """A JSON object, or MalformedBody (fixed text) for anything else: invalid UTF-8,
    nesting too deep for the parser, lone surrogates, a non-object."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
        # Lone surrogates parse (as "\ud800" escapes) but are not text: refuse them here,
        # before they reach a tokenizer or a log line.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (ValueError, UnicodeError, RecursionError):
        raise MalformedBody("request body must be a JSON object of UTF-8 text") from None
    if not isinstance(value, dict):
        raise MalformedBody("request body must be a JSON object")
    return value


def _is_list_field(field) -> bool:
    import types
    import typing

    hint = field.annotation
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    return any(typing.get_origin(a) is list for a in (typing.get_args(hint) if union else (hint,)))


def query_arguments(tool: Tool, query_string: str) -> dict:
    """GET parameters as the request model's fields: the same validation as a POST body.

    A list field (``vector``) takes the parameter once per element; any other field
    given twice, an unknown parameter or a path parameter in the query is refused.
    """
    from urllib.parse import parse_qsl

    try:
        pairs = parse_qsl(query_string, keep_blank_values=True, strict_parsing=False,
                          errors="strict", max_num_fields=MAX_QUERY_FIELDS)
    except UnicodeError:
        raise MalformedBody("query parameters must be UTF-8 text") from None
    except ValueError:  # past max_num_fields
        raise MalformedBody("too many query parameters") from None
    fields = tool.request_model.model_fields
    arguments: dict = {}
    for name, value in pairs:
        field = fields.get(name)
        if field is None or name in tool.path_params:
            raise MalformedBody(_unknown_parameter(name, fields, tool.path_params))
        if _is_list_field(field):
            arguments.setdefault(name, []).append(value)
        elif name in arguments:
            raise MalformedBody(f"{name}: given more than once")
        else:
            arguments[name] = value
    return arguments


def _unknown_parameter(name: str, fields, path_params) -> str:
    """Names the parameter when it is a likely slip for a field (``q`` for ``query``), and
    the parameters the route takes otherwise: an unknown name is never repeated back (a
    query string's names can carry data too)."""
    if name in path_params:
        return f"{name} is part of the path, not a query parameter"
    known = [f for f in fields if f not in path_params]
    guess = [f for f in known if f.startswith(name)] or difflib.get_close_matches(name, known, 1)
    if name and guess:
        return f"unknown query parameter: {name} (did you mean {guess[0]}?)"
    if not known:
        return "unknown query parameter: this route takes none"
    return "unknown query parameter: the parameters are " + ", ".join(known)


def json_view(tool: Tool):
    async def view(datasette, request, receive):
        ctx = ToolContext(registry_for(datasette), request.actor, "json")
        collection = request.url_vars.get("collection")
        started = time.perf_counter()
        try:
            # POST tools also answer GET with query parameters; GET tools take no body.
            allowed = ("GET", "POST") if tool.method == "POST" else ("GET",)
            if request.method not in allowed:
                raise RequestRejected(405, "method_not_allowed",
                                      f"use {' or '.join(allowed)} for {tool.name}")
            if request.method == "POST":
                limit = settings_for(datasette).max_body_bytes
                arguments = _parse_json_object(await read_body(receive, request.headers, limit))
            else:
                arguments = query_arguments(tool, request.query_string)
            for param in tool.path_params:
                arguments[param] = request.url_vars[param]
        except Exception as exc:
            error = map_exception(exc)
            # Refused before the tool ran: still one access line with the request id.
            log_call(ctx, tool.name, error.status, started)
            return _json(error.body(ctx.request_id), error.status, ctx.request_id)
        response, error = await call_tool(tool, ctx, collection, arguments)
        if error is not None:
            return _json(error.body(ctx.request_id), error.status, ctx.request_id)
        return _json(serialize.body(response), 200, ctx.request_id)

    view.__name__ = f"groundkit_{tool.name}_json"
    return view


async def openapi_view(datasette, request):
    from .openapi import openapi_document

    if request.method != "GET":
        return _json({"ok": False, "error": "method_not_allowed", "detail": "use GET"}, 405)
    return _json(openapi_document(all_tools(), settings_for(datasette)))


async def health_view(datasette, request):
    """Liveness only: reads no collection, loads no model (a probe must stay cheap)."""
    if request.method != "GET":
        return _json({"ok": False, "error": "method_not_allowed", "detail": "use GET"}, 405)
    return _json({"ok": True})


