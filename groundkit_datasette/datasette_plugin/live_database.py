"""Datasette's own pages follow a re-ingest without a restart (adr/0010, adr/0053).

Datasette keeps one ``immutable=1`` connection per executor thread and database. Ingest
publishes by rename (adr/0002), so a connection opened before the publish keeps reading the
old file. Each published version is therefore its own Datasette ``Database``
(``CollectionVersion``): before a request is routed, the file's identity is compared with
the served version's (one ``stat`` per collection), and a new version replaces the old under
the same name and route by a new ``datasette.databases`` mapping, as ``add_database`` assigns
one. Every thread then connects to the new file, and every cache (table counts, hash, size)
starts empty. The old version is closed after a grace period, for the queries in flight.

A collection whose file is gone, or is no longer a collection, is taken out of the mapping
(its pages answer 404) and comes back when a collection is published there again: no read
ever creates a file at its path.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from ..indexing.schema import FileIdentity, is_collection_file
from ..surfaces.datasette_compat import CollectionVersion

log = logging.getLogger("groundkit")

# How long a replaced version stays open for the queries already running on it. Datasette's
# own time limit for one query is a second by default (sql_time_limit_ms).
GRACE_SECONDS = 30.0


def _identity(path: Path) -> FileIdentity | None:
    try:
        return FileIdentity.of(path)
    except OSError:
        return None


class LiveCollections:
    """The collections one Datasette instance follows: name -> (path, route)."""

    def __init__(self, datasette):
        self.datasette = datasette
        self.followed: dict[str, tuple[Path, str]] = {}

    def follow(self, name: str, path: Path, route: str | None = None) -> None:
        self.followed[name] = (Path(path), route or name)

    def refresh(self) -> list[str]:
        """Serve the version now at each followed path; returns the names that changed."""
        databases = self.datasette.databases
        changes: dict[str, CollectionVersion | None] = {}
        for name, (path, _route) in self.followed.items():
            db = databases.get(name)
            identity = _identity(path)
            if isinstance(db, CollectionVersion) and db.identity == identity:
                continue
            if db is not None and not isinstance(db, CollectionVersion) and (
                    not db.path or Path(db.path) != path):
                continue  # the name now serves another file: an operator's choice
            if identity is None or not is_collection_file(path):
                if db is not None:
                    changes[name] = None
                continue
            changes[name] = CollectionVersion(self.datasette, path, identity)
        if changes:
            self._swap(changes)
        return list(changes)

    def _swap(self, changes: dict) -> None:
        old_mapping = self.datasette.databases
        mapping = {}
        for name, db in old_mapping.items():
            if name in changes:
                if changes[name] is not None:
                    mapping[name] = self._named(changes[name], name)
            else:
                mapping[name] = db
        for name, new in changes.items():  # a collection published again after it was gone
            if new is not None and name not in mapping:
                mapping[name] = self._named(new, name)
        # One new mapping in the same order (the index page and get_database() follow it),
        # assigned whole as Datasette's add_database does.
        self.datasette.databases = mapping
        for name in changes:
            old = old_mapping.get(name)
            if old is not None:
                retire(old)

    def _named(self, db, name):
        db.name, db.route = name, self.followed[name][1]
        return db


def retire(db) -> None:
    """Close a replaced version once the queries already running on it are done."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        db.close()
        return
    # In a thread: 1.0's close() waits for the version's pending queries.
    loop.call_later(GRACE_SECONDS, lambda: loop.run_in_executor(None, db.close))


def live_collections(datasette) -> LiveCollections:
    live = getattr(datasette, "_groundkit_live", None)
    if live is None:
        live = LiveCollections(datasette)
        datasette._groundkit_live = live
    return live


def follow_collections(datasette) -> list[str]:
    """Serve every collection database as a ``CollectionVersion`` and follow its file.

    A collection is recognised by its application id, not by how Datasette was started:
    ``datasette x.sqlite3`` (a positional, mutable file) is served immutably too, so its
    pages follow a re-ingest and nothing can write to it.
    """
    live = live_collections(datasette)
    for name, db in datasette.databases.items():
        if name in live.followed or db.is_memory or not db.path:
            continue
        if isinstance(db, CollectionVersion) or is_collection_file(Path(db.path)):
            live.follow(name, Path(db.path), db.route)
    return live.refresh()


def add_collection(datasette, name: str, path: Path) -> None:
    """Serve the collection file at ``path`` as database ``name`` and follow it."""
    live = live_collections(datasette)
    live.follow(name, path)
    live.refresh()


def following(datasette, app):
    """``app``, with each request routed to the collection versions now published."""

    async def follow(scope, receive, send):
        if scope.get("type") in ("http", "websocket"):
            live = getattr(datasette, "_groundkit_live", None)
            if live is not None and live.followed:
                live.refresh()
        return await app(scope, receive, send)

    return follow
