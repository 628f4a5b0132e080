"""Open files under a base directory pinned by a descriptor, never by a path checked earlier.

A walk that classifies ``notes/a.txt`` as a regular file says nothing about what that name
holds a moment later: it may have become a symlink to a file outside the base, a FIFO that
blocks the read, or ``/dev/zero``. So every file ingest reads (documents, sidecar and directory
access lists) and the serve-time citation read go through :class:`Base`:

- the base directory is opened once (:class:`Base`), and its device and inode kept;
- a file is reached from that descriptor one component at a time, each directory opened with
  ``O_NOFOLLOW | O_DIRECTORY`` and the file with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO opens
  without blocking, a link is refused by the kernel, not by an earlier look);
- a link met on the way is followed only when the caller allows it (ingest does, for links the
  walk accepted): its target is resolved, must lie inside the base, and is then opened by the
  same link-free walk from the descriptor, so a link swapped in after the resolution is
  refused too;
- ``fstat`` of the opened descriptor must say regular file, and the read stops one byte past
  the caller's bound.

Refusals raise :class:`Refused` with a reason that names no path. See adr/0049.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["Base", "Refused", "opened_inside", "read_fd",
           "NOT_FOUND", "OUTSIDE", "NOT_REGULAR", "TOO_LARGE", "UNREADABLE", "CHANGED"]

NOT_FOUND = "not found"
OUTSIDE = "symlink outside base directory"
NOT_REGULAR = "not a regular file"
TOO_LARGE = "too large"
UNREADABLE = "unreadable"
CHANGED = "changed while read"

# O_PATH (Linux) needs only search permission and opens nothing; elsewhere a read-only open.
_PATH = getattr(os, "O_PATH", os.O_RDONLY)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_STEP = _PATH | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC  # a directory on the way
_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC  # a directory to list
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | _CLOEXEC
_READ_STEP = 1 << 20


class Refused(Exception):
    """A file not opened or not read; ``reason`` is safe to show (one of the constants above)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _Link(Exception):
    """A symlink met where the walk expected none."""


def _parts(rel: str) -> list[str]:
    """The components of a plain relative path ("" is the base itself)."""
    if not rel:
        return []
    parts = rel.split("/")
    if rel.startswith("/") or "\0" in rel or any(p in ("", ".", "..") for p in parts):
        raise Refused(OUTSIDE)
    return parts


