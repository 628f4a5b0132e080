"""`groundkit ingest --cluster`: extraction, chunking and embedding on a real Dask cluster.

The cluster is real: a scheduler and two workers (each under its nanny, which restarts a killed
worker), separate processes on free loopback ports, started here and killed at teardown. The
workers load the default embedder's ONNX model themselves. The calling process stays the one
writer, so what it publishes must be byte for byte what a local ingest publishes.
"""

import datetime as real_datetime
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from groundkit_datasette.collection import ingest as ingest_module
from groundkit_datasette.collection.cluster import ClusterMap
from groundkit_datasette.collection.ingest import Indexer
from groundkit_datasette.collection.vectors import open_table

PLUGINS = Path(__file__).parent / "plugins"
sys.path.insert(0, str(PLUGINS))
import cluster_poison  # noqa: E402  (the worker-killer embedder; the workers preload it)

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("river stone harbour lantern orchard copper meadow signal valley thunder archive "
         "compass glacier ember willow quartz canyon beacon falcon marble prairie cedar").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_corpus(root: Path, files: int = 24, seed: int = 3) -> Path:
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for n in range(files):
        sections = []
        for s in range(3):
            sentence = " ".join(rng.choice(WORDS) for _ in range(90))
            sections.append(f"## Part {s} of file {n}\n\n{sentence}.\n")
        (root / f"doc{n:03d}.md").write_text(f"# File {n}\n\n" + "\n".join(sections), encoding="utf-8")
    return root


class LocalCluster:
    """`dask scheduler` and `dask worker` processes, each in its own process group."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(PLUGINS)]),
                        # One retry after a worker dies with a task: the kill test needs one,
                        # the poison test must give up after the second death.
                        DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="1",
                        LANCE_LOG="error")
        self.procs = []
        self._start([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port",
                     str(self.port), "--dashboard-address", "127.0.0.1:0", "--no-show"])
        for _ in range(2):
            self._start([sys.executable, "-m", "dask", "worker", self.address, "--nworkers", "1",
                         "--nthreads", "1", "--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0",
                         "--local-directory", str(tmp), "--preload", str(PLUGINS / "cluster_poison.py")])
        from distributed import Client

        self.client = Client(self.address, timeout=60, set_as_default=False)
        self.client.wait_for_workers(2, timeout=120)

    def _start(self, cmd):
        log = open(self.tmp / f"proc{len(self.procs)}.log", "wb")
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           cwd=self.tmp, start_new_session=True))

    def worker_pids(self) -> dict:
        return self.client.run(os.getpid)

    def busy_workers(self) -> list:
        return [addr for addr, keys in self.client.processing().items() if keys]

    def close(self):
        self.client.close()
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.procs:
            p.wait(30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster_poison.register()  # here too: the writer binds the embedder by name
    c = LocalCluster(tmp_path_factory.mktemp("dask"))
    try:
        yield c
    finally:
        c.close()
        cluster_poison.unregister()


@pytest.fixture
def frozen_clock(monkeypatch):
    """The writer stamps ingested_at/created_at; two runs compared byte for byte share one clock."""
    fixed = real_datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=real_datetime.timezone.utc)

    class Clock(real_datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return fixed

    class Module:
        datetime = Clock
        timezone = real_datetime.timezone

    monkeypatch.setattr(ingest_module, "datetime", Module)


def vectors_of(index: Path, name: str) -> dict:
    conn = sqlite3.connect(f"file:{index / (name + '.sqlite3')}?mode=ro&immutable=1", uri=True)
    version = conn.execute("SELECT value FROM groundkit_manifest WHERE key = 'lance_version'").fetchone()[0]
    conn.close()
    table = open_table(index / f"{name}.lance", int(version)).to_arrow().to_pydict()
    return dict(zip(table["chunk_id"], (np.asarray(v) for v in table["vector"])))


def test_cluster_ingest_publishes_the_local_file_even_when_a_worker_dies(cluster, tmp_path, frozen_clock):
    """Default embedder on the workers; one worker is killed while it runs a batch. The batch is
    retried, nothing fails, and the published SQLite file equals a local ingest's, byte for byte
    (the clock held fixed: ingested_at is the only value that legitimately differs). The vectors
    are the same model's, equal within float rounding (batches pad differently)."""
    corpus = write_corpus(tmp_path / "corpus")
    local = Indexer("docs", index_dir=tmp_path / "local", chunk_size=200, chunk_overlap=20).ingest([corpus])
    assert local.published and local.failed == 0

    killed = []

    def progress(event):
        # Mid-run: the coordinator has read a third of the files and batches are in flight.
        if event.get("event") == "file" and event["done"] >= 8 and not killed:
            for _ in range(200):
                busy = cluster.busy_workers()
                if busy:
                    pid = cluster.client.run(os.getpid, workers=[busy[0]])[busy[0]]
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
                time.sleep(0.05)

    with ClusterMap(cluster.address, batch_chunks=8) as stage:
        report = Indexer("docs", index_dir=tmp_path / "remote", chunk_size=200, chunk_overlap=20,
                         map_stage=stage, progress=progress).ingest([corpus])
        sent = stage.documents_sent
    assert killed, "no worker was busy to kill"
    assert report.published and report.failed == 0 and report.failed_files == []
    assert sent == 24 and report.added == 24
    assert report.chunks_embedded == local.chunks_embedded > 0
    published = (tmp_path / "remote" / "docs.sqlite3").read_bytes()
    assert published == (tmp_path / "local" / "docs.sqlite3").read_bytes()
    mine, theirs = vectors_of(tmp_path / "remote", "docs"), vectors_of(tmp_path / "local", "docs")
    assert mine.keys() == theirs.keys()
    assert all(np.allclose(mine[c], theirs[c], atol=1e-5) for c in mine)
    cluster.client.wait_for_workers(2, timeout=120)  # the nanny restarts the killed worker


