"""Datasette's own pages follow a re-ingest without a restart.

Datasette keeps one ``immutable=1`` connection per executor thread and
database. Ingest publishes by rename (adr/0002), so a connection opened
before the publish keeps reading the old file. A thread that connects later
reads the new one, so different requests would disagree until a restart.
``CollectionDatabase`` stats the file before each query (one ``stat``).
After a publish, every thread reconnects on its next query, and the cached
table counts are dropped.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from datasette.database import Database

from ..collection.access_lists import connection_is_protected
from ..collection.schema import FileIdentity
from ..retrieval.permissions import deny_row_reads
from ..collection.schema import connect_readonly, is_collection_file


# What Datasette's own start-up allows for counting an immutable database's tables.
COUNT_LIMIT_MS = 60 * 60 * 1000


def _identity(path) -> FileIdentity | None:
    try:
        return FileIdentity.of(Path(path))
    except OSError:
        return None  # gone: keep serving what is open; never create a file by connecting


class CollectionDatabase(Database):
    """An immutable Datasette database whose file an ingest may replace by rename."""

    def __init__(self, ds, path):
        super().__init__(ds, path=str(path), is_mutable=False)
        self._identity = _identity(path)
        self._epoch = 0
        self._local = threading.local()

    def connect(self, write=False):
        assert not write, "collections are served read-only"
        # mode=ro as well as immutable=1: a missing file is an error, not a new empty file.
        conn = connect_readonly(Path(self.path))
        self._all_file_connections.append(conn)
        return conn

    def _current_epoch(self) -> int:
        identity = _identity(self.path)
        if identity is not None and identity != self._identity:
            self._identity = identity
            self._epoch += 1
            self.cached_hash = None
            self.cached_size = None
            self._cached_table_counts = None
        return self._epoch

    def _connection(self, epoch: int):
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is None or local.epoch != epoch:
            if conn is not None:  # only this thread ever used it
                conn.close()
                try:
                    self._all_file_connections.remove(conn)
                except ValueError:
                    pass
            conn = self.connect()
            if connection_is_protected(conn):
                # Datasette's raw views are closed on protected collections by
                # permission_allowed; this holds even when a publish lands after that check.
                conn.set_authorizer(deny_row_reads)
            self.ds._prepare_connection(conn, self.name)
            local.conn, local.epoch = conn, epoch
        return conn

    async def table_counts(self, limit=10):
        # Datasette counts an immutable database's tables once, at start-up, with an hour's
        # limit, and caches the result. A fresh version gets the same treatment: the
        # database page's 10 ms limit would cache a None for every table that was slower.
        if self.cached_table_counts is None:
            limit = max(limit, COUNT_LIMIT_MS)
        epoch = self._current_epoch()
        counts = await super().table_counts(limit=limit)
        if self._epoch != epoch:  # a publish landed between the counts: cache none of them
            self._cached_table_counts = None
        return counts

    async def execute_fn(self, fn):
        epoch = self._current_epoch()
        if self.ds.executor is None:  # Datasette's non-threaded mode
            return fn(self._connection(epoch))
        return await asyncio.get_running_loop().run_in_executor(
            self.ds.executor, lambda: fn(self._connection(epoch))
        )


def follow_collections(datasette) -> list[str]:
    """Serve every collection database through ``CollectionDatabase``.

    A collection is recognised by its application id, not by how Datasette was
    started: ``datasette x.sqlite3`` (a positional, mutable file) is served
    immutably too, so its pages follow a re-ingest and nothing can write to it.
    """
    swapped, replaced = [], {}
    for name, db in datasette.databases.items():
        if isinstance(db, CollectionDatabase) or db.is_memory or not db.path:
            continue
        if not is_collection_file(Path(db.path)):
            continue
        new = CollectionDatabase(datasette, db.path)
        new.name, new.route = name, db.route
        replaced[name] = (db, new)
        swapped.append(name)
    if replaced:
        # One new mapping in the same order (the index page and get_database() follow it),
        # assigned whole as Datasette's add_database does.
        datasette.databases = {
            name: replaced[name][1] if name in replaced else db
            for name, db in datasette.databases.items()
        }
        for old, _new in replaced.values():
            old.close()
    return swapped
