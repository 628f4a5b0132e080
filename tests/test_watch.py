"""`groundkit ingest --watch` against real file-system events.

The watcher runs as a real subprocess; the test changes files and polls the published
collection (a fresh read-only connection each time, as a reader would) until it shows
the change or a timeout passes. Nothing here asserts on elapsed time.
"""

import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

TIMEOUT = 120.0


def read_state(index: Path) -> tuple[int, set[str]]:
    """(generation, document sources) of the published collection; (0, set()) before any."""
    path = index / "docs.sqlite3"
    if not path.exists():
        return 0, set()
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        generation = conn.execute(
            "SELECT value FROM groundkit_manifest WHERE key = 'generation'").fetchone()
        sources = {r[0] for r in conn.execute("SELECT source FROM documents")}
    finally:
        conn.close()
    return int(generation[0]) if generation else 0, sources


def wait_for(index: Path, predicate, what: str, proc=None):
    deadline = time.monotonic() + TIMEOUT
    while True:
        generation, sources = read_state(index)
        if predicate(generation, sources):
            return generation, sources
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"watcher exited ({proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}; last generation {generation}, "
                        f"{len(sources)} documents")
        time.sleep(0.05)  # polling interval, not an assertion


class Watcher:
    def __init__(self, tmp_path: Path, *paths: Path):
        self.index = tmp_path / "index"
        self.log = tmp_path / "watch.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "groundkit_datasette.cli", "ingest", *map(str, paths),
             "-c", "docs", "--index-dir", str(self.index), "--embedder", "none",
             "--watch", "--debounce", "100"],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log.read_text()

    def wait(self, predicate, what):
        return wait_for(self.index, predicate, what, self.proc)

    def ready(self):
        deadline = time.monotonic() + TIMEOUT
        while "watching" not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("watcher did not start: " + self.output())
            time.sleep(0.05)

    def stop(self, signum=signal.SIGINT) -> int:
        self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail("watcher did not stop: " + self.output())

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def watcher_factory(tmp_path):
    started = []

    def start(*paths):
        w = Watcher(tmp_path, *paths)
        started.append(w)
        w.ready()
        return w

    yield start
    for w in started:
        w.close()


def assert_clean(index: Path):
    """No private copy left behind, and the write lock is free."""
    leftovers = [p.name for p in index.iterdir() if ".ingest-" in p.name]
    assert leftovers == []
    fd = os.open(index / ".docs.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if a process still holds it
    finally:
        os.close(fd)
    conn = sqlite3.connect(f"file:{index / 'docs.sqlite3'}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


def test_watch_adds_updates_and_removes_files_then_stops_on_sigint(tmp_path, watcher_factory):
    """Each change is published as a new generation; a deleted file's document goes; Ctrl-C
    exits 0 with no lock held and no half-written copy."""
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "a.txt").write_text("Anemometers measure wind speed.\n")
    w = watcher_factory(root)
    g1, _ = w.wait(lambda g, s: s == {"a.txt"}, "the initial ingest")

    (root / "b.md").write_text("# Barometer\n\nA barometer measures air pressure.\n")
    g2, _ = w.wait(lambda g, s: s == {"a.txt", "b.md"}, "b.md to be added")
    assert g2 > g1

    (root / "a.txt").write_text("Anemometers now also log gust direction.\n")

    def updated(g, s):
        conn = sqlite3.connect(f"file:{w.index / 'docs.sqlite3'}?mode=ro", uri=True)
        try:
            return bool(conn.execute(
                "SELECT 1 FROM chunks WHERE content LIKE '%gust direction%'").fetchall())
        finally:
            conn.close()

    w.wait(updated, "a.txt's new text")
    # The generation passed to a predicate was read before it opened its own connection, so
    # a publish in between would pair the new text with the old number: read it again.
    g3, _ = read_state(w.index)
    assert g3 > g2

    (root / "b.md").unlink()
    g4, _ = w.wait(lambda g, s: s == {"a.txt"}, "b.md to be removed")
    assert g4 > g3

    assert w.stop(signal.SIGINT) == 0
    assert "generation" in w.output() and "stopped" in w.output()
    assert "Traceback" not in w.output()
    assert_clean(w.index)


def test_a_burst_of_2000_files_ends_consistent(tmp_path, watcher_factory):
    """Thousands of events at once (more than one batch, maybe an overflowing queue) end in a
    collection holding exactly the files on disk, each with its chunks and searchable."""
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "seed.txt").write_text("seed document\n")
    w = watcher_factory(root)
    w.wait(lambda g, s: s == {"seed.txt"}, "the initial ingest")
    burst = root / "burst"
    burst.mkdir()
    for i in range(2000):
        (burst / f"f{i:04d}.txt").write_text(f"note number {i} token{i}x\n")
    expected = {"seed.txt"} | {f"burst/f{i:04d}.txt" for i in range(2000)}
    w.wait(lambda g, s: s == expected, "all 2,000 files")
    for i in range(0, 2000, 2):
        (burst / f"f{i:04d}.txt").unlink()
    expected = {"seed.txt"} | {f"burst/f{i:04d}.txt" for i in range(1, 2000, 2)}
    w.wait(lambda g, s: s == expected, "half of them to be removed")

    conn = sqlite3.connect(f"file:{w.index / 'docs.sqlite3'}?mode=ro", uri=True)
    try:
        orphans = conn.execute(
            "SELECT count(*) FROM documents d WHERE NOT EXISTS "
            "(SELECT 1 FROM chunks c WHERE c.document_id = d.document_id)").fetchone()[0]
        assert orphans == 0
        assert conn.execute("SELECT count(*) FROM chunks").fetchone()[0] == 1001
    finally:
        conn.close()
    from groundkit_datasette.retrieval.collection import Collection

    with Collection.open("docs", index_dir=w.index) as col:
        assert [h.source for h in col.search(query="token1999x", mode="bm25").hits] == [
            "burst/f1999.txt"]
        assert col.search(query="token1998x", mode="bm25").hits == []
    assert w.stop(signal.SIGTERM) == 0
    assert_clean(w.index)