class Base:
    """A base directory held open: files are opened relative to it, whatever its path names now.

    ``path`` is the real path at the time of opening (resolved once, here). Safe to share
    between threads (no state changes after opening). A forked child that closed the
    descriptors it inherited calls :meth:`reopen`.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.path.realpath(os.fspath(path))
        self.fd = os.open(self.path, _STEP)
        info = os.fstat(self.fd)
        self.dev, self.ino = info.st_dev, info.st_ino
        self._pid = os.getpid()

    def reopen(self) -> None:
        """In a forked child that closed its inherited descriptors (forked_map.py): the base
        opened again by its path, and kept only if it is the very directory opened first
        (device and inode; the parent's descriptor keeps that inode from being reused).
        Otherwise every later open is Refused(CHANGED). Once per process."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self.fd = -1  # the inherited number may already name another file here
        try:
            fd = os.open(self.path, _STEP)
        except OSError:
            return
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (self.dev, self.ino):
            os.close(fd)
            return
        self.fd = fd

    def _root(self) -> int:
        if self.fd < 0:
            raise Refused(CHANGED)
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "Base":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the base itself ---------------------------------------------------------------

    def replaced(self) -> bool:
        """Whether ``path`` now names something other than the directory opened: another
        directory, a link (even to the same one), a file. A path that names nothing is not
        replaced (a watched directory renamed away may come back)."""
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return False
        except OSError:
            return True
        return not stat.S_ISDIR(info.st_mode) or (info.st_dev, info.st_ino) != (self.dev, self.ino)

    # -- walking -----------------------------------------------------------------------

    def _step(self, fd: int, name: str, flags: int) -> int:
        """``name`` opened as a directory in ``fd``; a link raises _Link, else Refused."""
        try:
            return os.open(name, flags, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                try:
                    if stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                        raise _Link() from None
                except OSError:
                    pass
                raise Refused(NOT_FOUND) from None
            raise Refused(NOT_FOUND if exc.errno == errno.ENOENT else UNREADABLE) from None

    def _dir(self, parts: list[str], flags: int = _STEP) -> int:
        """A new descriptor of the directory ``parts`` (no link followed on the way)."""
        try:
            fd = os.open(".", flags, dir_fd=self._root())
        except OSError:
            raise Refused(UNREADABLE) from None
        try:
            for name in parts:
                nxt = self._step(fd, name, flags)
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_dir(self, rel: str) -> int:
        """A listable descriptor of directory ``rel`` (the caller closes it); Refused if a
        component is missing, a link or unreadable."""
        try:
            return self._dir(_parts(rel), _LIST)
        except _Link:
            raise Refused(CHANGED) from None

    def listdir(self, rel: str) -> list[str]:
        """The names in directory ``rel``; OSError if it cannot be listed."""
        fd = self.open_dir(rel)
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    def lstat(self, rel: str) -> os.stat_result:
        """``lstat`` of ``rel`` reached without following a link; Refused otherwise."""
        parts = _parts(rel)
        if not parts:
            return os.fstat(self._root())
        try:
            fd = self._dir(parts[:-1])
        except _Link:
            raise Refused(CHANGED) from None
        try:
            return os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            raise Refused(NOT_FOUND) from None
        except OSError:
            raise Refused(UNREADABLE) from None
        finally:
            os.close(fd)

    def resolve(self, rel: str) -> str:
        """The link-free relative path ``rel`` leads to; Refused(OUTSIDE) if it leaves the base.

        Resolved by path once, then only ever opened from the descriptor without following."""
        _parts(rel)
        try:
            real = os.path.realpath(os.path.join(self.path, rel))
        except OSError:  # a link replaced between realpath's lstat and readlink (EINVAL)
            raise Refused(CHANGED) from None
        if real == self.path:
            return ""
        if not real.startswith(self.path.rstrip("/") + "/"):
            raise Refused(OUTSIDE)
        return real[len(self.path.rstrip("/")) + 1:]

    # -- opening and reading files -----------------------------------------------------

    def open(self, rel: str, *, follow: bool = True) -> tuple[int, os.stat_result]:
        """A read-only descriptor of regular file ``rel`` and its ``fstat`` (the caller closes it).

        A link anywhere on the way is refused, or with ``follow`` resolved once and opened only
        if it leads to a regular file inside the base."""
        try:
            return self._open(_parts(rel))
        except _Link:
            if not follow:
                raise Refused(CHANGED) from None
        target = self.resolve(rel)
        try:
            return self._open(_parts(target))
        except _Link:  # a loop (resolves the same again), else swapped since the resolution
            raise Refused(UNREADABLE if self.resolve(rel) == target else CHANGED) from None

    def _open(self, parts: list[str]) -> tuple[int, os.stat_result]:
        if not parts:
            raise Refused(NOT_REGULAR)
        root = self._root()
        parent = self._dir(parts[:-1]) if len(parts) > 1 else root
        try:
            try:
                fd = os.open(parts[-1], _FILE, dir_fd=parent)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise _Link() from None
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    raise Refused(NOT_FOUND) from None
                if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP):  # a socket
                    raise Refused(NOT_REGULAR) from None
                raise Refused(UNREADABLE) from None
        finally:
            if parent != root:
                os.close(parent)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise Refused(NOT_REGULAR)
        except BaseException:
            os.close(fd)
            raise
        return fd, info

    def read(self, rel: str, limit: int, *, follow: bool = True) -> tuple[bytes, os.stat_result]:
        """The bytes of regular file ``rel`` (at most ``limit``, else Refused(TOO_LARGE)) and
        the ``fstat`` of the file read."""
        fd, info = self.open(rel, follow=follow)
        try:
            return read_fd(fd, info, limit), info
        finally:
            os.close(fd)


def read_fd(fd: int, info: os.stat_result, limit: int) -> bytes:
    """All of an open regular file, refused past ``limit`` bytes (it may grow after ``fstat``)."""
    if info.st_size > limit:
        raise Refused(TOO_LARGE)
    parts, total = [], 0
    want = info.st_size + 1  # one read for a file that did not change, one more to see EOF
    try:
        while True:
            data = os.read(fd, min(want, limit + 1 - total))
            if not data:
                break
            parts.append(data)
            total += len(data)
            if total > limit:
                raise Refused(TOO_LARGE)
            want = _READ_STEP
    except OSError:
        raise Refused(UNREADABLE) from None
    if not parts:
        return b""
    return parts[0] if len(parts) == 1 else b"".join(parts)


def opened_inside(fd: int, base: str | os.PathLike) -> bool | None:
    """Whether the file open on ``fd`` is now under directory ``base`` (by /proc/self/fd);
    None where there is no procfs to ask."""
    try:
        opened = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    root = os.fspath(base).rstrip("/") + "/"
    return opened.startswith(root)
