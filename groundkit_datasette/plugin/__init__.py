"""Datasette plugin entry point (``[project.entry-points.datasette] groundkit``).

Every route comes from the tool table (``tools.py``); this module only adapts
Datasette's hooks to it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

from datasette import hookimpl
from datasette.utils.asgi import Response

from ..surfaces import service
from ..surfaces.service import (
    MalformedBody, RequestRejected, Settings, ToolContext, call_tool, log_call, map_exception,
)
from ..logs import install_access_log_filter, install_call_log
from ..surfaces.tools import Tool, all_tools
from ..security.boundary import actor_from_request, asgi_wrapper, permission_allowed  # noqa: F401  (hooks)
from ..surfaces.datasette_mcp_bridge import register_mcp_tools  # noqa: F401  (datasette-mcp's hook)
from .live_database import CollectionDatabase, follow_collections
from .ui_hooks import render_cell, table_actions  # noqa: F401  (hookimpls must be attributes here)

log = logging.getLogger("groundkit")

MAX_BODY_BYTES = service.LIMITS["max_body_bytes"][0]  # the default of the max_body_bytes setting
MAX_QUERY_FIELDS = 5000  # query parameters per GET (a vector takes one per dimension)
MCP_ROUTE = "/-/groundkit/mcp"
OPENAPI_ROUTE = "/-/groundkit/openapi.json"
HEALTH_ROUTE = "/-/groundkit/health"
PLUGIN = "groundkit"


def settings_for(datasette) -> Settings:
    cached = getattr(datasette, "_groundkit_settings", None)
    if cached is None:
        cached = Settings.from_config(datasette.plugin_config(PLUGIN))
        datasette._groundkit_settings = cached
    return cached


def registry_for(datasette) -> service.Registry:
    reg = getattr(datasette, "_groundkit_registry", None)
    if reg is None:
        reg = service.Registry(datasette, settings_for(datasette))
        datasette._groundkit_registry = reg
    return reg


def _json(body, status=200, request_id=None) -> Response:
    response = Response.json(body, status=status)
    if request_id:
        response.headers["X-Request-ID"] = request_id
    if status == 503:
        response.headers["Retry-After"] = str(service.BUSY_RETRY_AFTER)
    return response


def _too_large(limit: int) -> RequestRejected:
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
            raise _too_large(limit)
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        body = message.get("body", b"")
        size += len(body)
        if size > limit:
            raise _too_large(limit)
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
            raise MalformedBody("unknown query parameters are not allowed")
        if _is_list_field(field):
            arguments.setdefault(name, []).append(value)
        elif name in arguments:
            raise MalformedBody(f"{name}: given more than once")
        else:
            arguments[name] = value
    return arguments


def _json_view(tool: Tool):
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
        return _json(response.model_dump(mode="json"), 200, ctx.request_id)

    view.__name__ = f"groundkit_{tool.name}_json"
    return view


def routes_for(tools) -> list[tuple[str, object]]:
    """(regex, view) for every JSON and HTML route in the table, the MCP endpoint, and the
    two routes that describe the API rather than call it (OpenAPI, health)."""
    from ..surfaces.pages import html_view
    from ..surfaces.mcp_server import mcp_http_view

    routes = []
    for tool in tools:
        routes.append((Tool.route_regex(tool.json_route), _json_view(tool)))
        if tool.html_route:
            routes.append((Tool.route_regex(tool.html_route), html_view(tool)))
    routes.append(("^" + MCP_ROUTE + "$", mcp_http_view))
    routes.append(("^" + OPENAPI_ROUTE + "$", openapi_view))
    routes.append(("^" + HEALTH_ROUTE + "$", health_view))
    return routes


async def openapi_view(datasette, request):
    from ..surfaces.openapi import openapi_document

    if request.method != "GET":
        return _json({"ok": False, "error": "method_not_allowed", "detail": "use GET"}, 405)
    return _json(openapi_document(all_tools(), settings_for(datasette)))


async def health_view(datasette, request):
    """Liveness only: reads no collection, loads no model (a probe must stay cheap)."""
    if request.method != "GET":
        return _json({"ok": False, "error": "method_not_allowed", "detail": "use GET"}, 405)
    return _json({"ok": True})


@hookimpl
def register_routes(datasette):
    return routes_for(all_tools())


@hookimpl
def skip_csrf(datasette, scope):
    """JSON API and MCP calls carry no ambient credentials a cross-site form could forge:
    a browser cannot send ``application/json`` cross-origin without a CORS preflight."""
    if scope.get("type") != "http":
        return False
    path = scope.get("path", "")
    if path == MCP_ROUTE:
        return True
    if not path.endswith(".json") or "/-/groundkit/" not in path:
        return False
    headers = dict(scope.get("headers") or [])
    content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
    return content_type == b"application/json"


@hookimpl
def startup(datasette):
    # Every setting checked now, so a typo stops the server with one message rather than
    # failing every request later: names and types, index_dir, embedder and reranker.
    settings = settings_for(datasette)
    settings.check_paths()
    registry_for(datasette).check_models()
    from ..security.boundary import hide_secrets

    hide_secrets(datasette)  # after settings_for: the parsed settings keep the values
    install_access_log_filter()
    install_call_log()
    from ..security.boundary import startup_checks

    startup_checks(settings)

    async def inner():
        follow_collections(datasette)
        if settings.index_dir is not None:
            attach_index_dir(datasette, settings.index_dir)
        # Not awaited: Datasette starts serving while models load in the background.
        asyncio.get_running_loop().run_in_executor(None, registry_for(datasette).warm)

    return inner


def attach_index_dir(datasette, index_dir: Path) -> list[str]:
    """Add every collection in ``index_dir`` as an immutable database."""
    from ..retrieval.collection import list_collections

    added = []
    for name in list_collections(index_dir).collections:
        if name in datasette.databases:
            continue
        path = Path(index_dir) / f"{name}.sqlite3"
        datasette.add_database(CollectionDatabase(datasette, path), name=name)
        added.append(name)
    return added


@hookimpl
def menu_links(datasette, actor, request):
    return [{"href": datasette.urls.path("/-/groundkit"), "label": "Search collections"}]
