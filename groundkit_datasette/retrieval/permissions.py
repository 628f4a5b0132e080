"""What one reader may see of one collection version: the reader (from the Datasette
actor), the SQL predicate over ``documents.acl``, the scoped collection every surface
searches through, and the SQLite authorizer for Datasette's raw views of a protected
version (adr/0011). The access-list format itself is ``indexing/access_lists.py``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from ..indexing.access_lists import connection_is_protected
from ..errors import ChunkNotFound



@dataclass(frozen=True)
class Reader:
    user: str | None
    groups: frozenset[str]

    @classmethod
    def from_actor(cls, actor) -> "Reader":
        if not isinstance(actor, dict):
            return cls(None, frozenset())
        user = actor.get("id")
        groups = actor.get("groups") or []
        if isinstance(groups, str):
            groups = [groups]
        return cls(
            str(user) if user is not None else None,
            frozenset(g for g in groups if isinstance(g, str)) if isinstance(groups, list) else frozenset(),
        )

    def readable_sql(self, alias: str = "d") -> tuple[str, list]:
        """A predicate over ``documents`` (as ``alias``) true for what this reader may read.

        A list that is not valid JSON reads as "no one" (fail closed).
        """
        tests, params = [], []
        if self.user is not None:
            tests.append(f"EXISTS (SELECT 1 FROM json_each({alias}.acl, '$.users') WHERE value = ?)")
            params.append(self.user)
        if self.groups:
            tests.append(
                f"EXISTS (SELECT 1 FROM json_each({alias}.acl, '$.groups') "
                "WHERE value IN (SELECT value FROM json_each(?)))"
            )
            params.append(json.dumps(sorted(self.groups)))
        granted = " OR ".join(tests) if tests else "0"
        sql = f"({alias}.acl IS NULL OR CASE WHEN json_valid({alias}.acl) THEN ({granted}) ELSE 0 END)"
        return sql, params


@dataclass(frozen=True)
class Access:
    """One reader's view of one collection version: the SQL predicate and what it hides."""

    sql: str
    params: tuple
    hidden_documents: tuple[str, ...]


_has_acl_cache: dict[str, tuple[object, bool]] = {}
_has_acl_lock = threading.Lock()

# Schema tables, and FTS5's configuration table, which its module reads to describe the
# table (Datasette's column lookups); its index and content tables stay closed.
_UNGUARDED_TABLES = frozenset(
    {"sqlite_master", "sqlite_schema", "sqlite_temp_master", "chunks_fts_config",
     "chunks_cjk_fts_config"}
)


def deny_row_reads(action, arg1, arg2, _db, _trigger):
    """SQLite authorizer for a protected version's raw connections: any column read is
    refused (schema and row counts stay readable), so no query a permission check let
    through can return a document's text."""
    if action == sqlite3.SQLITE_READ and arg2 and arg1 not in _UNGUARDED_TABLES:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def collection_has_acl(path: Path) -> bool:
    """Whether the collection file now at ``path`` is protected (see connection_is_protected).

    Only for decisions that are re-checked against the version read: Datasette's permission
    hooks (surfaces/datasette_compat.py), backed by ``deny_row_reads`` on the connection that
    runs the query. groundkit's own surfaces ask the open ``Collection``."""
    from ..indexing.schema import FileIdentity, connect_readonly

    try:
        identity = FileIdentity.of(path)
    except OSError:
        return True  # unknown: closed
    key = str(path)
    with _has_acl_lock:
        cached = _has_acl_cache.get(key)
    if cached is not None and cached[0] == identity:
        return cached[1]
    try:
        conn = connect_readonly(Path(path))
        try:
            found = connection_is_protected(conn)
        finally:
            conn.close()
    except sqlite3.Error:
        return True
    with _has_acl_lock:
        _has_acl_cache[key] = (identity, found)
    return found


class ScopedCollection:
    """A collection as one reader sees it: search, fetch_chunk and status only ever
    include documents the reader may read.

    Deliberately not a general proxy: there is no ``query``, so a tool cannot
    read around the filter by accident. ``readable_sql`` gives a tool plugin the
    predicate to apply to its own queries.
    """

    def __init__(self, collection, reader: Reader):
        self._collection = collection
        self.reader = reader
        self._access: Access | None = None

    name = property(lambda self: self._collection.name)
    generation = property(lambda self: self._collection.generation)
    embedding = property(lambda self: self._collection.embedding)
    manifest = property(lambda self: self._collection.manifest)

    def readable_sql(self, alias: str = "d") -> tuple[str, list]:
        return self.reader.readable_sql(alias)

    def access(self) -> Access | None:
        """None when nothing in the collection is hidden from this reader."""
        if self._access is None:
            col = self._collection
            if not col.protected:  # the version this collection object reads, not the file now
                return None
            sql, params = self.reader.readable_sql("d")
            hidden = col.query(
                f"SELECT document_id FROM documents d WHERE NOT {sql} ORDER BY document_id", params
            )
            self._access = Access(sql, tuple(params), tuple(r[0] for r in hidden))
        return self._access if self._access.hidden_documents else None

    def search(self, request=None, /, **fields):
        from .models import SearchRequest
        from .search import run_search

        if request is None:
            request = SearchRequest(**fields)
        return run_search(self._collection, request, access=self.access())

    def fetch_chunk(self, chunk_id: str):
        access = self.access()
        if access is not None:
            rows = self._collection.query(
                "SELECT document_id FROM chunks WHERE chunk_id = ?", (chunk_id,)
            )
            if rows and rows[0][0] in set(access.hidden_documents):
                # Word for word what a chunk that does not exist answers.
                raise ChunkNotFound("chunk not found")
        return self._collection.fetch_chunk(chunk_id)

    def status(self, **kwargs):
        status = self._collection.status(**kwargs)
        access = self.access()
        if access is None:
            return status
        col = self._collection
        hidden = json.dumps(list(access.hidden_documents))
        documents = col.query(
            "SELECT count(*) FROM documents WHERE document_id NOT IN (SELECT value FROM json_each(?))",
            (hidden,),
        )[0][0]
        chunks = col.query(
            "SELECT count(*) FROM chunks WHERE document_id NOT IN (SELECT value FROM json_each(?))",
            (hidden,),
        )[0][0]
        update = {"documents": documents, "chunks": chunks, "bm25_terms": self._terms(hidden)}
        if status.vectors is not None:  # counted over readable chunks only, like the rest
            update["vectors"] = (chunks if status.vectors >= status.chunks
                                 else col.vector_count(access.hidden_documents))
            if status.vectors < status.chunks and status.dense_unavailable_reason is not None:
                # The coverage reason names counts too: the reader's (issue 33.7).
                from .collection import coverage_reason
                from .modes import available_modes
                from .rankers import dense_unavailable_reason

                if dense_unavailable_reason(col) is None:
                    reason = coverage_reason(update["vectors"], chunks)
                    update.update(dense_unavailable_reason=reason, dense_available=reason is None,
                                  modes=available_modes(col, reason))
        return status.model_copy(update=update)

    def _terms(self, hidden_json: str) -> int:
        """Distinct BM25 terms in the readable chunks, so the vocabulary size leaks nothing."""
        import numpy as np

        rows = self._collection.query(
            "SELECT t.term_ids FROM bm25_chunk_terms t JOIN chunks c ON c.id = t.id "
            "WHERE c.document_id NOT IN (SELECT value FROM json_each(?))",
            (hidden_json,),
        )
        if not rows:
            return 0
        ids = np.frombuffer(b"".join(r[0] for r in rows), dtype=np.int32)
        return int(np.unique(ids).size)
