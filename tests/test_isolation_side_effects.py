"""Isolated calls change nothing process-wide in the caller (issue 35): ``gc.freeze`` runs in
the fork server's own interpreter only, and neither kind of child touches the caller's
signal handlers, standard streams or garbage collector (indexing/isolation_server.py)."""

import gc
import signal
import sys

from groundkit_datasette.indexing import isolation


def answer(value):
    return [value, isolation.in_child()]


def test_isolated_calls_leave_the_callers_process_state_alone():
    frozen, stderr, stdout = gc.get_freeze_count(), sys.stderr, sys.stdout
    handlers = {s: signal.getsignal(s) for s in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM)}
    assert isolation.run_isolated(answer, 1, timeout=60, memory_bytes=1 << 28) == [1, True]
    assert isolation.run_in_worker(answer, 2, timeout=60, memory_bytes=1 << 28) == [2, True]
    assert not isolation.in_child()
    assert gc.get_freeze_count() == frozen and gc.isenabled()
    assert sys.stderr is stderr and sys.stdout is stdout
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    isolation.end_workers()
