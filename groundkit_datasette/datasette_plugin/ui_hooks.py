"""Datasette hooks that link its own table and row pages to the groundkit pages.

Datasette 0.65 has no row-actions hook: the ``chunk_id`` cell of a ``chunks``
table links to the chunk page instead, which covers the table and row pages alike.
"""

from __future__ import annotations

import re
import urllib.parse

from datasette import hookimpl
from markupsafe import Markup, escape

from ..indexing.names import NAME_PATTERN
from ..retrieval.models import CHUNK_ID_PATTERN
from ..surfaces.service import registry_for
from ..surfaces.tools import all_tools

_CHUNK_ID = re.compile(CHUNK_ID_PATTERN)


def _is_collection(datasette, database: str) -> bool:
    if not isinstance(database, str) or not NAME_PATTERN.fullmatch(database):
        return False
    return registry_for(datasette).database_path(database) is not None


def _path(datasette, html_route_tool: str, **params) -> str:
    tool = next(t for t in all_tools() if t.name == html_route_tool)
    return datasette.urls.path(tool.path_for_html(**params))


@hookimpl
def table_actions(datasette, actor, database, table, request):
    if table not in ("documents", "chunks") or not _is_collection(datasette, database):
        return None
    return [{"href": _path(datasette, "search", collection=database),
             "label": "Search this collection"}]


@hookimpl
def render_cell(row, value, column, table, database, datasette):
    if column != "chunk_id" or table != "chunks" or not isinstance(value, str):
        return None
    if not _CHUNK_ID.fullmatch(value) or not _is_collection(datasette, database):
        return None
    href = _path(datasette, "fetch_chunk", collection=database,
                 chunk_id=urllib.parse.quote(value, safe=""))
    return Markup('<a href="{}" title="Citation and verification">{}</a>').format(
        href, escape(value))
