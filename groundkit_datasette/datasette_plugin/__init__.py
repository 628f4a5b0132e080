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

from ..logs import install_access_log_filter, install_call_log, install_stateless_mcp_filter
from ..surfaces.json_api import (  # noqa: F401  (part of the plugin's face)
    HEALTH_ROUTE, MAX_BODY_BYTES, MCP_ROUTE, OPENAPI_ROUTE, health_view, json_view, openapi_view,
    read_body,
)
from ..surfaces.service import registry_for, settings_for  # noqa: F401
from ..surfaces.tools import Tool, all_tools
from ..surfaces import datasette_compat
from .boundary_hooks import (  # noqa: F401  (hooks)
    actor_from_request, asgi_wrapper, handle_exception, prepare_connection,
)
from ..surfaces.datasette_mcp_bridge import register_mcp_tools  # noqa: F401  (datasette-mcp's hook)
from .live_database import add_collection, follow_collections
from .ui_hooks import render_cell, table_actions  # noqa: F401  (hookimpls must be attributes here)

log = logging.getLogger("groundkit")

def routes_for(tools) -> list[tuple[str, object]]:
    """(regex, view) for every JSON and HTML route in the table and its pages' assets, the MCP
    endpoint, and the two routes that describe the API rather than call it (OpenAPI, health)."""
    from ..surfaces.mcp_http import mcp_http_view
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


# The hooks whose names differ between Datasette's lines (surfaces/datasette_compat.py).
if datasette_compat.DATASETTE_1:
    permission_resources_sql = datasette_compat.permission_resources_sql
else:
    permission_allowed = datasette_compat.permission_allowed
    skip_csrf = datasette_compat.skip_csrf_hook(MCP_ROUTE)


@hookimpl
def startup(datasette):
    # Every setting checked now, so a typo stops the server with one message rather than
    # failing every request later: names and types, index_dir, embedder and reranker.
    settings = settings_for(datasette)
    settings.check_paths()
    registry_for(datasette).check_models()
    install_access_log_filter()
    install_call_log()
    install_stateless_mcp_filter()
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
    """Add every collection in ``index_dir`` as an immutable database, followed across
    re-ingests (live_database.py)."""
    from ..retrieval.collection import list_collections

    added = []
    for name in list_collections(index_dir).collections:
        if name in datasette.databases:
            continue
        add_collection(datasette, name, Path(index_dir) / f"{name}.sqlite3")
        added.append(name)
    return added


@hookimpl
def menu_links(datasette, actor, request):
    return [{"href": datasette.urls.path("/-/groundkit"), "label": "Search collections"}]