def test_unchanged_files_are_not_sent_and_a_reingest_matches_local(cluster, tmp_path, frozen_clock):
    """A re-ingest after editing one file sends that one file to the cluster, and its result
    is again the file a local re-ingest writes."""
    corpus = write_corpus(tmp_path / "corpus", files=10)
    for where in ("local", "remote"):
        Indexer("docs", index_dir=tmp_path / where, embedder=cluster_poison.NAME).ingest([corpus])
    (corpus / "doc004.md").write_text("# Changed\n\nA new text about lanterns and harbours.\n")
    local = Indexer("docs", index_dir=tmp_path / "local").ingest([corpus])
    with ClusterMap(cluster.address) as stage:
        remote = Indexer("docs", index_dir=tmp_path / "remote", map_stage=stage).ingest([corpus])
        assert stage.documents_sent == 1
    assert (remote.updated, remote.unchanged) == (local.updated, local.unchanged) == (1, 9)
    assert (tmp_path / "remote" / "docs.sqlite3").read_bytes() == (tmp_path / "local" / "docs.sqlite3").read_bytes()


def test_a_batch_that_keeps_killing_workers_costs_only_its_documents(cluster, tmp_path):
    """A file whose embedding kills the worker every time: after the retry the scheduler gives
    up on that batch; its file is reported failed and every other file is published."""
    corpus = write_corpus(tmp_path / "corpus", files=6)
    # Larger than a batch's target (one chunk's worth of bytes): alone in its batch.
    (corpus / "doc002.md").write_text(f"# Bad\n\nThis text is {cluster_poison.MARK} to the model.\n"
                                      + "filler words " * 100)
    with ClusterMap(cluster.address, batch_chunks=1) as stage:
        report = Indexer("docs", index_dir=tmp_path / "index", embedder=cluster_poison.NAME,
                         map_stage=stage).ingest([corpus])
        assert stage.batches_failed == 1  # sent twice (adr/0029), then given up
    assert report.published
    assert report.failed_files == [("doc002.md", "cluster batch failed")]
    assert report.added == 5
    conn = sqlite3.connect(f"file:{tmp_path / 'index' / 'docs.sqlite3'}?mode=ro&immutable=1", uri=True)
    sources = [r[0] for r in conn.execute("SELECT source FROM documents ORDER BY source")]
    assert sources == [f"doc{n:03d}.md" for n in range(6) if n != 2]
    cluster.client.wait_for_workers(2, timeout=120)


def test_nothing_is_published_when_the_coordinator_dies(cluster, tmp_path):
    """The calling process killed mid-run (batches in flight, its private copy half written):
    the live collection is byte-identical afterwards, and the next run cleans up and publishes."""
    corpus = write_corpus(tmp_path / "corpus", files=10)
    index = tmp_path / "index"
    Indexer("docs", index_dir=index, embedder=cluster_poison.NAME).ingest([corpus])
    before = (index / "docs.sqlite3").read_bytes()
    for n in range(10):
        (corpus / f"doc{n:03d}.md").write_text(f"# Rewritten {n}\n\nOrchard and glacier text {n}.\n")
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(PLUGINS)!r})
        import cluster_poison
        cluster_poison.register()
        from groundkit_datasette.collection.cluster import ClusterMap
        from groundkit_datasette.collection.ingest import Indexer

        def progress(event):
            if event.get("event") == "file" and event["done"] == 6:
                print("mid-run", flush=True)
                time.sleep(120)

        with ClusterMap({cluster.address!r}, batch_chunks=1) as stage:
            Indexer("docs", index_dir={str(index)!r}, map_stage=stage, progress=progress).ingest([{str(corpus)!r}])
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "mid-run"
        assert list(index.glob(".docs.sqlite3.ingest-*")), "the run had a private copy"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        proc.stdout.close()
    assert (index / "docs.sqlite3").read_bytes() == before
    with ClusterMap(cluster.address) as stage:
        report = Indexer("docs", index_dir=index, map_stage=stage).ingest([corpus])
    assert report.published and report.updated == 10
    assert not list(index.glob(".docs.sqlite3.ingest-*"))


def test_cli_cluster_option(cluster, tmp_path):
    """`groundkit ingest --cluster ADDRESS` end to end, as a user runs it."""
    corpus = write_corpus(tmp_path / "corpus", files=4)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-m", "groundkit_datasette.cli", "ingest", str(corpus), "-c", "docs",
                          "--index-dir", str(tmp_path / "index"), "--embedder", "none",
                          "--cluster", cluster.address, "--json"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert '"added": 4' in run.stdout and '"published": true' in run.stdout


def test_cli_cluster_without_the_extra_says_what_to_install(tmp_path):
    """Without Dask distributed, --cluster is a usage error (exit 2) naming the extra, with no
    traceback, and nothing is written."""
    corpus = write_corpus(tmp_path / "corpus", files=2)
    blocker = tmp_path / "blocker" / "distributed"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('not installed (test)')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker.parent), str(ROOT)]))
    run = subprocess.run([sys.executable, "-m", "groundkit_datasette.cli", "ingest", str(corpus), "-c", "docs",
                          "--index-dir", str(tmp_path / "index"), "--cluster", "tcp://127.0.0.1:1"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2
    assert "pip install 'groundkit-datasette[cluster]'" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "index").exists()
