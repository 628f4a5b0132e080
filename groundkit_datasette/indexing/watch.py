"""Watch mode: re-ingest a collection whenever its files change.

Each batch of file-system events (gathered by ``watchfiles`` until the tree has been quiet
for the debounce time) runs one ordinary incremental ingest of every watched path: the
same walk, hashing and pruning as a one-off ``groundkit ingest``, published by rename as
one new generation. Events only say *when* to look, never *what* changed, so a lost or
coalesced event (a burst of thousands, an inotify queue overflow, a directory renamed)
cannot leave the collection out of step with the disk once the next batch has run.

The base directory is pinned at the start: opened once and held (safe_read.Base), every batch
reads through that descriptor, and its device and inode are compared with what its path names
on every wake. A path that now names something else (another directory, a link, even one to
the same directory) stops the watcher with :class:`BaseReplaced` instead of ingesting
elsewhere (adr/0049). A watched path that disappears (renamed away, deleted) is a root with
nothing in it: its documents are removed, and the path is picked up again if it comes back
(the base only as the same directory). SIGINT and SIGTERM stop the loop; a batch in progress is abandoned the way ingest abandons any run
(its private copy removed, the lock released), so the published collection is never
half-written. See adr/0021-watch-mode.md.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from ..errors import GroundkitError, IngestError, InvalidRequest
from . import safe_read
from .ingest import Indexer, IngestReport

__all__ = ["DEFAULT_DEBOUNCE_MS", "BaseReplaced", "watch"]

log = logging.getLogger(__name__)

# Quiet time before a batch runs; a steady stream of changes is cut into batches at
# DEBOUNCE_CAP_FACTOR times that.
DEFAULT_DEBOUNCE_MS = 300
DEBOUNCE_CAP_FACTOR = 10
# How often the loop wakes without events: to retry a failed batch and to notice a vanished
# path coming back.
WAKE_MS = 1000


class BaseReplaced(IngestError):
    """The watched base directory's path names another directory (or a link) than at start."""

    kind = "base_replaced"


class _Stop(BaseException):
    """Raised by the signal handler inside a running batch (like KeyboardInterrupt)."""


def watch(
    indexer: Indexer,
    paths: Sequence[str | Path],
    *,
    debounce_ms: int = DEFAULT_DEBOUNCE_MS,
    on_batch: Callable[[int, int, IngestReport], None] | None = None,
    echo: Callable[[str], None] = lambda line: print(line, flush=True),
) -> int:
    """Ingest ``paths`` now and again after every batch of changes, until SIGINT or SIGTERM.

    ``on_batch(number, changes, report)`` is told about the first ingest (number 0) and every
    batch that had events or published; by default a progress line goes to ``echo``. Returns the number of batches run. Errors
    from the first ingest (a bad path, a busy collection) propagate: nothing is watched.
    :class:`BaseReplaced` ends the watch when the base's path names another directory.
    """
    base, roots = indexer.scanner.resolve_inputs(list(paths), indexer.base_dir)
    indexer.base_dir = base  # sources keep their names when a watched path vanishes
    try:
        tree = safe_read.Base(base)  # pinned for the whole watch (resolved this once)
    except OSError as exc:
        raise InvalidRequest(f"base directory cannot be opened: {base} ({exc.strerror})") from None
    with tree:
        return _watch(indexer, tree, base, roots, debounce_ms, on_batch, echo)


