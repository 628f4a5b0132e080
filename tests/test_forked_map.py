"""The map stage in forked processes (indexing/forked_map.py, adr/0046-forked-map-stage.md).

The ingest tests run in fresh interpreters: this one has threads of its own by now (Datasette
and asyncio leave them), and a process with threads does not fork its map stage."""

import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading

import pytest

from groundkit_datasette.indexing import forked_map


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def _pid_and_sum(batch):
    return os.getpid(), list(batch), sum(batch)


@pytest.mark.parametrize("children", [1, 2, 3])
@pytest.mark.parametrize("count", [0, 1, 31, 32, 33, 200])
def test_batches_come_back_in_order_from_the_children(children, count):
    out = list(forked_map.run(range(count), _pid_and_sum, size=32, children=children))
    assert [b for _, b, _ in out] == [list(range(i, min(i + 32, count))) for i in range(0, count, 32)]
    assert [s for _, _, s in out] == [sum(b) for _, b, _ in out]
    pids = {pid for pid, _, _ in out}
    assert os.getpid() not in pids
    assert len(pids) == min(children, len(out))  # dealt in turn: each child has its share
    assert not any(_alive(pid) for pid in pids)  # every child ended and was reaped


class Refused(ValueError):
    pass


def _fails_on_third(batch):
    if batch[0] == 64:
        raise Refused(f"batch at {batch[0]} refused")
    return os.getpid()


@pytest.mark.parametrize("children", [1, 2])
def test_a_childs_exception_reaches_the_writer_in_order(children):
    got = []
    with pytest.raises(Refused, match="batch at 64 refused"):
        for pid in forked_map.run(range(200), _fails_on_third, size=32, children=children):
            got.append(pid)
    assert len(got) == 2  # the batches before the failing one, then its error
    assert not any(_alive(pid) for pid in got)


def _dies(batch):
    if batch[0] == 32:
        os._exit(7)  # a child killed mid-run (out of memory, a signal)
    return os.getpid()


def test_a_child_that_dies_fails_the_run():
    with pytest.raises(forked_map.MapStageError, match="ended before finishing"):
        list(forked_map.run(range(100), _dies, size=32, children=1))


def test_closing_early_stops_the_children():
    stream = forked_map.run(range(10_000), _pid_and_sum, size=8, children=2)
    first, _, _ = next(stream)
    second, _, _ = next(stream)
    stream.close()  # the writer failed: the children must not run on
    assert first != second
    assert not _alive(first) and not _alive(second)


def _logs(batch):
    logging.getLogger("groundkit_datasette.indexing.ingest").warning("read batch %d", batch[0])
    return batch[0]


def test_child_log_records_are_issued_once_by_the_writer(caplog):
    caplog.set_level(logging.WARNING)
    assert list(forked_map.run(range(96), _logs, size=32, children=2)) == [0, 32, 64]
    messages = [r.getMessage() for r in caplog.records if r.name.endswith("collection.ingest")]
    assert messages == ["read batch 0", "read batch 32", "read batch 64"]


def test_a_process_with_threads_or_unprepared_pools_does_not_fork(monkeypatch):
    monkeypatch.setattr(forked_map, "cpus", lambda: 2)
    monkeypatch.setattr(forked_map.threading, "active_count", lambda: 1)  # this suite's threads
    for name in forked_map.UNPREPARED:  # loaded by other tests in this process
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert forked_map.usable(forked_map.MIN_FILES)
    assert not forked_map.usable(forked_map.MIN_FILES - 1)
    monkeypatch.setitem(sys.modules, "lancedb", object())
    assert not forked_map.usable(1000)
    monkeypatch.delitem(sys.modules, "lancedb")
    monkeypatch.setattr(forked_map, "cpus", lambda: 1)  # one CPU: nothing to overlap with
    assert not forked_map.usable(1000)
    monkeypatch.undo()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert not forked_map.usable(1000)
    finally:
        stop.set()
        thread.join()


# -- the ingest, in a fresh interpreter --------------------------------------------------

