"""Every difference between the two Datasette lines groundkit supports (adr/0053).

Datasette 0.65.x and the 1.0 alphas differ where groundkit meets them: how a permission is
asked and answered, how a browser's cross-site POST is refused, how read connections are
cached per thread. Each difference is decided here, once, from the installed version;
nothing else in the package asks which line it runs on. Everything here is Datasette's public
API on its line, but for one call on 0.65 named in ``CollectionVersion``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

from datasette import hookimpl
from datasette.database import Database
from datasette.version import __version__ as DATASETTE_VERSION

from ..indexing.schema import FileIdentity, connect_readonly, is_collection_file
from ..logs import withhold_sql_error
from ..retrieval.permissions import collection_has_acl
from ..security.boundary import RAW_READ_ACTIONS

DATASETTE_1 = int(DATASETTE_VERSION.split(".")[0]) >= 1

# What Datasette's own start-up allows for counting an immutable database's tables.
COUNT_LIMIT_MS = 60 * 60 * 1000
DENY_REASON = "groundkit: a collection with document access lists is read through groundkit only"


# -- asking a permission ---------------------------------------------------------------------


async def can(datasette, actor, action: str, database: str | None = None) -> bool:
    """Whether ``actor`` may do ``action`` (on ``database``), asked the way this line asks."""
    if DATASETTE_1:
        from datasette.resources import DatabaseResource

        resource = DatabaseResource(database) if database is not None else None
        return await datasette.allowed(action=action, resource=resource, actor=actor)
    return await datasette.permission_allowed(actor, action, resource=database, default=True)


# -- which databases are closed to Datasette's raw views ---------------------------------------


def collection_file(db) -> Path | None:
    """The collection file a Datasette database serves, or None for any other database."""
    path = getattr(db, "path", None)
    if not path or getattr(db, "is_memory", False):
        return None
    if isinstance(db, CollectionVersion):  # recognised when it was served (live_database.py)
        return Path(path)
    path = Path(path)
    return path if is_collection_file(path) else None


def closed_databases(datasette, action: str) -> list[str]:
    """The databases whose ``action`` (one of RAW_READ_ACTIONS) groundkit refuses.

    Datasette's table, SQL and download views cannot apply document permissions, so they
    are closed on any collection that has (or had) documents with an access list. The file
    now at the path decides here; the connection that runs the query decides again
    (``retrieval.permissions.deny_row_reads``, installed by the ``prepare_connection`` hook),
    so a publish between the two leaks nothing. A download streams whatever file is at the
    path when it starts, so collections are never downloaded over HTTP. ``--crossdb``
    attaches every file to ``_memory``, outside both checks, so ``_memory`` is closed while
    any attached collection is protected.
    """
    if action not in RAW_READ_ACTIONS:
        return []
    collections = {}
    for name, db in datasette.databases.items():
        path = collection_file(db)
        if path is not None:
            collections[name] = path
    if action == "view-database-download":
        closed = list(collections)
    else:
        closed = [name for name, path in collections.items() if collection_has_acl(path)]
    if closed and action != "view-database-download" and getattr(datasette, "crossdb", False):
        closed.append("_memory")
    return closed


@hookimpl(trylast=True)
def permission_allowed(datasette, actor, action, resource):
    """0.65: the last word on RAW_READ_ACTIONS for a closed database (``trylast``: Datasette
    0.65 keeps the last opinion, so an operator's ``allow`` block cannot reopen it)."""
    if action not in RAW_READ_ACTIONS:
        return None
    database = resource[0] if isinstance(resource, (tuple, list)) else resource
    if not isinstance(database, str):
        return None
    return False if database in closed_databases(datasette, action) else None


def _child_resources(action: str):
    """The resource class whose children ``action`` names on 1.0 (tables, stored queries)."""
    from datasette.resources import QueryResource, TableResource

    return {"view-table": TableResource, "view-query": QueryResource}.get(action)


@hookimpl
def permission_resources_sql(datasette, actor, action):
    """1.0: deny rows for each closed database, at the database level and at each of its
    tables and stored queries. 1.0 lets the most specific rule win and a deny beat an allow
    at the same level, so an operator's table-level ``allow`` cannot reopen a table."""
    if action not in RAW_READ_ACTIONS:
        return None

    async def inner():
        from datasette.permissions import PermissionSQL

        names = closed_databases(datasette, action)
        if not names:
            return None
        params = {f"groundkit_db{i}": name for i, name in enumerate(names)}
        params["groundkit_reason"] = DENY_REASON
        keys = [":" + key for key in params if key != "groundkit_reason"]
        rows = [f"SELECT {key} AS parent, NULL AS child, 0 AS allow, :groundkit_reason AS reason"
                for key in keys]
        children = _child_resources(action)
        if children is not None:
            listed = await children.resources_sql(datasette, actor)
            rows.append(
                "SELECT parent, child, 0 AS allow, :groundkit_reason AS reason "
                f"FROM ({listed}) WHERE parent IN ({', '.join(keys)})"
            )
        return PermissionSQL(sql="\nUNION ALL\n".join(rows), params=params)

    return inner


# -- configuration -----------------------------------------------------------------------------


def datasette_options(metadata: dict, config: dict) -> dict:
    """``Datasette(...)`` keyword arguments for this line from metadata and a configuration.

    1.0 reads plugin settings, permissions and settings from ``datasette.yaml`` (``config=``)
    and titles and descriptions from metadata. 0.65 has no configuration file: plugin
    settings and ``allow`` blocks live in metadata, settings are their own argument.
    """
    if DATASETTE_1:
        return {"metadata": metadata, "config": config}
    config = dict(config)
    settings = config.pop("settings", None)
    merged = _merged(metadata, config)
    return {"metadata": merged, **({"settings": settings} if settings else {})}


def _merged(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


# -- cross-site POSTs ---------------------------------------------------------------------------


def csrf_exempt(scope, mcp_route: str) -> bool:
    """groundkit's JSON API and MCP calls carry no ambient credential a cross-site form could
    forge: a browser cannot send ``application/json`` cross-origin without a CORS preflight.
    Their Origin is decided by the instance boundary (security/boundary.py) instead."""
    if scope.get("type") != "http":
        return False
    path = scope.get("path", "")
    if path == mcp_route:
        return True
    if not path.endswith(".json") or "/-/groundkit/" not in path:
        return False
    headers = dict(scope.get("headers") or [])
    content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
    return content_type == b"application/json"


# The headers 1.0's CrossOriginProtectionMiddleware decides by (datasette/csrf.py).
_CSRF_HEADERS = (b"origin", b"sec-fetch-site")


def past_csrf_check(scope, mcp_route: str):
    """The scope to hand on once the boundary has accepted this request's Origin.

    0.65 asks the ``skip_csrf`` hook. 1.0 has no exemption: its middleware, inside every
    plugin's ASGI wrapper, refuses a browser's cross-site POST by ``Sec-Fetch-Site`` and
    ``Origin``. For an exempt route those two headers are left out of what it sees, so the
    boundary's Origin rule (a loopback page such as the MCP Inspector passes) is the one
    that decides; every other route keeps 1.0's check.
    """
    if not DATASETTE_1 or not csrf_exempt(scope, mcp_route):
        return scope
    headers = [(k, v) for k, v in scope.get("headers") or [] if k.lower() not in _CSRF_HEADERS]
    return dict(scope, headers=headers)


def skip_csrf_hook(mcp_route: str):
    """0.65's ``skip_csrf`` hookimpl for the same routes."""

    @hookimpl
    def skip_csrf(datasette, scope):
        return csrf_exempt(scope, mcp_route)

    return skip_csrf


def _is_open(conn: sqlite3.Connection) -> bool:
    try:
        conn.total_changes
    except sqlite3.ProgrammingError:
        return False
    return True


# -- one published version of a collection file -------------------------------------------------


class CollectionVersion(Database):
    """One published version of a collection file, served immutably (adr/0010, adr/0053).

    A re-ingest publishes a new file by rename; the plugin then serves a new
    ``CollectionVersion`` under the same name (datasette_plugin/live_database.py), so every thread
    opens a connection to the new file and every per-database cache starts empty.
    """

    def __init__(self, ds, path, identity: FileIdentity | None = None):
        super().__init__(ds, path=str(path), is_mutable=False)
        self.identity = identity
        self.closed = threading.Event()
        self._opened: list[sqlite3.Connection] = []
        self._opened_lock = threading.Lock()
        self._threads = threading.local()  # 0.65 only: see execute_fn

    def connect(self, write=False):
        assert not write, "collections are served read-only"
        # mode=ro as well as immutable=1: a file deleted meanwhile is an error, never a new
        # empty file (immutable=1 alone creates one).
        conn = connect_readonly(Path(self.path))
        with self._opened_lock:
            # Connections Datasette closed itself (1.0's per-analysis ones) are let go.
            self._opened = [c for c in self._opened if _is_open(c)] + [conn]
        return conn

    def close(self):
        super().close()
        with self._opened_lock:
            opened = list(self._opened)
        for conn in opened:
            try:
                conn.close()
            except Exception:  # closing is best effort, as in Datasette's own close()
                pass
        self.closed.set()

    async def execute(self, sql, params=None, truncate=False, custom_time_limit=None,
                      page_size=None, log_sql_errors=True):
        # Datasette prints a failed query's SQL, parameters and message to stderr unless asked
        # not to (its public ``log_sql_errors``); a collection's failed query says only that
        # it failed (logs.withhold_sql_error). The error itself still reaches the caller.
        try:
            return await super().execute(sql, params, truncate=truncate,
                                         custom_time_limit=custom_time_limit,
                                         page_size=page_size, log_sql_errors=False)
        except (sqlite3.OperationalError, sqlite3.DatabaseError):
            if log_sql_errors:
                withhold_sql_error()
            raise

    async def table_counts(self, limit=10):
        # Datasette counts an immutable database's tables once, at start-up, with an hour's
        # limit, and caches the result. A new version gets the same: the database page's
        # 10 ms limit would cache a None for every table that was slower.
        if self.cached_table_counts is None:
            limit = max(limit, COUNT_LIMIT_MS)
        return await super().table_counts(limit=limit)

    if not DATASETTE_1:

        async def execute_fn(self, fn):
            """0.65 only: the one private Datasette call left (adr/0059).

            0.65's ``execute_fn`` keeps one read connection per thread keyed by the database
            *name*, so a new version under the same name would be answered by the old file's
            connections; this keeps them per version object, as 1.0 does itself. A connection
            must be prepared as Datasette prepares its own (row factory, text factory, loaded
            extensions, ``cache_size_kb``, every plugin's ``prepare_connection`` hook, crossdb),
            and 0.65 has no public entry point for that: ``_prepare_connection`` is called.
            0.65.x releases are fixes only, and tests/test_live_database.py checks it on
            each line."""

            def in_thread():
                conn = getattr(self._threads, "conn", None)
                if conn is None:
                    conn = self.connect()
                    self.ds._prepare_connection(conn, self.name)
                    self._threads.conn = conn
                return fn(conn)

            if self.ds.executor is None:  # Datasette's non-threaded mode
                return in_thread()
            return await asyncio.get_running_loop().run_in_executor(self.ds.executor, in_thread)
