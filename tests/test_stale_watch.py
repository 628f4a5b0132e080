"""The stale-hit check keeps a document's ``stat`` answer while inotify reports nothing on the
directories of its path (stale.StaleCheck), and still flags every way a source can
change on the very next search of the same open collection: an edit in place, a touch, an
atomic save (a new file renamed over it), a deletion, a directory replaced, a linked file
(never kept). Real files, real inotify, real collections."""

import os

import pytest

from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.retrieval import stale
from groundkit_datasette.retrieval.collection import Collection


@pytest.fixture
def built(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "deep" / "er").mkdir(parents=True)
    (corpus / "top.txt").write_text("Osprey top notes.\n\nosprey fishing\n")
    (corpus / "deep" / "mid.txt").write_text("Osprey mid notes.\n\nosprey nest\n")
    (corpus / "deep" / "er" / "low.txt").write_text("Osprey low notes.\n\nosprey dive\n")
    # A link to a file in a directory ingest skips (hidden): nothing watches its directory.
    (corpus / ".store").mkdir()
    (corpus / ".store" / "target.txt").write_text("Osprey linked notes.\n\nosprey perch\n")
    (corpus / "linked.txt").symlink_to(corpus / ".store" / "target.txt")
    index_dir = tmp_path / "index"
    ingest([corpus], collection="hawks", index_dir=index_dir, embedder="none")
    return corpus, index_dir


@pytest.fixture
def stats(monkeypatch, built):
    """The check's stat calls on the corpus (a spy on ``os.lstat``: the calls still run)."""
    calls = []
    real = os.lstat
    corpus = os.path.realpath(built[0])

    def lstat(path, *a, **kw):
        if isinstance(path, str) and path.startswith(corpus) and path.endswith(".txt"):
            calls.append(path)
        return real(path, *a, **kw)

    monkeypatch.setattr(stale.os, "lstat", lstat)
    return calls


def flags(col):
    return {h.source: h.source_changed for h in col.search(query="osprey", mode="bm25").hits}


FRESH = {"top.txt": False, "deep/mid.txt": False, "deep/er/low.txt": False, "linked.txt": False}


def test_unchanged_sources_are_not_statted_again(built, stats):
    if stale._watcher() is None:
        pytest.fail("inotify is available on the test machines (Linux)")
    corpus, index_dir = built
    with Collection.open("hawks", index_dir=index_dir, base_dir=corpus) as col:
        assert flags(col) == FRESH
        first = len(stats)
        assert first == 4
        assert flags(col) == FRESH
        # Only the link is statted again: its target lies in a directory nobody watches.
        assert [os.path.basename(p) for p in stats[first:]] == ["linked.txt"]


@pytest.mark.parametrize("change", ["edit", "touch", "atomic save", "delete", "directory replaced"])
def test_every_kind_of_change_shows_on_the_next_search(built, change):
    corpus, index_dir = built
    low = corpus / "deep" / "er" / "low.txt"
    with Collection.open("hawks", index_dir=index_dir, base_dir=corpus) as col:
        assert flags(col) == FRESH
        assert flags(col) == FRESH  # the answers are kept now
        if change == "edit":
            with open(low, "a") as f:
                f.write("More.\n")
        elif change == "touch":
            st = low.stat()
            os.utime(low, ns=(st.st_atime_ns, st.st_mtime_ns + 7_000_000_000))
        elif change == "atomic save":
            tmp = corpus / "deep" / "er" / ".low.txt.swp"
            tmp.write_text(low.read_text() + "Saved.\n")
            os.replace(tmp, low)
        elif change == "delete":
            low.unlink()
        else:  # the parent's parent renamed away, a changed copy put in its place
            (corpus / "deep").rename(corpus / "deep-old")
            (corpus / "deep" / "er").mkdir(parents=True)
            (corpus / "deep" / "mid.txt").write_bytes((corpus / "deep-old" / "mid.txt").read_bytes())
            old = corpus / "deep-old" / "mid.txt"
            os.utime(corpus / "deep" / "mid.txt", ns=(old.stat().st_atime_ns, old.stat().st_mtime_ns))
            low.write_text("Osprey low notes, rewritten.\n")
        assert flags(col) == dict(FRESH, **{"deep/er/low.txt": True})


def test_a_linked_file_changed_in_an_unwatched_directory_shows_on_the_next_search(built):
    corpus, index_dir = built
    with Collection.open("hawks", index_dir=index_dir, base_dir=corpus) as col:
        assert flags(col) == FRESH
        with open(corpus / ".store" / "target.txt", "a") as f:
            f.write("Perched.\n")
        assert flags(col) == dict(FRESH, **{"linked.txt": True})


