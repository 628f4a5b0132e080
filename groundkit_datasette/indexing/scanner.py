"""What a run will look at: the base directory and roots resolved, the files under them walked
(excludes applied, nothing followed out of the base), each file read and compared with the
collection's record of it, as jobs in walk order (indexing/prepared.py's ``Job``)."""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import stat
from pathlib import Path
from typing import Iterable

from . import safe_read
from ..errors import InvalidRequest
from .extract import MAX_FILE_BYTES
from .prepared import Job, sha

log = logging.getLogger(__name__)

DEFAULT_EXCLUDES = (
    ".*",
    "__pycache__",
    "node_modules",
    "*.sqlite3",
    "*.sqlite3-*",
    "*.lance",
    "*.pyc",
    "*.acl.json",  # access-list sidecars (acl.py) describe documents; they are not documents
)

_DOCUMENT_COLUMNS = ("source, document_id, file_hash, extractor, extractor_version, acl, "
                     "source_size, source_mtime_ns")


class Scanner:
    """The walk of one Indexer: its excludes, and the jobs of a run."""

    def __init__(self, exclude: Iterable[str] = ()):
        self.exclude = tuple(DEFAULT_EXCLUDES) + tuple(exclude)
        self._pattern = re.compile("|".join(fnmatch.translate(g) for g in self.exclude))

    def excluded(self, rel: str) -> bool:
        name = rel.rsplit("/", 1)[-1]
        match = self._pattern.match
        return match(name) is not None or match(rel) is not None

    @staticmethod
    def resolve_inputs(paths, base_dir: Path | None = None, missing_ok: bool = False,
                       pinned: safe_read.Base | None = None) -> tuple[Path, list[Path]]:
        """The base directory and the roots, resolved. A ``pinned`` base (watch mode) is not
        resolved again: its path is the one resolved when it was opened."""
        if not paths:
            raise InvalidRequest("give at least one file or directory to ingest")
        resolved = []
        for p in paths:
            rp = Path(p).resolve()
            if not missing_ok and not rp.exists():
                raise InvalidRequest(f"path does not exist: {p}")
            resolved.append(rp)
        if pinned is not None:
            base = Path(pinned.path)
        elif base_dir is not None:
            base = base_dir.resolve()
        else:
            common = Path(os.path.commonpath([str(p) for p in resolved]))
            base = common if common.is_dir() else common.parent
        for rp in resolved:
            if rp != base and base not in rp.parents:
                raise InvalidRequest(f"path is outside the base directory: {rp}")
        return base, resolved

    def files(self, tree: safe_read.Base, base: Path, roots: list[Path], report):
        """``(files, prefixes, gone_files)``: every ``(source, real)`` to read, once each; the
        directory roots' prefixes (documents under them whose files are gone are removed); the
        sources of roots now gone (only with ``ingest(missing_ok=True)``)."""
        # Overlapping paths (a directory and what is inside it) name each file once, and a
        # root inside another directory root is not walked twice.
        # One stat per root and a set lookup per parent: linear in the number of paths.
        unique_roots = list(dict.fromkeys(roots))
        dir_roots = {r for r in unique_roots if r.is_dir()}
        gone = {r for r in unique_roots if not r.exists()}
        walked = [r for r in unique_roots
                  if r not in gone and not any(p in dir_roots for p in r.parents)]
        files = list({item[0]: item for root in walked for item in self.walk(tree, root, report)}.values())
        prefixes = tuple("" if root == base else root.relative_to(base).as_posix() + "/"
                         for root in dir_roots | gone)
        gone_files = {root.relative_to(base).as_posix() for root in gone if root != base}
        return files, prefixes, gone_files

    def walk(self, tree: safe_read.Base, root: Path, report):
        """Yield ``(source, real)`` for files under ``root`` that stay inside the base ``tree``:
        ``real`` is what to open, relative to the base (a link's resolved target).

        Directories are listed from the base's descriptor, never by a path (safe_read.py), and
        one at a time from a stack: a tree deeper than Python's recursion limit is walked too.
        Order is deterministic: a directory's files by name, then its subdirectories by name.
        """
        base = Path(tree.path)
        # Roots come resolved (resolve_inputs): never a symlink themselves.
        rel_root = root.relative_to(base).as_posix() if root != base else ""
        try:
            mode = tree.lstat(rel_root).st_mode
        except safe_read.Refused:
            mode = 0
        if stat.S_ISREG(mode):
            if not self.excluded(rel_root):
                yield rel_root, rel_root
            return
        if not stat.S_ISDIR(mode):
            report.skip(rel_root or root.name, "not a regular file")
            return

        stack = [rel_root]
        while stack:
            directory = stack.pop()
            prefix = directory + "/" if directory else ""
            # os.scandir: file types come with the directory listing, no stat per file (asked
            # while the descriptor is open: where the listing has no types, they are statted).
            try:
                fd = tree.open_dir(directory)
                try:
                    with os.scandir(fd) as it:
                        entries = sorted((e.name, _entry_kind(e)) for e in it)
                finally:
                    os.close(fd)
            except (OSError, safe_read.Refused) as exc:  # one unreadable directory must not end the run
                report.skip(directory or ".", "unreadable directory")
                log.warning("cannot list %s: %s", directory or ".",
                            getattr(exc, "strerror", None) or getattr(exc, "reason", exc))
                continue
            subdirs = []
            for name, kind in entries:
                rel = prefix + name
                if self.excluded(rel):
                    continue
                if kind == "link":
                    item = _symlink(tree, rel, report)
                    if item:
                        yield item
                elif kind == "dir":
                    subdirs.append(rel)
                elif kind == "file":
                    yield rel, rel
                else:
                    report.skip(rel, "not a regular file")
            stack.extend(reversed(subdirs))

    @staticmethod
    def jobs(files, seen: set, existing: dict, acls, rechunk: bool, progress):
        """Each file in walk order, read, hashed and compared with the collection: an unchanged
        file is marked before any work is done on it, here or on a cluster."""
        for done, (source, real) in enumerate(files, 1):
            seen.add(source)
            progress({"event": "file", "source": source, "done": done, "total": len(files)})
            yield read_job(source, real, existing, acls, rechunk)


