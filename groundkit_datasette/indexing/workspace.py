"""Where a run writes: the collection's write lock, the private copy of the live file (or the
spare kept from the last run), and the publish by rename (adr/0002-publish-by-rename.md).

The live ``<name>.sqlite3`` is never written in place: an immutable reader (Datasette) takes
no locks, so rewriting its pages under it would show torn state.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import sqlite3
import stat
from pathlib import Path

from ..errors import CollectionBusy
from .names import sqlite_path
from .schema import add_cjk_tables, add_encoding_column, add_stat_columns, check_stamp, create_schema

log = logging.getLogger(__name__)

# (file mode, directory mode) of what ingest creates: the files hold the corpus.
PRIVATE_MODES = (0o600, 0o700)
GROUP_READABLE_MODES = (0o640, 0o750)


class WriteLock:
    """One writer per collection: an exclusive ``flock`` on ``.<name>.lock``, not waited for."""

    def __init__(self, path: Path, name: str, mode: int):
        self.path, self.name, self.mode = path, name, mode
        self.fd: int | None = None

    def __enter__(self) -> "WriteLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, self.mode)
        try:
            os.fchmod(fd, self.mode)
        except OSError:  # another user's lock file: its mode is theirs
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CollectionBusy(
                f"collection '{self.name}' is being written by another ingest; "
                "try again when it has finished"
            ) from None
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None


class Workspace:
    """The files of collection ``name`` under ``index_dir`` as one run sees them."""

    def __init__(self, index_dir: Path, name: str, spare_copy: bool = True):
        self.index_dir, self.name = index_dir, name
        # Keep a copy of the published file for the next run's private copy, made after the
        # publish (adr/0002, "spare copy"): a run then starts without copying the file.
        self.spare_copy = spare_copy
        self.file_mode, self.dir_mode = PRIVATE_MODES
        # Whether this run's private copy is the spare (then it is returned if nothing is published).
        self.took_spare = False
        # The replaced version's last name, dropped once the new one is live.
        self.retired = index_dir / f".{name}.sqlite3.ingest-{os.getpid()}.old"

    @property
    def path(self) -> Path:
        return sqlite_path(self.index_dir, self.name)

    def work_path(self) -> Path:
        return self.index_dir / f".{self.name}.sqlite3.ingest-{os.getpid()}"

    def choose_modes(self, group_readable: bool | None) -> None:
        """None: a new collection is private, a re-ingest keeps whether its group could read it."""
        group = group_readable
        if group is None:
            try:
                group = bool(self.path.stat().st_mode & stat.S_IRGRP)
            except FileNotFoundError:
                group = False
        self.file_mode, self.dir_mode = GROUP_READABLE_MODES if group else PRIVATE_MODES

    def make_dir(self, path: Path) -> bool:
        """Create ``path`` (and parents) with this run's directory mode; False if it existed.
        Only a directory ingest creates is made private: an existing one is the user's."""
        if path.exists():
            return False
        path.mkdir(parents=True, mode=self.dir_mode)
        os.chmod(path, self.dir_mode)  # mkdir's mode is filtered by the umask
        return True

    def restrict_tree(self, root: Path) -> None:
        """Give ``root`` and everything under it this run's modes (LanceDB creates its files 0644)."""
        def chmod(path, mode):
            try:
                if stat.S_IMODE(os.lstat(path).st_mode) != mode:
                    os.chmod(path, mode)
            except FileNotFoundError:
                pass

        chmod(root, self.dir_mode)
        for dirpath, dirnames, filenames in os.walk(root):
            for d in dirnames:
                chmod(os.path.join(dirpath, d), self.dir_mode)
            for f in filenames:
                chmod(os.path.join(dirpath, f), self.file_mode)

    def lock(self) -> WriteLock:
        return WriteLock(self.index_dir / f".{self.name}.lock", self.name, self.file_mode)

    def remove_stale_copies(self) -> None:
        # Only reachable while holding the lock, so any copy left here is from a dead run.
        for stale in self.index_dir.glob(f".{self.name}.sqlite3.ingest-*"):
            stale.unlink(missing_ok=True)
        spare = self.spare_path()
        for old in self.index_dir.glob(f".{self.name}.sqlite3.spare-*"):
            if old != spare:  # of another version, another boot, or half made
                old.unlink(missing_ok=True)

    def open_copy(self, work: Path) -> sqlite3.Connection:
        """The private copy at ``work``, opened: the spare copy renamed to a free name (renaming
        over a file would make ext4 start writing the whole spare out, adr/0034-one-file-edit-cost.md),
        else a copy of the live file, else a new collection; created with its final mode before
        any corpus text is written."""
        self.took_spare = self.path.exists() and self.take_spare(work)
        if not self.took_spare:
            os.close(os.open(work, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self.file_mode))
            os.chmod(work, self.file_mode)
        live = self.path
        if live.exists():
            if not self.took_spare:
                copy_file(live, work)
            conn = _connect_private(work)
            try:
                check_stamp(conn)
                add_encoding_column(conn)  # older collections: additive, NULL for their rows
                add_stat_columns(conn)
                add_cjk_tables(conn)
            except Exception:
                conn.close()
                raise
        else:
            conn = _connect_private(work)
            create_schema(conn)
        conn.execute("PRAGMA foreign_keys = ON")
        conn.isolation_level = None
        return conn

    def publish(self, work: Path) -> None:
        with open(work, "rb") as f:
            os.fsync(f.fileno())
        try:
            # A second name for the version being replaced, so that the rename does not free
            # its blocks (a large file takes a while); it is unlinked after the publish.
            os.link(self.path, self.retired)
        except OSError:
            pass
        os.replace(work, self.path)
        dir_fd = os.open(self.index_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def discard(self, work: Path, published: bool) -> None:
        """After a run: a copy that published nothing is the spare again (or removed), and the
        replaced version's last name goes."""
        if not published and self.took_spare:
            self.return_spare(work)
        if work.exists():
            work.unlink()
        self.retired.unlink(missing_ok=True)

    def spare_path(self) -> Path | None:
        """Where a spare copy of the live file as it is now would be: its name holds the boot
        and the live file's identity, so a copy of another version or one made before a crash
        (never synced) is not used."""
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                boot = f.read().strip()
            st = self.path.stat()
        except OSError:
            return None
        return self.index_dir / (f".{self.name}.sqlite3.spare-{boot}-{st.st_dev}-{st.st_ino}-"
                                 f"{st.st_size}-{st.st_mtime_ns}")

    def make_spare(self) -> None:
        """Copy the file just published for the next run (under the lock, never read by anyone
        else). Synced here, after the publish, so that the next publish's fsync writes only what
        that run changed; a crash before then changes the boot id in its name, so a copy that
        may be torn is never used."""
        spare = self.spare_path()
        if spare is None:
            return
        tmp = self.index_dir / f".{self.name}.sqlite3.spare-{os.getpid()}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self.file_mode))
            os.chmod(tmp, self.file_mode)
            copy_file(self.path, tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, spare)
        except OSError as exc:  # only the next run's speed depends on it
            log.warning("could not keep a spare copy of collection '%s': %s", self.name, exc.strerror)
            tmp.unlink(missing_ok=True)

    def return_spare(self, work: Path) -> None:
        """A run that published nothing rolled its copy back (SQLite restores every page it
        changed, and the size): it is the spare again, unless something was committed to it
        (the header's change counter says so). So a refused run leaves the directory as it was."""
        spare = self.spare_path()
        try:
            with open(self.path, "rb") as a, open(work, "rb") as b:
                if spare is not None and a.read(100) == b.read(100):
                    os.replace(work, spare)
        except OSError:
            pass

    def take_spare(self, work: Path) -> bool:
        """Make the spare copy of the live file the private copy, if there is one."""
        spare = self.spare_path()
        if spare is None or not spare.exists():
            return False
        try:
            with open(self.path, "rb") as a, open(spare, "rb") as b:
                same = a.read(100) == b.read(100)  # the header holds SQLite's change counter
            if not same:
                spare.unlink()
                return False
            work.unlink(missing_ok=True)  # a dead run's, with this pid
            os.rename(spare, work)
            os.chmod(work, self.file_mode)
        except OSError:
            return False
        return True


def copy_file(src: Path, dst: Path) -> None:
    """Copy ``src`` over the (existing, empty) ``dst`` with ``copy_file_range``: a clone where the
    file system can share blocks (btrfs, XFS), a copy inside the kernel elsewhere (adr/0034-one-file-edit-cost.md)."""
    with open(src, "rb") as fi, open(dst, "r+b") as fo:
        size, done = os.fstat(fi.fileno()).st_size, 0
        try:
            while done < size:
                n = os.copy_file_range(fi.fileno(), fo.fileno(), size - done, done, done)
                if n == 0:
                    break
                done += n
        except OSError:  # not offered here (another file system, an old kernel): copy in Python
            done = 0
        if done < size:
            fi.seek(0)
            fo.seek(0)
            fo.truncate()
            shutil.copyfileobj(fi, fo, 1 << 20)


def _connect_private(work: Path) -> sqlite3.Connection:
    # The copy is private and discarded on failure: no fsyncs, from the schema's first
    # statement on (a new file's DDL synced statement by statement took 0.1 s). The journal
    # stays on disk (written without syncing): one run is one transaction, and an in-memory
    # journal would hold every page the run changes (a re-chunk changes them all).
    conn = sqlite3.connect(work)
    conn.execute("PRAGMA synchronous = OFF")
    return conn