def _watch(indexer: Indexer, tree: safe_read.Base, base: Path, roots: list[Path], debounce_ms: int,
           on_batch, echo) -> int:
    import watchfiles

    index_dir = indexer.index_dir.resolve()
    on_batch = on_batch or (lambda n, changes, report: echo(_batch_line(n, changes, report)))
    stop = threading.Event()
    state = {"in_batch": False}

    def handle(signum, frame):
        stop.set()
        if state["in_batch"]:
            raise _Stop()

    def relevant(change, path: str) -> bool:
        p = Path(path)
        if p == index_dir or index_dir in p.parents:
            return False  # our own publishing
        try:
            parts = p.relative_to(base).parts
        except ValueError:
            return False
        return not any(indexer.scanner.excluded("/".join(parts[: i + 1])) for i in range(len(parts)))

    def check_base() -> None:
        if tree.replaced():
            raise BaseReplaced(
                f"the watched base directory {base} is no longer the directory the watch "
                "started on (replaced by another directory or a link); stopping without "
                "ingesting from it")

    def run_batch(number: int, changes: int) -> bool:
        check_base()
        state["in_batch"] = True
        try:
            if stop.is_set():
                return True
            report = indexer.ingest([str(r) for r in roots], missing_ok=True, pinned=tree)
        except GroundkitError as error:
            state["in_batch"] = False
            echo(f"batch {number}: not published ({error}); retrying")
            return False
        finally:
            state["in_batch"] = False
        if changes or report.published or report.failed:
            on_batch(number, changes, report)  # a quiet re-check that found nothing says nothing
        return True

    previous = {signal.SIGINT: signal.signal(signal.SIGINT, handle),
                signal.SIGTERM: signal.signal(signal.SIGTERM, handle)}
    batches = 0
    try:
        state["in_batch"] = True
        try:
            report = indexer.ingest([str(r) for r in roots], pinned=tree)  # the paths must exist at the start
        finally:
            state["in_batch"] = False
        on_batch(0, 0, report)
        batches = 1
        # Changes made while a batch walked the tree, before the watcher (re)started, raise no
        # event: each start of the watcher is followed by one more batch on its first wake.
        pending = True
        present = _present(roots)
        echo(f"watching {len(present)} path(s) for changes (debounce {debounce_ms} ms); "
             "Ctrl-C to stop")
        while not stop.is_set():
            check_base()
            if not present:  # nothing to watch until a path comes back
                if pending:  # the documents of the paths that went
                    pending = not run_batch(batches, 0)
                    batches += 1
                stop.wait(WAKE_MS / 1000)
                present = _present(roots)  # a path came back: the watcher's first wake ingests
                pending = pending or bool(present)
                continue
            try:
                for changes in watchfiles.watch(
                    *present, watch_filter=relevant, debounce=debounce_ms * DEBOUNCE_CAP_FACTOR,
                    step=debounce_ms, stop_event=stop, rust_timeout=WAKE_MS,
                    yield_on_timeout=True, raise_interrupt=False, ignore_permission_denied=True,
                ):
                    if stop.is_set():
                        break
                    check_base()  # on every wake, events or not (at least every WAKE_MS)
                    now = _present(roots)
                    for gone in sorted(set(present) - set(now)):
                        echo(f"gone: {gone} (its documents are removed)")
                    if changes or pending or now != present:
                        pending = not run_batch(batches, len(changes))
                        batches += 1
                    if now != present:
                        present = now
                        pending = True
                        break  # watch the paths that exist now
            except OSError as exc:  # a watched path vanished under the watcher
                log.info("watcher restarted: %s", exc)
                now = _present(roots)
                for gone in sorted(set(present) - set(now)):
                    echo(f"gone: {gone} (its documents are removed)")
                present = now
                pending = True
    except (_Stop, KeyboardInterrupt):
        pass
    finally:
        for signum in previous:
            signal.signal(signum, signal.SIG_IGN)  # the clean-up below is not interrupted
        _clean_up(indexer)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    echo(f"stopped after {batches} batch(es)")
    return batches


def _clean_up(indexer: Indexer) -> None:
    """Remove a private copy an interrupted batch may have left (only while holding the lock)."""
    try:
        with indexer.workspace.lock():
            indexer.workspace.remove_stale_copies()
    except (GroundkitError, OSError):
        pass  # another ingest holds the lock: the copies are its own


def _present(roots: list[Path]) -> list[Path]:
    """The watched paths that exist, without one inside another (watching is recursive)."""
    existing = [r for r in dict.fromkeys(roots) if r.exists()]
    return [r for r in existing if not any(p in existing for p in r.parents)]


def _batch_line(number: int, changes: int, report: IngestReport) -> str:
    skipped = sum(report.skipped.values())
    what = "initial ingest" if number == 0 else f"batch {number} ({changes} change(s))"
    counts = (f"{report.added} added, {report.updated} updated, {report.removed} removed, "
              f"{skipped} skipped, {report.failed} failed")
    if report.published:
        return f"{what}: {counts}; generation {report.generation} published"
    return f"{what}: {counts}; nothing changed (generation {report.generation})"