def _symlink(tree: safe_read.Base, rel: str, report):
    """``(rel, target)`` for a link the walk may follow to a file inside the base, else None."""
    try:
        target = tree.resolve(rel)
    except safe_read.Refused as refused:
        report.skip(rel, refused.reason)
        if refused.reason == safe_read.OUTSIDE:
            log.warning("refused symlink leaving the base directory: %s", rel)
        return None
    try:
        mode = tree.lstat(target).st_mode
    except safe_read.Refused:
        return rel, target  # dangling: reported as unreadable when read
    if stat.S_ISDIR(mode):
        report.skip(rel, "symlinked directory not followed")
        return None
    if not stat.S_ISREG(mode) and not stat.S_ISLNK(mode):  # a FIFO would block the read
        report.skip(rel, "not a regular file")
        return None
    return rel, target  # a link still (a loop): reported when read


def _entry_kind(entry: os.DirEntry) -> str:
    try:
        if entry.is_symlink():
            return "link"
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        return "file" if entry.is_file(follow_symlinks=False) else "other"
    except OSError:  # vanished since listed: read as unreadable
        return "file"


def read_job(source: str, real: str, existing: dict, acls, rechunk: bool) -> Job:
    """One file read, hashed and compared with the collection's record of it.

    ``real`` is the file's path relative to the base (a link's resolved target), opened from
    the base's descriptor (safe_read.py): whatever the walk saw, a link to outside the base, a
    FIFO or a device now at that name is refused, and no more than MAX_FILE_BYTES is read."""
    try:
        data, info = acls.tree.read(real, MAX_FILE_BYTES)
    except safe_read.Refused as refused:
        log.warning("not read: %s (%s)", source, refused.reason)
        reason = "unreadable" if refused.reason == safe_read.NOT_FOUND else refused.reason
        return Job(source, None, unreadable=True, refused=reason)
    size, mtime_ns = info.st_size, info.st_mtime_ns  # the file just read, not the name now
    file_hash = sha(data)
    acl = acls.for_document(source, data)
    prior = existing.get(source)
    work = not (prior and not rechunk and prior[1] == file_hash)
    return Job(source, data if work else None, file_hash, acl, prior, size, mtime_ns, work)


def existing_documents(conn, sources, prefixes, gone_files) -> dict:
    """``{source: (document_id, file_hash, ...)}`` of the stored documents a run can touch: those
    at the walked sources, under a walked directory (``prefixes``), or at a root now gone. Read
    by key, not by listing the collection, unless the run covers most of it."""
    total = conn.execute("SELECT max(rowid) FROM documents").fetchone()[0] or 0
    if "" in prefixes or len(sources) * 4 > total:
        return {row[0]: row[1:] for row in conn.execute(f"SELECT {_DOCUMENT_COLUMNS} FROM documents")}
    out = {}
    wanted = list(dict.fromkeys([*sources, *gone_files]))
    for i in range(0, len(wanted), 500):
        part = wanted[i : i + 500]
        out.update((row[0], row[1:]) for row in conn.execute(
            f"SELECT {_DOCUMENT_COLUMNS} FROM documents WHERE source IN ({','.join('?' * len(part))})", part))
    for prefix in prefixes:  # each ends with "/": the range [prefix, prefix with "/" -> "0")
        out.update((row[0], row[1:]) for row in conn.execute(
            f"SELECT {_DOCUMENT_COLUMNS} FROM documents WHERE source >= ? AND source < ?",
            (prefix, prefix[:-1] + "0")))
    return out
