"""Document access lists on disk: the format, where ingest finds a document's list, and
whether a collection version is protected. What one reader may see is
``retrieval/permissions.py``.

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
from pathlib import Path


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

    def _read_file(self, path: str | Path) -> str | None:
        """The normalized list in an ACL file, None if absent; InvalidACL if unusable."""
        if not self._present(path):
            return None
        real = Path(path).resolve()
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
            sidecar = self._read_file(path + SIDECAR_SUFFIX)  # a str: no Path per document
            if sidecar is not None:
                return sidecar
            acl, error = self._directory(os.path.dirname(path))
            if error is not None:
                raise InvalidACL(error)
            return acl
        except InvalidACL as exc:
            log.warning("%s: access list refused (%s); the document is readable by no one", source, exc)
            return DENY_ALL


# -- serving needs to know: is this version protected? ----------------------------------

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
