"""benchmarks/ingest.py's memory sampler: the figure issue 14's ingest memory target is judged on.

A forked child shares its parent's pages until either writes them. The sampler's PSS must count
such a page once (the RSS sum counts it per process), and must still count what a child
allocates on its own."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import ingest as bench  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(),
                                reason="needs Linux's /proc/PID/smaps_rollup")

MB = 1 << 20


def _sample(code: str) -> dict:
    proc = subprocess.Popen([sys.executable, "-c", code])
    peaks: dict = {}
    bench._sample_memory(proc, peaks, every=0.05)
    assert proc.wait() == 0
    return peaks


def test_pages_shared_since_the_fork_are_counted_once():
    # 200 MB written before the fork, then held by both processes, written by neither.
    peaks = _sample(
        "import os, time\n"
        "x = bytearray(200 << 20)\n"
        "pid = os.fork()\n"
        "time.sleep(1.5)\n"
        "os._exit(0) if pid == 0 else os.waitpid(pid, 0)\n")
    assert peaks["tree_processes"] == 2
    assert peaks["tree_rss_sum_mb"] > 400  # counted in each process
    assert 200 <= peaks["tree_pss_mb"] < 300  # counted once


def test_what_a_child_allocates_itself_is_counted():
    peaks = _sample(
        "import os, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    y = bytearray(150 << 20)\n"
        "    time.sleep(1.5)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n")
    assert peaks["tree_processes"] == 2
    assert peaks["tree_pss_mb"] >= 150