_INGEST = """
import json, logging, sys
from groundkit_datasette.indexing import forked_map
from groundkit_datasette.indexing.ingest import Indexer
forked_map.cpus = lambda: 3  # two children, as on a machine with three CPUs, whatever this one has
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
events = []
report = Indexer("mixed", index_dir=sys.argv[2], base_dir=sys.argv[1], embedder="none",
                 fork_map=sys.argv[3] == "fork", progress=events.append).ingest([sys.argv[1]])
files = [e["source"] for e in events if e["event"] == "file"]
print(json.dumps({"report": report.as_dict(), "files": files,
                  "done": [e["done"] for e in events if e["event"] == "file"]}))
"""


def _corpus(root):
    root.mkdir()
    for i in range(90):
        sub = root / f"part{i % 3}"
        sub.mkdir(exist_ok=True)
        if i % 3 == 0:
            (sub / f"page{i:03d}.html").write_text(
                f"<html><head><title>Page {i}</title><style>p {{}}</style></head><body>"
                f"<h1>Heading {i}</h1><p>Alpha {i} beta &amp; gamma.</p>"
                + "".join(f"<p>Paragraph {j} of page {i}, about kestrels and tide tables.</p>"
                          for j in range(40 + i)) + "</body></html>")
        elif i % 3 == 1:
            (sub / f"note{i:03d}.md").write_text(
                f"# Note {i}\n\n" + "\n\n".join(f"## Part {j}\n\nThe {j}th remark on harbour {i}; "
                                                 "数据库 检索 " * (j % 2) for j in range(30)))
        else:
            (sub / f"log{i:03d}.txt").write_text("\n".join(f"line {j}: value {i * j}" for j in range(300)))
    (root / "part0" / "empty.txt").write_text("")
    (root / "part1" / "binary.bin").write_bytes(bytes(range(256)) * 8)
    (root / "part2" / ".groundkit-acl.json").write_text("{not json")  # refused: a warning each
    (root / "part1" / "unreadable.txt").write_text("secret")
    os.chmod(root / "part1" / "unreadable.txt", 0)


def _dump(path):
    conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    out = {}
    for table in ("documents", "chunks", "chunks_cjk", "bm25_chunk_terms", "bm25_vocab",
                  "bm25_postings", "groundkit_manifest"):
        rows = conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
        if table == "documents":
            rows = [r[:14] + r[15:] for r in rows]  # ingested_at: the clock
        if table == "groundkit_manifest":
            rows = [r for r in rows if r[0] not in ("created_at", "ingested_at")]
        out[table] = rows
    conn.close()
    return out


def _ingest(corpus, index, mode):
    result = subprocess.run([sys.executable, "-c", _INGEST, str(corpus), str(index), mode],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def test_forked_ingest_publishes_the_same_collection_as_one_process(tmp_path):
    _check_same_collection(tmp_path, unreadable_expected=os.geteuid() != 0)  # root reads mode 0


def _check_same_collection(tmp_path, unreadable_expected):
    corpus = tmp_path / "corpus"
    _corpus(corpus)
    forked, forked_log = _ingest(corpus, tmp_path / "forked", "fork")
    local, local_log = _ingest(corpus, tmp_path / "local", "local")
    assert forked["report"]["map_stage"] == "forked"
    assert local["report"]["map_stage"] == "local"
    # Every table the same, term ids and weights included, as one process writes them.
    assert _dump(tmp_path / "forked" / "mixed.sqlite3") == _dump(tmp_path / "local" / "mixed.sqlite3")
    # The same report, the same progress in walk order, the same warnings, once each.
    strip = lambda r: {k: v for k, v in r.items() if k not in ("seconds", "chunks_per_second", "map_stage")}
    assert strip(forked["report"]) == strip(local["report"])
    assert forked["files"] == local["files"] and len(forked["files"]) == 93  # the access list is not a document
    assert forked["done"] == list(range(1, 94))
    assert sorted(forked_log.splitlines()) == sorted(local_log.splitlines())
    assert forked_log.count("access list refused") == 30
    if unreadable_expected:
        assert forked_log.count("cannot read part1/unreadable.txt") == 1
        assert {"source": "part1/unreadable.txt", "reason": "unreadable"} in forked["report"]["skipped_files"]
    # An incremental run over the forked collection: nothing to do, nothing changes.
    again, _ = _ingest(corpus, tmp_path / "forked", "fork")
    assert again["report"]["unchanged"] == forked["report"]["added"]
    assert again["report"]["published"] is False
