"""Datasette plugin entry point (``[project.entry-points.datasette] groundkit``).

Datasette's hooks only: each adapts one hook to the layers below (docs/architecture.md).
Every route comes from the tool table (``surfaces/tools.py``) through
``surfaces/json_api.py``; the instance boundary's hooks are in ``boundary_hooks.py``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from datasette import hookimpl

from ..logs import (
    install_access_log_filter, install_call_log, install_sql_error_redaction, install_stateless_mcp_filter,
    withhold_exception_locals,
)
from ..surfaces.json_api import (  # noqa: F401  (part of the plugin's face)
    HEALTH_ROUTE, MAX_BODY_BYTES, MCP_ROUTE, OPENAPI_ROUTE, health_view, json_view, openapi_view,
    read_body,
)
from ..surfaces.service import registry_for, settings_for  # noqa: F401
from ..surfaces.tools import Tool, all_tools
from .boundary_hooks import actor_from_request, asgi_wrapper, permission_allowed  # noqa: F401  (hooks)
from ..surfaces.datasette_mcp_bridge import register_mcp_tools  # noqa: F401  (datasette-mcp's hook)
from .live_database import CollectionDatabase, follow_collections
from .ui_hooks import render_cell, table_actions  # noqa: F401  (hookimpls must be attributes here)

log = logging.getLogger("groundkit")

def routes_for(tools) -> list[tuple[str, object]]:
    """(regex, view) for every JSON and HTML route in the table and its pages' assets, the MCP
    endpoint, and the two routes that describe the API rather than call it (OpenAPI, health)."""
    from ..surfaces.mcp_server import mcp_http_view
    from ..surfaces.pages import html_view

    routes = []
    for tool in tools:
        routes.append((Tool.route_regex(tool.json_route), json_view(tool)))
        if tool.html_route:
            routes.append((Tool.route_regex(tool.html_route), html_view(tool)))
        for asset in tool.page_assets:  # files a page shows (adr/0027)
            routes.append((asset.regex(), asset.view(tool)))
    routes.append(("^" + MCP_ROUTE + "$", mcp_http_view))
    routes.append(("^" + OPENAPI_ROUTE + "$", openapi_view))
    routes.append(("^" + HEALTH_ROUTE + "$", health_view))
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
    # Every setting checked now, so a typo stops the server with one message rather than
    # failing every request later: names and types, index_dir, embedder and reranker.
    settings = settings_for(datasette)
    settings.check_paths()
    registry_for(datasette).check_models()
    from ..security.boundary import hide_secrets

    hide_secrets(datasette)  # after settings_for: the parsed settings keep the values
    install_access_log_filter()
    install_call_log()
    install_stateless_mcp_filter()
    install_sql_error_redaction()
    withhold_exception_locals()
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
