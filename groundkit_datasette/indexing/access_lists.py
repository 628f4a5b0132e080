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

A list that cannot be read, cannot be parsed (nested too deep included) or does not
validate makes the document readable by no one (fail closed), with a warning in the
ingest log; the run goes on.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import sqlite3

from .safe_read import NOT_FOUND, NOT_REGULAR, OUTSIDE, TOO_LARGE, Base, Refused


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
    """The YAML front matter of a Markdown text as a mapping, or None when there is none.

    Front matter that does not parse (not YAML, nested too deep for the parser, a date that
    is no date) is no front matter, unless it mentions groundkit_acl: then InvalidACL."""
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
    except (yaml.YAMLError, RecursionError, ValueError, TypeError, OverflowError) as exc:
        # RecursionError: the composer recurses once per level of nesting; ValueError: a
        # timestamp such as 2024-13-45 that datetime refuses.
        if FRONT_MATTER_KEY in block:
            raise InvalidACL(f"front matter with groundkit_acl {_unparsed(exc, 'valid YAML')}") from None
        return None
    return data if isinstance(data, dict) else None


def _unparsed(exc: BaseException, what: str) -> str:
    if isinstance(exc, RecursionError):
        return "is nested too deeply"
    return f"is not {what}"


_UNLISTABLE = frozenset({"\0"})  # a name no directory can hold


class ACLResolver:
    """Access lists for the files of one ingest run under the pinned base directory ``tree``.

    Every list file is read through ``tree`` (indexing/safe_read.py): from the base's
    descriptor, a link followed only to a regular file inside the base, at most
    MAX_ACL_BYTES."""

    def __init__(self, tree: Base):
        self.tree = tree
        self._directories: dict[str, tuple[str | None, str | None]] = {}
        self._listings: dict[str, frozenset[str]] = {}

    def _present(self, rel: str) -> bool:
        # One listing per directory instead of two stats per document (the tree is not
        # expected to change during a run; a file that vanishes reads as unreadable).
        directory, name = posixpath.split(rel)
        listing = self._listings.get(directory)
        if listing is None:
            try:
                listing = frozenset(self.tree.listdir(directory))
            except (OSError, Refused):  # e.g. searchable but not listable: ask about the file
                listing = _UNLISTABLE
            self._listings[directory] = listing
        if listing is _UNLISTABLE:
            try:
                self.tree.lstat(rel)
            except Refused as refused:
                return refused.reason != NOT_FOUND
            return True
        return name in listing

    def _read_file(self, rel: str) -> str | None:
        """The normalized list in the ACL file ``rel``, None if absent; InvalidACL if unusable."""
        if not self._present(rel):
            return None
        try:
            data, _info = self.tree.read(rel, MAX_ACL_BYTES)
        except Refused as refused:
            raise InvalidACL(_REFUSED.get(refused.reason, "access-list file is unreadable")) from None
        try:
            value = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise InvalidACL(f"access-list file {_unparsed(exc, 'JSON')}") from None
        return normalize(value)

    def _directory(self, directory: str) -> tuple[str | None, str | None]:
        """(list, error) from the nearest directory file at or above ``directory`` (relative
        to the base; "" is the base). A loop, not a recursion: a tree may be deeper than
        Python's recursion limit."""
        chain = []
        while True:
            found = self._directories.get(directory)
            if found is not None:
                break
            chain.append(directory)
            rel = posixpath.join(directory, DIRECTORY_FILE)
            try:
                found = (self._read_file(rel), None)
            except InvalidACL as exc:
                found = (None, f"{rel}: {exc}")
            if found != (None, None) or not directory:
                break
            directory = posixpath.dirname(directory)
        for d in chain:
            self._directories[d] = found
        return found

    def for_document(self, source: str, data: bytes) -> str | None:
        """The document's canonical access list (None: unrestricted). Never raises."""
        try:
            if os.path.splitext(source)[1].lower() in _MARKDOWN:
                head = data[: MAX_FRONT_MATTER_CHARS * 4].decode("utf-8", errors="replace")
                matter = front_matter(head.lstrip("\ufeff"))
                if matter is not None and FRONT_MATTER_KEY in matter:
                    return normalize(matter[FRONT_MATTER_KEY])
            sidecar = self._read_file(source + SIDECAR_SUFFIX)
            if sidecar is not None:
                return sidecar
            acl, error = self._directory(posixpath.dirname(source))
            if error is not None:
                raise InvalidACL(error)
            return acl
        except InvalidACL as exc:
            log.warning("%s: access list refused (%s); the document is readable by no one", source, exc)
            return DENY_ALL
        except Exception as exc:  # fail closed on anything unforeseen, and go on with the run
            log.error("%s: access list could not be read (%s); the document is readable by no one",
                      source, type(exc).__name__)
            return DENY_ALL


_REFUSED = {
    OUTSIDE: "access-list file leads outside the base directory",
    TOO_LARGE: "access-list file is too large",
    NOT_REGULAR: "access-list file is not a regular file",
}


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