def test_without_inotify_every_search_stats_and_answers_alike(built, stats, monkeypatch):
    corpus, index_dir = built
    monkeypatch.setattr(stale, "_watcher", lambda: None)
    with Collection.open("hawks", index_dir=index_dir, base_dir=corpus) as col:
        assert flags(col) == FRESH
        assert flags(col) == FRESH
        assert len(stats) == 8
        (corpus / "top.txt").write_text("changed\n")
        assert flags(col)["top.txt"] is True


def test_answers_are_kept_only_on_local_file_systems(tmp_path):
    """A network or FUSE file system changes without any event here: its answers are never
    kept (every search stats). Read from a mounts table in /proc/self/mounts's format."""
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "overlay / overlay rw 0 0\n"
        "server:/export /srv/docs nfs4 rw 0 0\n"
        "sshfs#me@host: /srv/docs/remote fuse.sshfs rw 0 0\n"
        "/dev/sda1 /srv/docs/local\\040disk ext4 rw 0 0\n")
    covers = lambda p: stale._inotify_covers(p, str(mounts))  # noqa: E731
    assert covers("/home/me/corpus") is True
    assert covers("/srv/docs") is False and covers("/srv/docs/a/b") is False
    assert covers("/srv/docs/remote/x") is False
    assert covers("/srv/docs/local disk/x") is True
    assert covers("/srv/docsextra") is True  # a name sharing the prefix is not under /srv/docs
    assert stale._inotify_covers("/x", str(tmp_path / "absent")) is False


def test_a_write_through_a_hard_link_elsewhere_shows_on_the_next_search(built):
    """The file itself is watched, not only its directory: a write through another name of
    the same file, in a directory nothing watches, still raises an event."""
    corpus, index_dir = built
    other = corpus / ".store" / "top-again.txt"
    os.link(corpus / "top.txt", other)
    with Collection.open("hawks", index_dir=index_dir, base_dir=corpus) as col:
        assert flags(col) == FRESH
        assert flags(col) == FRESH
        with open(other, "a") as f:
            f.write("Written through the other name.\n")
        assert flags(col) == dict(FRESH, **{"top.txt": True})


def test_the_watch_budget_is_a_share_of_the_users_limit(tmp_path):
    limit = tmp_path / "max_user_watches"
    limit.write_text("8192\n")
    assert stale._watch_budget(str(limit)) == 1024
    limit.write_text("1048576\n")
    assert stale._watch_budget(str(limit)) == stale._Watcher.MAX_DIRS
    limit.write_text("not a number\n")
    assert stale._watch_budget(str(limit)) == 1024
    assert stale._watch_budget(str(tmp_path / "missing")) == 1024


def test_a_watcher_past_its_budget_adds_no_watch_and_searches_still_see_edits(built, monkeypatch):
    """Paths past the budget are not watched (their answers are not kept: stat every search),
    and a path watched once is watched again after an event without counting twice."""
    corpus, index_dir = built
    real = stale._new_watcher()  # its own inotify instance, not the process's
    if real is None:
        pytest.fail("inotify is available on the test machines (Linux)")
    watcher = stale._Watcher(real._libc, real.fd, budget=3)
    base = os.path.realpath(corpus)
    a, b, c = base, os.path.join(base, "top.txt"), os.path.join(base, "deep")
    assert watcher.watch((a, b)) is True
    assert watcher.watch((c,)) is True
    assert watcher.watch((os.path.join(base, "deep", "mid.txt"),)) is False  # over budget
    (corpus / "top.txt").write_text("Osprey top notes.\n\nosprey fishing, changed\n")
    watcher.poll()  # the event: every kept answer is dropped, the watches stay counted
    assert watcher.watch((a, b, c)) is True
    assert len(watcher._added) == 3
    monkeypatch.setattr(stale, "_watcher", lambda: watcher)
    with Collection.open("hawks", index_dir=index_dir, base_dir=corpus) as col:
        assert flags(col) == dict(FRESH, **{"top.txt": True})
        (corpus / "deep" / "er" / "low.txt").write_text("Osprey low notes.\n\nosprey dive, changed\n")
        assert flags(col) == dict(FRESH, **{"top.txt": True, "deep/er/low.txt": True})
    os.close(real.fd)


def test_a_forked_process_makes_its_own_watcher():
    """Parent and child would otherwise share one queue of events: whichever read an event
    first would hide it from the other."""
    parent = stale._watcher()
    if parent is None:
        pytest.fail("inotify is available on the test machines (Linux)")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running anything of pytest's
        try:
            child = stale._watcher()
            os.write(write, b"new" if child is not None and child is not parent and child.fd != parent.fd else b"same")
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 16) == b"new"
    os.close(read)
    assert stale._watcher() is parent  # the parent keeps its own