def test_directories_renamed_away_and_back(tmp_path, watcher_factory):
    """A subdirectory renamed out of the tree loses its documents; the watched directory
    itself renamed away empties the collection without ending the watcher, and its return
    brings the documents back under the same names."""
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / "top.txt").write_text("top level file\n")
    (root / "sub" / "inner.txt").write_text("inner file\n")
    w = watcher_factory(root)
    w.wait(lambda g, s: s == {"top.txt", "sub/inner.txt"}, "the initial ingest")

    (root / "sub").rename(tmp_path / "sub-elsewhere")
    w.wait(lambda g, s: s == {"top.txt"}, "sub/ to be removed")

    root.rename(tmp_path / "corpus-away")
    w.wait(lambda g, s: s == set() and g > 0, "the renamed-away root's documents to go")
    assert "gone:" in w.output()

    (tmp_path / "corpus-away").rename(root)
    (tmp_path / "sub-elsewhere").rename(root / "sub")
    w.wait(lambda g, s: s == {"top.txt", "sub/inner.txt"}, "the documents to come back")
    (root / "later.txt").write_text("written after the return\n")
    w.wait(lambda g, s: "later.txt" in s, "a change after the return to be watched")
    assert w.stop(signal.SIGINT) == 0
    assert_clean(w.index)


def test_sigint_during_a_batch_leaves_no_copy(tmp_path, watcher_factory):
    """Ctrl-C while a batch is writing its private copy abandons it: exit 0, the copy
    removed, the lock free and the published collection intact."""
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "seed.txt").write_text("seed document\n")
    w = watcher_factory(root)
    g1, _ = w.wait(lambda g, s: s == {"seed.txt"}, "the initial ingest")
    for i in range(3000):
        (root / f"f{i:04d}.md").write_text(f"# Note {i}\n\n" + "words and more words " * 40)
    deadline = time.monotonic() + TIMEOUT
    while not any(".ingest-" in p.name for p in w.index.iterdir()):
        if time.monotonic() > deadline:
            pytest.fail("no batch started")
        time.sleep(0.005)
    assert w.stop(signal.SIGINT) == 0
    assert_clean(w.index)
    generation, sources = read_state(w.index)
    assert generation >= g1 and "seed.txt" in sources


def test_watch_refuses_a_missing_path(tmp_path):
    """A path that does not exist at the start is a usage error, as without --watch."""
    result = subprocess.run(
        [sys.executable, "-m", "groundkit_datasette.cli", "ingest", str(tmp_path / "nope"),
         "-c", "docs", "--index-dir", str(tmp_path / "index"), "--embedder", "none", "--watch"],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 2
    assert "path does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def published_text(index: Path) -> str:
    conn = sqlite3.connect(f"file:{index / 'docs.sqlite3'}?mode=ro", uri=True)
    try:
        return "\n".join(r[0] for r in conn.execute("SELECT content FROM chunks"))
    finally:
        conn.close()


@pytest.mark.parametrize("replacement", ["link", "directory"])
def test_the_base_replaced_stops_the_watcher_without_ingesting_elsewhere(
        tmp_path, watcher_factory, replacement):
    """The watched base is pinned at the start (adr/0049): replaced by a link to another folder,
    or by another directory, the watcher says so and exits 1; nothing of the other folder is
    ever published, and the lock and private copy are cleaned up."""
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "a.txt").write_text("Anemometers measure wind speed.\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "foreign.txt").write_text("zyxforeign text from another folder\n")
    w = watcher_factory(root)
    w.wait(lambda g, s: s == {"a.txt"}, "the initial ingest")

    root.rename(tmp_path / "corpus-moved")
    if replacement == "link":
        root.symlink_to(other, target_is_directory=True)
    else:
        other.rename(root)
    try:
        code = w.proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail("the watcher went on after its base was replaced: " + w.output())
    out = w.output()
    assert code == 1, out
    assert "is no longer the directory the watch started on" in out
    assert "Traceback" not in out
    _generation, sources = read_state(w.index)
    assert "foreign.txt" not in sources and "zyxforeign" not in published_text(w.index)
    assert_clean(w.index)
