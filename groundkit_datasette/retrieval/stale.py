"""Whether a search hit's source file changed since ingest: one bit per document, from a
``stat`` compared with ingest's record, kept between searches while inotify reports nothing.

Apart from citations.py so that a search, which flags stale hits on every hit list, never
imports the verification's models and extractors (cold start, issue 14).
"""

from __future__ import annotations

import os
import stat
import sys
import threading
import time
from pathlib import Path

__all__ = ["StaleCheck", "sources_changed"]


def sources_changed(base_dir: Path | None, records) -> list[bool | None]:
    """For each ``(source, size, mtime_ns)`` recorded at ingest: whether the file now differs.

    None when nothing was recorded (collections written before the columns) or there is no
    base directory; True when the file is gone or the source is not a plain relative path.
    One ``stat`` per record and no read: cheap enough for every hit list (docs/performance.md).
    The answer is one bit compared with ingest's own record, so a link is followed as ingest
    followed it; nothing about the file is returned. :class:`StaleCheck` answers the same for
    an open collection's every search.
    """
    return StaleCheck(base_dir).changed(records)


class StaleCheck:
    """:func:`sources_changed` for one open collection's searches.

    An edit shows on the next search, as with one ``stat`` per document per search, but a
    document's ``stat`` is made again only when something may have changed it: the file and
    the directories on its path (base directory down to the file's own) are watched with
    inotify (:class:`_Watcher`, one per process), and a ``stat`` answer is kept until any
    watch reports an event, or for ``RECHECK_SECONDS`` at most (for what inotify cannot see on
    a local file system: a write through a memory map, a linked directory's target moved
    outside the base directory). On a network or FUSE file system (changed from elsewhere
    without any event here), for a source that is itself a link, and where inotify is
    missing (not Linux, no instance or watch left), every search stats every document. The
    base directory's real path is resolved at most once per ``BASE_SECONDS`` (a base
    directory moved or re-linked is seen that much later); each source's path is joined
    once. adr/0036 has the measurements."""

    BASE_SECONDS = 1.0
    RECHECK_SECONDS = 10.0
    PATHS_KEPT = 16_384

    def __init__(self, base_dir: Path | None):
        self.base_dir = base_dir
        self._base: str | None = None
        self._until = float("-inf")
        self._paths: dict = {}
        # path -> (size, mtime_ns) or None (stat failed), the watcher's epoch, valid until
        self._known: dict = {}
        # chunk row id -> (its answer, the epoch and deadline of the kept stat it came from)
        self._rows: dict = {}
        self._local = False  # whether the base directory is on a file system inotify covers

    @property
    def local(self) -> bool:
        """Whether the base directory is on a file system the watcher covers (not a network
        mount): its answers are kept, and a stat stays local."""
        return self._local

    def _real_base(self) -> str | None:
        now = time.monotonic()
        if now < self._until:
            return self._base
        try:  # _real_base's answer, without pathlib's overhead
            base = os.path.realpath(os.fspath(self.base_dir), strict=True)
            if not os.path.isdir(base):
                raise OSError
        except (OSError, RuntimeError, ValueError):
            base = None
        if base != self._base:
            self._paths = {}
            self._known = {}
            self._rows = {}
            self._local = base is not None and _inotify_covers(base)
        self._base, self._until = base, now + self.BASE_SECONDS
        return base

    def changed(self, records) -> list[bool | None]:
        records = list(records)
        if self.base_dir is None:
            return [None] * len(records)
        base = self._real_base()
        if base is None:
            return [None if size is None or mtime is None else True for _s, size, mtime in records]
        watcher = _watcher() if self._local else None
        epoch = watcher.poll() if watcher is not None else None  # before any answer is used
        return self._answers(base, watcher, epoch, time.monotonic(), records, [])

    def _answers(self, base, watcher, epoch, now, records, stats: list) -> list[bool | None]:
        """:meth:`changed`'s answers once the base, the watcher and its epoch are known.
        ``stats`` gets, for each record, the kept ``stat`` entry its answer came from
        (``(found, epoch, deadline)``), or None where the answer is not kept."""
        paths, known = self._paths, self._known
        out = []
        for source, size, mtime_ns in records:
            if size is None or mtime_ns is None:
                out.append(None)
                stats.append(None)
                continue
            entry = paths.get(source)
            if entry is None:
                entry = _path_entry(base, source)
                if len(paths) >= self.PATHS_KEPT:
                    paths.clear()
                    known.clear()
                paths[source] = entry
            path, dirs = entry
            if path is None:
                out.append(True)
                stats.append(None)
                continue
            seen = known.get(path)
            kept = seen
            if seen is None or seen[1] != epoch or now >= seen[2]:
                # The directories are watched before the stat: a change after it is an event.
                keep = epoch is not None and watcher.watch(dirs)
                try:
                    info = os.lstat(path)
                    if stat.S_ISLNK(info.st_mode):  # followed, as ingest did; never kept
                        keep = False
                        info = os.stat(path)
                    found = (info.st_size, info.st_mtime_ns)
                except (OSError, ValueError):
                    found = None
                seen = (found, epoch, now + self.RECHECK_SECONDS)
                kept = seen if keep else None
                if keep:
                    known[path] = seen
                else:
                    known.pop(path, None)
            stats.append(kept)
            found = seen[0]
            out.append(found is None or found[0] != size or found[1] != mtime_ns)
        return out

    def changed_rows(self, rows) -> list:
        """:meth:`changed` for a search's hit rows (``collection.HitRow``: ``source``,
        ``source_size``, ``source_mtime_ns``, ``row_id``), one answer per row. A row's answer is
        kept by its row id with the epoch and deadline of the ``stat`` it came from, so a
        search whose documents were all asked before reads one dict entry per hit; only rows
        without a kept answer go through :meth:`changed`."""
        if self.base_dir is None:
            return [None] * len(rows)
        base = self._real_base()
        if base is None:
            return [None if r.source_size is None or r.source_mtime_ns is None else True
                    for r in rows]
        watcher = _watcher() if self._local else None
        epoch = watcher.poll() if watcher is not None else None  # before any answer is used
        now = time.monotonic()
        kept = self._rows
        out = []
        rest = None
        for i, r in enumerate(rows):
            seen = kept.get(r.row_id)
            # Kept answers carry the epoch they were read in (never None: without a watcher
            # nothing is kept), so a None epoch always takes the slow path.
            if seen is not None and seen[1] == epoch and now < seen[2]:
                out.append(seen[0])
            else:
                out.append(None)  # nothing recorded at ingest, or its place: answered below
                if r.source_size is None or r.source_mtime_ns is None:
                    continue
                if rest is None:
                    rest = []
                rest.append(i)
        if rest:
            asked = [rows[i] for i in rest]
            if len(kept) >= self.PATHS_KEPT:
                kept.clear()
            stats: list = []  # the same base, watcher, epoch and time as the kept answers above
            answers = self._answers(base, watcher, epoch, now,
                                    [(r.source, r.source_size, r.source_mtime_ns) for r in asked],
                                    stats)
            for i, r, answer, seen in zip(rest, asked, answers, stats):
                out[i] = answer
                # Kept by its path: kept by row as long, with the epoch of the stat it came
                # from (not of a later one another thread made after a change).
                if seen is not None:
                    kept[r.row_id] = (answer, seen[1], seen[2])
        return out


