"""Document-level permissions: the access-list format, where ingest finds it, and
what one reader may see.

An access list is ``{"users": [...], "groups": [...]}``, stored canonically in
``documents.acl``. NULL means "anyone who may view the collection". A reader
(from the Datasette actor: ``id`` and ``groups``) may read a document whose list
names its id or shares a group with it. No one is exempt: an operator reads
everything through the CLI or the Python API, which open collections unscoped.

Where ingest finds a document's list (most specific wins, nothing is merged):

1. Markdown front matter: a ``groundkit_acl:`` mapping;
2. a sidecar file next to the document, ``<file name>.acl.json``;
3. the nearest ``.groundkit-acl.json`` in the document's directory or a parent,
   up to the ingest's base directory.

A list that cannot be read or does not validate makes the document readable by
no one (fail closed), with a warning in the ingest log.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import ChunkNotFound

log = logging.getLogger(__name__)

FRONT_MATTER_KEY = "groundkit_acl"
SIDECAR_SUFFIX = ".acl.json"
DIRECTORY_FILE = ".groundkit-acl.json"
MAX_ACL_BYTES = 64 * 1024
MAX_FRONT_MATTER_CHARS = 64 * 1024
DENY_ALL = json.dumps({"groups": [], "users": []}, sort_keys=True, separators=(",", ":"))
_MARKDOWN = {".md", ".markdown", ".mdown", ".mkd", ".mdx"}


class InvalidACL(ValueError):
    pass


def normalize(value) -> str:
    """Canonical JSON for an access list; raises InvalidACL for anything else."""
    if not isinstance(value, dict) or not value or set(value) - {"users", "groups"}:
        raise InvalidACL("an access list is a mapping with 'users' and/or 'groups'")
    out = {}
    for key in ("groups", "users"):
        names = value.get(key, [])
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise InvalidACL(f"'{key}' must be a list of non-empty strings")
        out[key] = sorted(set(names))
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


# -- ingest: finding a document's access list ------------------------------------------


def front_matter(text: str) -> dict | None:
    """The YAML front matter of a Markdown text as a mapping, or None when there is none."""
    if not text.startswith("---"):
        return None
    lines = text[:MAX_FRONT_MATTER_CHARS].split("\n")
    if lines[0].rstrip() != "---":
        return None
    for i in range(1, len(lines)):
        if lines[i].rstrip() in ("---", "..."):
            block = "\n".join(lines[1:i])
            break
    else:
        return None
    import yaml

    try:
        data = yaml.safe_load(block)
    except yaml.YAMLError:
        if FRONT_MATTER_KEY in block:
            raise InvalidACL("front matter with groundkit_acl is not valid YAML") from None
        return None
    return data if isinstance(data, dict) else None


_UNLISTABLE = frozenset({"\0"})  # a name no directory can hold


class ACLResolver:
    """Access lists for the files of one ingest run under ``base``."""

    def __init__(self, base: Path):
        self.base = Path(base).resolve()
        self._directories: dict[str, tuple[str | None, str | None]] = {}
        self._listings: dict[str, frozenset[str]] = {}

    def _present(self, path: Path) -> bool:
        # One listing per directory instead of two stats per document (the tree is not
        # expected to change during a run; a file that vanishes reads as unreadable).
        directory, name = os.path.split(path)
        listing = self._listings.get(directory)
        if listing is None:
            try:
                listing = frozenset(os.listdir(directory))
            except OSError:  # e.g. searchable but not listable: ask about the file itself
                listing = _UNLISTABLE
            self._listings[directory] = listing
        if listing is _UNLISTABLE:
            return os.path.lexists(path)
        return name in listing

    def _read_file(self, path: Path) -> str | None:
        """The normalized list in an ACL file, None if absent; InvalidACL if unusable."""
        if not self._present(path):
            return None
        real = path.resolve()
        if real != self.base and self.base not in real.parents:
            raise InvalidACL("access-list file leads outside the base directory")
        try:
            data = real.read_bytes()[: MAX_ACL_BYTES + 1]
        except OSError:
            raise InvalidACL("access-list file is unreadable") from None
        if len(data) > MAX_ACL_BYTES:
            raise InvalidACL("access-list file is too large")
        try:
            value = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise InvalidACL("access-list file is not JSON") from None
        return normalize(value)

    def _directory(self, directory: str) -> tuple[str | None, str | None]:
        """(list, error) from the nearest directory file at or above ``directory``."""
        found = self._directories.get(directory)
        if found is not None:
            return found
        path = Path(directory)
        try:
            result = (self._read_file(path / DIRECTORY_FILE), None)
        except InvalidACL as exc:
            result = (None, f"{(path / DIRECTORY_FILE).relative_to(self.base)}: {exc}")
        if result == (None, None) and path != self.base and self.base in path.parents:
            result = self._directory(str(path.parent))
        self._directories[directory] = result
        return result

    def for_document(self, source: str, data: bytes) -> str | None:
        """The document's canonical access list (None: unrestricted). Never raises."""
        try:
            if os.path.splitext(source)[1].lower() in _MARKDOWN:
                head = data[: MAX_FRONT_MATTER_CHARS * 4].decode("utf-8", errors="replace")
                matter = front_matter(head.lstrip("\ufeff"))
                if matter is not None and FRONT_MATTER_KEY in matter:
                    return normalize(matter[FRONT_MATTER_KEY])
            path = os.path.join(self.base, source)
            sidecar = self._read_file(Path(path + SIDECAR_SUFFIX))
            if sidecar is not None:
                return sidecar
            acl, error = self._directory(os.path.dirname(path))
            if error is not None:
                raise InvalidACL(error)
            return acl
        except InvalidACL as exc:
            log.warning("%s: access list refused (%s); the document is readable by no one", source, exc)
            return DENY_ALL


# -- serving: what one reader may see ---------------------------------------------------


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

# The manifest key ingest sets once any document of any version had an access list.
STICKY_KEY = "access_lists"


def connection_is_protected(conn: sqlite3.Connection) -> bool:
    """Whether the collection version open on ``conn`` has, or ever had, access lists.

    Asked of the very connection that answers the query, never of the file now at the
    path: a publish between the two must not change the answer (adr/0011).
    """
    try:
        sticky = conn.execute(
            "SELECT 1 FROM groundkit_manifest WHERE key = ? AND value = '1'", (STICKY_KEY,)
        ).fetchone()
        if sticky:
            return True
        return conn.execute("SELECT 1 FROM documents WHERE acl IS NOT NULL LIMIT 1").fetchone() is not None
    except sqlite3.Error:
        return True  # unknown: closed


# Schema tables, and FTS5's configuration table, which its module reads to describe the
# table (Datasette's column lookups); its index and content tables stay closed.
_UNGUARDED_TABLES = frozenset(
    {"sqlite_master", "sqlite_schema", "sqlite_temp_master", "chunks_fts_config"}
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

    Only for decisions that are re-checked against the version read: Datasette's
    ``permission_allowed`` (backed by ``deny_row_reads`` on the connection that runs the
    query). groundkit's own surfaces ask the open ``Collection``."""
    from ..retrieval.collection import FileIdentity
    from .schema import connect_readonly

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
        from ..retrieval.models import SearchRequest
        from ..retrieval.search import run_search

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
