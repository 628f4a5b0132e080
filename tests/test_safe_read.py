"""One safe open for every file ingest reads (indexing/safe_read.py, adr/0049): whatever the
walk saw, what is opened is a regular file inside the pinned base, read with a bound.

Real files, links, FIFOs and device nodes; real swaps, both between the walk and the read (made
at the ingest's own "start" event, which comes after the walk and before any read) and racing
the reader from another process. Nothing here asserts on time.
"""

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from groundkit_datasette.indexing import safe_read
from groundkit_datasette.indexing.ingest import Indexer, ingest
from groundkit_datasette.retrieval import citations

SECRET = "zqxsecretword outside the base"


@pytest.fixture
def outside(tmp_path) -> Path:
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text(SECRET + "\n")
    return secret


@pytest.fixture
def base(tmp_path) -> Path:
    root = tmp_path / "base"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha text\n")
    (root / "sub" / "b.txt").write_text("beta text\n")
    return root


def chunk_texts(path: Path) -> str:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return "\n".join(r[0] for r in conn.execute("SELECT content FROM chunks"))
    finally:
        conn.close()


# -- the open itself -------------------------------------------------------------------


def test_a_regular_file_is_read_with_its_fstat(base):
    with safe_read.Base(base) as tree:
        data, info = tree.read("sub/b.txt", 100)
    assert data == b"beta text\n" and stat.S_ISREG(info.st_mode) and info.st_size == len(data)