def _path_entry(base: str, source):
    """``(path, what to watch)`` of a source: the directories on its path and the file itself
    (a write through another hard link reaches the file's own watch); ``(None, ())`` when it is
    not a plain relative path."""
    if not plain_relative(source):
        return None, ()
    dirs, parts = [base], source.split("/")[:-1]
    for i in range(len(parts)):
        dirs.append(os.path.join(base, *parts[: i + 1]))
    path = os.path.join(base, source)
    return path, tuple(dirs) + (path,)


# File systems whose files change without an inotify event here (another machine, a FUSE
# daemon): answers there are never kept.
_REMOTE_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "9p", "afs", "ceph",
                        "glusterfs", "lustre", "gpfs", "ocfs2", "gfs2", "beegfs", "virtiofs",
                        "vboxsf", "vmhgfs", "sshfs"})


def _inotify_covers(path: str, mounts: str = "/proc/self/mounts") -> bool:
    """Whether ``path`` lies on a local file system (the longest mount point above it in
    ``mounts``); False when that cannot be told."""
    try:
        with open(mounts, encoding="utf-8", errors="replace") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return False
    best, fstype = "", None
    for fields in mounts:
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, fields[2]
    if fstype is None:
        return False
    return not (fstype in _REMOTE_FS or fstype.startswith("fuse"))


