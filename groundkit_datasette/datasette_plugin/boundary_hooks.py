"""The instance boundary's Datasette hooks (adr/0011): the decisions themselves are in
``security/boundary.py``; these wire them to this instance's settings and collections.
The permission hooks, which differ between Datasette 0.65 and 1.0, are in
``surfaces/datasette_compat.py``."""

from __future__ import annotations

import sqlite3

from datasette import hookimpl

from ..indexing.access_lists import connection_is_protected
from ..indexing.schema import APPLICATION_ID
from ..logs import withhold_exception_locals
from ..retrieval.permissions import deny_row_reads
from ..security.boundary import authenticate_scope, authenticator_for, guard
from ..surfaces.datasette_compat import past_csrf_check
from ..surfaces.json_api import MCP_ROUTE
from ..surfaces.service import settings_for
from .live_database import following


@hookimpl(trylast=True)
def asgi_wrapper(datasette):
    """``trylast``: applied last, so the boundary is the outermost wrapper and runs before any
    other plugin's wrapper, route or view. Once it has let a request in, the request is
    routed to the collection versions now published (live_database.py)."""

    def wrap(app):
        inner = following(datasette, app)

        async def accepted(scope, receive, send):
            return await inner(past_csrf_check(scope, MCP_ROUTE), receive, send)

        return guard(datasette, settings_for, accepted)

    return wrap


@hookimpl
def actor_from_request(datasette, request):
    settings = settings_for(datasette)
    if not authenticator_for(datasette, settings).configured:
        return None

    async def inner():
        return (await authenticate_scope(datasette, settings, request.scope)).actor

    return inner


@hookimpl
def prepare_connection(conn, database, datasette):
    """Every read connection Datasette opens to a protected collection version refuses
    column reads (``deny_row_reads``). The permission hooks close Datasette's raw views of
    a protected collection; this holds even when a publish lands after their check, because
    it is decided by the version this connection reads."""
    try:
        if conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
            return
    except sqlite3.Error:
        return
    if connection_is_protected(conn):
        conn.set_authorizer(deny_row_reads)


@hookimpl(tryfirst=True)
def handle_exception(datasette, request, exception):
    """Datasette's default handler prints each exception it handles (404s included) with
    rich's ``show_locals`` when rich is installed: the request's headers, a bearer token and
    the caller's query text would reach the console. Runs before any handler's response is
    made (logs.withhold_exception_locals)."""
    if not getattr(datasette, "pdb", False):
        withhold_exception_locals(exception)
    return None