def swap_in(path: Path, kind: str, outside: Path, inside_target: Path | None = None):
    """Replace ``path`` (a regular file the walk saw) by something else, atomically."""
    tmp = path.with_name(path.name + ".swap")
    if kind == "link-outside":
        tmp.symlink_to(outside)
    elif kind == "link-dev-zero":
        tmp.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(tmp)
    elif kind == "device":
        os.mknod(tmp, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # what /dev/zero is
    elif kind == "link-to-fifo":
        tmp.symlink_to(inside_target)
    os.replace(tmp, path)


SWAPS = [("link-outside", safe_read.OUTSIDE), ("link-dev-zero", safe_read.OUTSIDE),
         ("fifo", safe_read.NOT_REGULAR), ("device", safe_read.NOT_REGULAR),
         ("link-to-fifo", safe_read.NOT_REGULAR)]


@pytest.mark.parametrize("kind,reason", SWAPS)
def test_the_open_refuses_what_was_swapped_in_after_the_walk(base, outside, kind, reason):
    if kind == "device" and os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    fifo = base / "sub" / "pipe"
    os.mkfifo(fifo)
    with safe_read.Base(base) as tree:
        assert stat.S_ISREG(tree.lstat("a.txt").st_mode)  # what a walk sees
        swap_in(base / "a.txt", kind, outside, fifo)
        with pytest.raises(safe_read.Refused) as refused:
            tree.read("a.txt", 1 << 20)  # a FIFO would block here, /dev/zero never end
        assert refused.value.reason == reason
        assert str(base) not in str(refused.value)


def test_a_directory_on_the_way_swapped_for_a_link_is_refused(base, outside):
    with safe_read.Base(base) as tree:
        (base / "sub").rename(base.parent / "sub-away")
        (base / "sub").symlink_to(outside.parent, target_is_directory=True)
        (outside.parent / "b.txt").write_text(SECRET)
        with pytest.raises(safe_read.Refused) as followed:
            tree.read("sub/b.txt", 100)  # resolved: leads outside
        with pytest.raises(safe_read.Refused) as strict:
            tree.read("sub/b.txt", 100, follow=False)  # the serve-time read follows nothing
    assert followed.value.reason == safe_read.OUTSIDE
    assert strict.value.reason == safe_read.CHANGED


def test_a_link_inside_the_base_is_followed_only_when_allowed(base):
    (base / "alias.txt").symlink_to(base / "sub" / "b.txt")
    (base / "loop1").symlink_to(base / "loop2")
    (base / "loop2").symlink_to(base / "loop1")
    with safe_read.Base(base) as tree:
        assert tree.read("alias.txt", 100)[0] == b"beta text\n"
        with pytest.raises(safe_read.Refused) as strict:
            tree.read("alias.txt", 100, follow=False)
        with pytest.raises(safe_read.Refused) as loop:
            tree.read("loop1", 100)
    assert strict.value.reason == safe_read.CHANGED
    assert loop.value.reason == safe_read.UNREADABLE


def test_reads_are_bounded_even_when_fstat_says_nothing(base):
    with safe_read.Base(base) as tree:
        with pytest.raises(safe_read.Refused) as refused:
            tree.read("a.txt", 5)
        assert tree.read("a.txt", len("alpha text\n"))[0] == b"alpha text\n"
    assert refused.value.reason == safe_read.TOO_LARGE
    # A file whose size fstat does not know (procfs says 0) is still cut at the bound.
    fd = os.open("/proc/self/status", os.O_RDONLY)
    try:
        info = os.fstat(fd)
        assert info.st_size == 0
        with pytest.raises(safe_read.Refused) as refused:
            safe_read.read_fd(fd, info, 10)
    finally:
        os.close(fd)
    assert refused.value.reason == safe_read.TOO_LARGE


def test_the_pinned_base_is_read_whatever_its_path_names_now(tmp_path, base):
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.txt").write_text(SECRET)
    with safe_read.Base(base) as tree:
        assert not tree.replaced()
        base.rename(tmp_path / "base-moved")
        assert not tree.replaced()  # nothing at the path: not replaced (it may come back)
        base.symlink_to(other, target_is_directory=True)
        assert tree.replaced()
        assert tree.read("a.txt", 100)[0] == b"alpha text\n"  # still the directory opened
        base.unlink()
        base.mkdir()  # a new, different directory at the same path
        assert tree.replaced()
        base.rmdir()
        (tmp_path / "base-moved").rename(base)
        assert not tree.replaced()  # the same directory came back


def in_child(tree, rel: str) -> str:
    """What a forked map-stage child reads after closing its inherited descriptors."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.closerange(3, w)  # as forked_map does: the base's descriptor goes too
            tree.reopen()
            try:
                answer = tree.read(rel, 100)[0].decode()
            except safe_read.Refused as refused:
                answer = "refused: " + refused.reason
            os.write(w, answer.encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        answer = pipe.read().decode()
    assert os.waitpid(pid, 0)[1] == 0
    return answer


def test_a_child_reopens_the_base_only_if_it_is_the_same_directory(tmp_path, base):
    with safe_read.Base(base) as tree:
        assert in_child(tree, "a.txt") == "alpha text\n"
        base.rename(tmp_path / "base-moved")
        base.mkdir()
        (base / "a.txt").write_text(SECRET)
        assert in_child(tree, "a.txt") == "refused: " + safe_read.CHANGED
        assert tree.read("a.txt", 100)[0] == b"alpha text\n"  # this process keeps its pin


# -- ingest: swaps between the walk and the read ---------------------------------------


def swap_after_walk(base: Path, swaps: dict, outside: Path, then=lambda: None):
    """A progress callback that makes the swaps when the ingest says the walk is done."""

    def progress(event):
        if event["event"] == "start":
            for name, kind in swaps.items():
                swap_in(base / name, kind, outside, base / "sub" / "pipe")
            then()

    return progress


# Writes the secret into a FIFO once a reader opens it: a reader that followed the name would
# get the text.
FEED_FIFO = """
import os, sys
try:
    fd = os.open(sys.argv[1], os.O_WRONLY)
    os.write(fd, sys.argv[2].encode())
    os.close(fd)
except OSError:
    pass
"""

FLIPPER = """
import os, sys
target, outside = sys.argv[1], sys.argv[2]
regular, link = target + ".regular", target + ".link"
while True:
    with open(regular, "w") as f:
        f.write("the regular flip text\\n")
    os.replace(regular, target)
    os.symlink(outside, link)
    os.replace(link, target)
"""


def test_ingest_skips_files_swapped_between_walk_and_read(tmp_path, base, outside):
    for i in range(80):
        (base / "sub" / f"pad{i:02d}.txt").write_text(f"padding document {i}\n")
    for name in ("link.txt", "fifo.txt", "devzero.txt", "device.txt"):
        (base / name).write_text(f"plain {name}\n")
    os.mkfifo(base / "sub" / "pipe")  # skipped by the walk itself
    swaps = {"link.txt": "link-outside", "fifo.txt": "fifo", "devzero.txt": "link-dev-zero"}
    if os.geteuid() == 0:
        swaps["device.txt"] = "device"
    feeders = []

    def feed():
        feeders.append(subprocess.Popen([sys.executable, "-c", FEED_FIFO, str(base / "fifo.txt"), SECRET]))

    index = tmp_path / "index"
    try:
        report = Indexer("swaps", index_dir=index, embedder="none",
                         progress=swap_after_walk(base, swaps, outside, feed)).ingest([base])
    finally:
        for proc in feeders:  # a reader that never came: open the FIFO once to let it end
            while proc.poll() is None:
                os.close(os.open(base / "fifo.txt", os.O_RDONLY | os.O_NONBLOCK))
                try:
                    proc.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    pass
    skipped = dict(report.skipped_files)
    assert skipped["link.txt"] == "symlink outside base directory"
    assert skipped["devzero.txt"] == "symlink outside base directory"
    assert skipped["fifo.txt"] == "not a regular file"
    if "device.txt" in swaps:
        assert skipped["device.txt"] == "not a regular file"
    assert report.added == 2 + 80 + (0 if "device.txt" in swaps else 1)
    assert SECRET.split()[0] not in chunk_texts(index / "swaps.sqlite3")
    assert report.map_stage == "local"


def test_a_file_flipping_to_an_outside_link_is_never_published(tmp_path, base, outside):
    """A real race: another process flips ``flip.txt`` between a regular file and a link to a
    file outside the base (each state put in place by an atomic rename) while ingests run.
    Whichever state the walk and the read meet, the outside text is never read."""
    for j in range(70):
        (base / f"pad{j:02d}.txt").write_text(f"padding {j}\n")
    target = base / "flip.txt"
    target.write_text("the regular flip text\n")
    flipper = subprocess.Popen([sys.executable, "-c", FLIPPER, str(target), str(outside)])
    outcomes, stages = {}, set()
    try:
        for i in range(25):
            index = tmp_path / f"index{i}"
            report = Indexer("race", index_dir=index, embedder="none",
                             exclude=["*.regular", "*.link"]).ingest([base])
            outcome = dict(report.skipped_files).get("flip.txt", "published")
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            stages.add(report.map_stage)
            assert SECRET.split()[0] not in chunk_texts(index / "race.sqlite3"), i
    finally:
        flipper.kill()
        flipper.wait()
    assert set(outcomes) <= {"published", "symlink outside base directory", "changed while read",
                             "unreadable"}, outcomes
    print("flip.txt over 25 ingests:", outcomes, stages)


def test_a_file_over_the_bound_is_skipped_by_its_size(tmp_path, base):
    from groundkit_datasette.indexing.extract import MAX_FILE_BYTES

    with open(base / "big.txt", "wb") as f:  # sparse: 64 MiB and a byte, nothing written
        f.truncate(MAX_FILE_BYTES + 1)
    report = ingest([base], collection="sizes", index_dir=tmp_path / "index", embedder="none")
    assert ("big.txt", "too large") in report.skipped_files
    assert report.added == 2


# -- the walk ------------------------------------------------------------------------


def remove_deep(root: Path) -> None:
    """shutil.rmtree recurses once per level (pytest's clean-up of old temporary directories
    too): move grandchild directories up beside ``root`` until every tree removed is shallow."""
    pending, n = [root], 0
    while pending:
        current = pending.pop()
        for entry in list(os.scandir(current)):
            if entry.is_dir(follow_symlinks=False):
                for sub in list(os.scandir(entry.path)):
                    if sub.is_dir(follow_symlinks=False):
                        target = root.parent / f"{root.name}-flat{n}"
                        n += 1
                        os.rename(sub.path, target)
                        pending.append(target)
        shutil.rmtree(current)


def test_a_directory_tree_deeper_than_the_recursion_limit_is_walked(tmp_path):
    """The walk and the directory access lists climb with loops, not recursion: a tree 1,200
    directories deep (past Python's recursion limit) is ingested, not a RecursionError."""
    root = tmp_path / "deep"
    root.mkdir()
    try:
        (root / "top.txt").write_text("top level\n")
        fd = os.open(root, os.O_RDONLY)
        try:
            for _ in range(1200):  # by descriptor: the path grows past PATH_MAX
                os.mkdir("d", dir_fd=fd)
                nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
                os.close(fd)
                fd = nxt
            leaf = os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
            os.write(leaf, b"the deepest kittiwake\n")
            os.close(leaf)
        finally:
            os.close(fd)
        report = ingest([root], collection="deep", index_dir=tmp_path / "index", embedder="none")
        assert report.added == 2 and report.failed == 0
        assert "kittiwake" in chunk_texts(tmp_path / "index" / "deep.sqlite3")
    finally:
        remove_deep(root)


# -- the serve-time read -------------------------------------------------------------


def test_citations_read_through_the_same_open(base, outside):
    """citations.read_bounded is the module's link-free open: a link that appears after the
    resolution is refused with the serve-time reason, a FIFO does not block."""
    real_base = base.resolve()
    path = real_base / "a.txt"
    assert citations.read_bounded(path, real_base) == b"alpha text\n"
    swap_in(base / "a.txt", "link-outside", outside)
    with pytest.raises(citations.SourceUnavailable) as exc:
        citations.read_bounded(path, real_base)
    assert exc.value.reason == "source file unreadable"
    swap_in(base / "a.txt", "fifo", outside)
    with pytest.raises(citations.SourceUnavailable) as exc:
        citations.read_bounded(path, real_base)
    assert exc.value.reason == "source file unreadable"
