"""The instance boundary's Datasette hooks (adr/0011): the decisions themselves are in
``security/boundary.py``; these wire them to this instance's settings and collections."""

from __future__ import annotations

from datasette import hookimpl

from ..retrieval.permissions import collection_has_acl
from ..security.boundary import RAW_READ_ACTIONS, authenticate_scope, authenticator_for, guard
from ..surfaces.service import registry_for, settings_for


@hookimpl(trylast=True)
def asgi_wrapper(datasette):
    """``trylast``: applied last, so the boundary is the outermost wrapper and runs before any
    other plugin's wrapper, route or view."""

    def wrap(app):
        return guard(datasette, settings_for, app)

    return wrap


@hookimpl
def actor_from_request(datasette, request):
    settings = settings_for(datasette)
    if not authenticator_for(datasette, settings).configured:
        return None

    async def inner():
        return (await authenticate_scope(datasette, settings, request.scope)).actor

    return inner


@hookimpl(trylast=True)
def permission_allowed(datasette, actor, action, resource):
    """Datasette's table, SQL and download views cannot apply document permissions, so
    they are closed on any collection that has (or had) documents with an access list.

    The file now at the path decides here; the connection that runs the query decides
    again (``retrieval.permissions.deny_row_reads``), so a publish between the two leaks nothing. A download
    streams whatever file is at the path when it starts, so collections are never
    downloaded over HTTP. ``--crossdb`` attaches every file to ``_memory``, outside both
    checks, so ``_memory`` SQL is closed while any attached collection is protected.
    """
    if action not in RAW_READ_ACTIONS:
        return None
    database = resource[0] if isinstance(resource, (tuple, list)) else resource
    if not isinstance(database, str):
        return None
    registry = registry_for(datasette)
    if database == "_memory" and getattr(datasette, "crossdb", False):
        if any(collection_has_acl(registry.database_path(n)) for n in registry.candidate_names()):
            return False
        return None
    path = registry.database_path(database)
    if path is None:
        return None
    if action == "view-database-download":
        return False
    if not collection_has_acl(path):
        return None
    return False