# Our own inotify, not watchfiles (adr/0054): kept answers make cisi's JSON and MCP p50 1.3x faster
# than a stat per search, and watchfiles' one public poll takes ~1.1 ms (no queued-event check).
class _Watcher:
    """One inotify instance for the process: directories added once, read without blocking.
    ``epoch`` goes up whenever any event has arrived since the last :meth:`poll`; every kept
    ``stat`` answer is of one epoch. A process forked after one was made makes its own
    (:func:`_forget_watcher`)."""

    # A child's content, metadata, name or existence changed; the directory itself moved.
    _MASK = (0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800)
    MAX_DIRS = 16_384  # directories and files

    def __init__(self, libc, fd: int, budget: int | None = None):
        self._libc, self.fd = libc, fd
        self.epoch = 0
        self._dirs: set = set()
        # Every path ever added holds a kernel watch until it is deleted (re-adding one reuses
        # it): counted, so the process never takes more than its share of the user's watches.
        self._added: set = set()
        self._budget = _watch_budget() if budget is None else budget
        self._lock = threading.Lock()
        self._full = False
        import select

        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def poll(self) -> int:
        with self._lock:  # an event read and the epoch raised at once, for every thread
            if not self._poll.poll(0):  # nothing queued (a syscall, no exception)
                return self.epoch
            while True:
                try:
                    if not os.read(self.fd, 65536):
                        break
                except OSError:  # BlockingIOError: drained
                    break
            self.epoch += 1
            # A directory deleted or replaced lost its watch: add them again as asked.
            self._dirs = set()
            self._full = False
            return self.epoch

    def watch(self, dirs) -> bool:
        """Whether every directory in ``dirs`` is watched (added now if need be)."""
        known = self._dirs
        for d in dirs:
            if d in known:
                continue
            if self._full or (d not in self._added and len(self._added) >= self._budget):
                return False
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(d), self._MASK)
            if wd < 0:  # no such directory, or the user's watches are used up
                self._full = ctypes_errno() == 28  # ENOSPC
                return False
            self._added.add(d)
            with self._lock:
                if self._dirs is known:
                    known.add(d)
        return True


def _watch_budget(limit_file: str = "/proc/sys/fs/inotify/max_user_watches") -> int:
    """How many watches one process may hold: an eighth of the user's limit (editors, file
    sync and ``groundkit watch`` need the rest), at most ``_Watcher.MAX_DIRS``; the budget of
    the smallest common limit (8,192) when it cannot be read."""
    try:
        with open(limit_file, encoding="ascii") as f:
            limit = int(f.read().strip())
    except (OSError, ValueError):
        limit = 8192
    return max(0, min(_Watcher.MAX_DIRS, limit // 8))


def ctypes_errno() -> int:
    import ctypes

    return ctypes.get_errno()


_UNMADE = object()
_watcher_state: list = [_UNMADE]  # the process's _Watcher, None (none to be had) or _UNMADE
_watcher_lock = threading.Lock()
# The first epoch of the next watcher made: past every epoch of the one a forked child had
# from its parent, so no answer kept under the parent's watches passes for the child's own.
_first_epoch: list = [0]


def _forget_watcher() -> None:
    """In a forked child: its own watcher, made on first use (the two processes would
    otherwise share one queue of events), whose epochs start past the inherited one's (its
    watches are new: the answers the child inherited were kept under watches it lacks)."""
    global _watcher_lock
    inherited = _watcher_state[0]
    if isinstance(inherited, _Watcher):
        _first_epoch[0] = inherited.epoch + 1
    _watcher_state[0] = _UNMADE
    _watcher_lock = threading.Lock()  # a parent's thread may have held it at the fork


os.register_at_fork(after_in_child=_forget_watcher)


def _watcher() -> _Watcher | None:
    """The process's inotify watcher, or None where inotify cannot be had."""
    found = _watcher_state[0]
    if found is not _UNMADE:
        return found
    with _watcher_lock:
        if _watcher_state[0] is _UNMADE:
            made = _new_watcher()
            if made is not None:
                made.epoch = _first_epoch[0]
            _watcher_state[0] = made
    return _watcher_state[0]


def _new_watcher() -> _Watcher | None:
    if not sys.platform.startswith("linux") or os.environ.get("GROUNDKIT_NO_INOTIFY"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, AttributeError, ImportError):
        return None
    if fd < 0:  # the user's instances are used up: stat on every search
        return None
    return _Watcher(libc, fd)


def plain_relative(source) -> bool:
    return (
        isinstance(source, str)
        and bool(source)
        and "\x00" not in source
        and "\\" not in source
        and not source.startswith("/")
        and ".." not in source.split("/")  # PurePosixPath(source).parts, without the cost
    )
