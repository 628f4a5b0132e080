"""Datasette plugin entry point (``[project.entry-points.datasette] groundkit``).

Every route comes from the tool table (``tools.py``); this module only adapts
Datasette's hooks to it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from datasette import hookimpl
from datasette.utils.asgi import Response

from .. import service
from ..service import MalformedBody, RequestRejected, Settings, ToolContext, call_tool, map_exception
from ..logs import install_access_log_filter, install_call_log
from ..tools import Tool, all_tools
from ..access import actor_from_request, asgi_wrapper, permission_allowed  # noqa: F401  (hooks)
from ..datasette_mcp_bridge import register_mcp_tools  # noqa: F401  (datasette-mcp's hook)
from .live_database import CollectionDatabase, follow_collections
from .ui_hooks import render_cell, table_actions  # noqa: F401  (hookimpls must be attributes here)

log = logging.getLogger("groundkit")

MAX_BODY_BYTES = 256 * 1024
MCP_ROUTE = "/-/groundkit/mcp"
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
    return response


async def read_body(receive, headers) -> bytes:
    """The request body, refused with 413 past MAX_BODY_BYTES by header and by bytes received."""
    declared = headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > MAX_BODY_BYTES:
                raise RequestRejected(413, "payload_too_large", "request body exceeds 256 KiB")
        except ValueError:
            raise RequestRejected(400, "invalid_request", "invalid Content-Length") from None
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        body = message.get("body", b"")
        size += len(body)
        if size > MAX_BODY_BYTES:
            raise RequestRejected(413, "payload_too_large", "request body exceeds 256 KiB")
        chunks.append(body)
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _parse_json_object(raw: bytes) -> dict:
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise MalformedBody("request body must be a JSON object") from None
    if not isinstance(value, dict):
        raise MalformedBody("request body must be a JSON object")
    return value


def _json_view(tool: Tool):
    async def view(datasette, request, receive):
        ctx = ToolContext(registry_for(datasette), request.actor, "json")
        collection = request.url_vars.get("collection")
        try:
            if tool.method == "POST":
                if request.method != "POST":
                    raise RequestRejected(405, "method_not_allowed", f"use POST for {tool.name}")
                arguments = _parse_json_object(await read_body(receive, request.headers))
            else:
                if request.method != "GET":
                    raise RequestRejected(405, "method_not_allowed", f"use GET for {tool.name}")
                arguments = {}
            for param in tool.path_params:
                arguments[param] = request.url_vars[param]
        except Exception as exc:
            error = map_exception(exc)
            return _json(error.body(ctx.request_id), error.status, ctx.request_id)
        response, error = await call_tool(tool, ctx, collection, arguments)
        if error is not None:
            return _json(error.body(ctx.request_id), error.status, ctx.request_id)
        return _json(response.model_dump(mode="json"), 200, ctx.request_id)

    view.__name__ = f"groundkit_{tool.name}_json"
    return view


def routes_for(tools) -> list[tuple[str, object]]:
    """(regex, view) for every JSON and HTML route in the table, plus the MCP endpoint."""
    from ..pages import html_view
    from ..mcp_server import mcp_http_view

    routes = []
    for tool in tools:
        routes.append((Tool.route_regex(tool.json_route), _json_view(tool)))
        if tool.html_route:
            routes.append((Tool.route_regex(tool.html_route), html_view(tool)))
    routes.append(("^" + MCP_ROUTE + "$", mcp_http_view))
    return routes


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
    settings = settings_for(datasette)  # fails start-up on unknown settings
    from ..access import hide_secrets

    hide_secrets(datasette)  # after settings_for: the parsed settings keep the values
    install_access_log_filter()
    install_call_log()
    from ..access import startup_checks

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
    from ..collection import list_collections

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
