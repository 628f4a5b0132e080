"""`groundkit ingest --cluster`: extraction, chunking and embedding on a real Dask cluster.

The cluster is real: a scheduler and two workers (each under its nanny, which restarts a killed
worker), separate processes on free loopback ports, started here and killed at teardown, speaking
TLS with certificates made here (a CA of the cluster's own; the scheduler, the workers and the
ingesting client each hold one it signed). The workers load the default embedder's ONNX model
themselves. The calling process stays the one writer, so what it publishes must be byte for byte
what a local ingest publishes. The workers are not trusted (adr/0048): tests below make them lie
(tests/plugins/cluster_liar.py, installed with ``Client.run`` as anyone reaching a scheduler
could) and check that no lie is published and no pickle runs in the ingesting process.
"""

import datetime as real_datetime
import json
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
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from groundkit_datasette.indexing import document_writer
from groundkit_datasette.indexing.cluster import (ClusterError, ClusterMap, Rejected, accept, process_batch,
                                                   tls_security, unpicklings_refused)
from groundkit_datasette.indexing.extract import MAX_TEXT_CHARS
from groundkit_datasette.indexing.ingest import Indexer
from groundkit_datasette.indexing.prepared import Job as _Job, Outcome, prepare_document, sha as _sha
from groundkit_datasette.indexing.vectors import open_table

PLUGINS = Path(__file__).parent / "plugins"
sys.path.insert(0, str(PLUGINS))
import cluster_liar  # noqa: E402  (the lying worker; installed on the workers with Client.run)
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


def make_certs(where: Path) -> dict:
    """A CA of the cluster's own and a certificate it signed for each party (``<name>.pem``
    and ``<name>-key.pem``), plus a stranger: a client certificate signed by another CA."""
    where.mkdir(parents=True, exist_ok=True)
    now = real_datetime.datetime.now(real_datetime.timezone.utc)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(stem, cert, key):
        (where / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (where / f"{stem}-key.pem").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        os.chmod(where / f"{stem}-key.pem", 0o600)

    def ca(cn):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(name(cn))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - real_datetime.timedelta(hours=1))
                .not_valid_after(now + real_datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                               critical=True)
                .sign(key, hashes.SHA256()))
        return cert, key

    def leaf(cn, issuer, issuer_key):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(issuer.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - real_datetime.timedelta(hours=1))
                .not_valid_after(now + real_datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
                .sign(issuer_key, hashes.SHA256()))
        return cert, key

    ca_cert, ca_key = ca("groundkit test cluster CA")
    write("ca", ca_cert, ca_key)
    for party in ("scheduler", "worker", "client"):
        write(party, *leaf(f"groundkit test {party}", ca_cert, ca_key))
    other, other_key = ca("another CA")
    write("stranger", *leaf("groundkit test stranger", other, other_key))
    return {stem: str(where / f"{stem}.pem") for stem in ("ca", "scheduler", "worker", "client", "stranger")}


def tls_args(certs, party):
    return ["--tls-ca-file", certs["ca"], "--tls-cert", certs[party],
            "--tls-key", certs[party].replace(".pem", "-key.pem")]


def client_security(certs, party="client"):
    return tls_security(certs["ca"], certs[party], certs[party].replace(".pem", "-key.pem"))


class LocalCluster:
    """`dask scheduler` and `dask worker` processes on TLS, each in its own process group."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.certs = make_certs(tmp / "certs")
        self.port = free_port()
        self.address = f"tls://127.0.0.1:{self.port}"
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(PLUGINS)]),
                        # One retry after a worker dies with a task: the kill test needs one,
                        # the poison test must give up after the second death.
                        DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="1",
                        LANCE_LOG="error")
        self.procs = []
        self._start([sys.executable, "-m", "dask", "scheduler", "--protocol", "tls", "--host", "127.0.0.1",
                     "--port", str(self.port), "--dashboard-address", "127.0.0.1:0", "--no-show",
                     *tls_args(self.certs, "scheduler")])
        for _ in range(2):
            self._start([sys.executable, "-m", "dask", "worker", self.address, "--nworkers", "1",
                         "--nthreads", "1", "--protocol", "tls", "--host", "127.0.0.1",
                         "--dashboard-address", "127.0.0.1:0",  # --no-dashboard still listens on 0.0.0.0
                         "--local-directory", str(tmp), "--preload", str(PLUGINS / "cluster_poison.py"),
                         *tls_args(self.certs, "worker")])
        from distributed import Client

        # The test's own client (it kills and patches workers): trusted, Dask's defaults.
        self.client = Client(self.address, security=self.security, timeout=60, set_as_default=False)
        self.client.wait_for_workers(2, timeout=120)

    @property
    def security(self):
        return client_security(self.certs)

    def stage(self, **kwargs) -> ClusterMap:
        return ClusterMap(self.address, security=self.security, **kwargs)

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

    monkeypatch.setattr(document_writer, "datetime", Module)


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

    with cluster.stage(batch_chunks=8) as stage:
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
    with cluster.stage() as stage:
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
    with cluster.stage(batch_chunks=1) as stage:
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
        from groundkit_datasette.indexing.cluster import ClusterMap, tls_security
        from groundkit_datasette.indexing.ingest import Indexer

        def progress(event):
            if event.get("event") == "file" and event["done"] == 6:
                print("mid-run", flush=True)
                time.sleep(120)

        security = tls_security(*{[cluster.certs["ca"], cluster.certs["client"],
                                    cluster.certs["client"].replace(".pem", "-key.pem")]!r})
        with ClusterMap({cluster.address!r}, security=security, batch_chunks=1) as stage:
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
    with cluster.stage() as stage:
        report = Indexer("docs", index_dir=index, map_stage=stage).ingest([corpus])
    assert report.published and report.updated == 10
    assert not list(index.glob(".docs.sqlite3.ingest-*"))


def cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "groundkit_datasette.cli", "ingest", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env=env or dict(os.environ, PYTHONPATH=str(ROOT)))


@pytest.mark.parametrize("how", ["options", "dask config"])
def test_cli_cluster_option(cluster, tmp_path, how):
    """`groundkit ingest --cluster tls://...` end to end, as a user runs it: the certificates
    given with --cluster-tls-*, or in Dask's own distributed.comm.tls settings."""
    corpus = write_corpus(tmp_path / "corpus", files=4)
    certs = cluster.certs
    key = certs["client"].replace(".pem", "-key.pem")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if how == "options":
        given = ["--cluster-tls-ca", certs["ca"], "--cluster-tls-cert", certs["client"], "--cluster-tls-key", key]
    else:
        given = []
        env.update(DASK_DISTRIBUTED__COMM__TLS__CA_FILE=certs["ca"],
                   DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT=certs["client"],
                   DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY=key)
    run = cli(corpus, "-c", "docs", "--index-dir", tmp_path / "index", "--embedder", "none",
              "--cluster", cluster.address, *given, "--json", env=env)
    assert run.returncode == 0, run.stderr
    assert '"added": 4' in run.stdout and '"published": true' in run.stdout


def test_cli_refuses_tcp_without_the_insecure_flag(tmp_path):
    """A tcp:// scheduler is neither encrypted nor authenticated: refused (exit 2, no traceback,
    nothing written) unless --cluster-insecure is given; with it, the address is tried."""
    corpus = write_corpus(tmp_path / "corpus", files=2)
    index = tmp_path / "index"
    port = free_port()  # nothing listens there
    run = cli(corpus, "-c", "docs", "--index-dir", index, "--cluster", f"tcp://127.0.0.1:{port}")
    assert run.returncode == 2
    assert "refusing a tcp:// cluster" in run.stderr and "--cluster-insecure" in run.stderr
    assert "Traceback" not in run.stderr
    bare = cli(corpus, "-c", "docs", "--index-dir", index, "--cluster", f"127.0.0.1:{port}")
    assert bare.returncode == 2 and "refusing a tcp:// cluster" in bare.stderr
    assert not index.exists()
    tried = cli(corpus, "-c", "docs", "--index-dir", index, "--cluster", f"tcp://127.0.0.1:{port}",
                "--cluster-insecure", timeout=120)
    assert tried.returncode == 2
    assert "cannot reach the cluster's scheduler" in tried.stderr and "Traceback" not in tried.stderr
    assert not (index / "docs.sqlite3").exists()


def test_cli_tls_needs_certificates(tmp_path):
    """tls:// without a client certificate and the CA is refused before connecting; the
    certificate options are refused without a tls:// address."""
    corpus = write_corpus(tmp_path / "corpus", files=2)
    run = cli(corpus, "-c", "docs", "--index-dir", tmp_path / "index", "--cluster", "tls://127.0.0.1:1")
    assert run.returncode == 2 and "--cluster-tls-ca" in run.stderr and "Traceback" not in run.stderr
    missing = cli(corpus, "-c", "docs", "--index-dir", tmp_path / "index", "--cluster", "tls://127.0.0.1:1",
                  "--cluster-tls-ca", tmp_path / "nope.pem", "--cluster-tls-cert", tmp_path / "nope.pem")
    assert missing.returncode == 2 and "cannot be read" in missing.stderr
    assert "Traceback" not in missing.stderr
    stray = cli(corpus, "-c", "docs", "--index-dir", tmp_path / "index", "--cluster-tls-ca", tmp_path / "x.pem")
    assert stray.returncode == 2 and "--cluster" in stray.stderr
    assert not (tmp_path / "index").exists()


def test_a_client_without_the_clusters_certificate_cannot_connect(cluster):
    """Mutual TLS: a client certificate signed by another CA is refused by the scheduler, so it
    can neither submit work nor patch the workers."""
    with pytest.raises(ClusterError, match="cannot reach the cluster's scheduler"):
        ClusterMap(cluster.address, security=client_security(cluster.certs, "stranger"), timeout=5)
    with pytest.raises(ClusterError, match="refusing a tcp:// cluster"):
        ClusterMap(cluster.address.replace("tls://", "tcp://"))


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


# -- workers that lie ----------------------------------------------------------


def lying(cluster, mode, marker_dir=None):
    """Every worker (or, for "scheduler_frame", the scheduler) lies in ``mode`` until the
    context ends."""
    class Lie:
        def __enter__(self):
            if mode == "scheduler_frame":
                cluster.client.run_on_scheduler(cluster_liar.install_on_scheduler, str(marker_dir))
            else:
                cluster.client.run(cluster_liar.install, mode, str(marker_dir) if marker_dir else None)

        def __exit__(self, *exc):
            if mode == "scheduler_frame":
                cluster.client.run_on_scheduler(cluster_liar.uninstall_on_scheduler)
            else:
                cluster.client.run(cluster_liar.uninstall)
    return Lie()


def acl_corpus(root: Path, files: int = 4) -> Path:
    write_corpus(root, files=files)
    (root / ".groundkit-acl.json").write_text(json.dumps({"groups": ["staff"]}))
    return root


def published_rows(index: Path, name: str = "docs") -> list:
    path = index / f"{name}.sqlite3"
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return conn.execute("SELECT source, acl, file_hash FROM documents ORDER BY source").fetchall()
    finally:
        conn.close()


LIES = [
    # mode, embedder, the reason each document is failed with
    ("acl", None, "cluster result rejected: fields"),
    ("source", None, "cluster result rejected: source"),
    ("file_hash", None, "cluster result rejected: file hash"),
    ("offsets", None, "cluster result rejected: chunk offsets"),
    ("extractor", None, "cluster result rejected: extractor"),
    ("vector_nan", cluster_poison.NAME, "cluster result rejected: vectors"),
    ("vector_size", cluster_poison.NAME, "cluster result rejected: vectors"),
    ("count", None, "cluster batch failed"),
]


@pytest.mark.parametrize("mode,embedder,reason", LIES, ids=[lie[0] for lie in LIES])
def test_a_lying_worker_gets_its_documents_failed_and_nothing_it_said_is_published(
        cluster, tmp_path, mode, embedder, reason):
    """A worker patched through ``Client.run`` rewrites its results (drops the access list, names
    another source, changes the file hash, puts a chunk outside the text, claims another
    extractor, sends a NaN or a short vector, drops a result). Each such document is failed
    with a reason naming what was wrong, and the published collection (when an earlier run
    published one) still holds the honest run's rows: no access list lost, no other source."""
    corpus = acl_corpus(tmp_path / "corpus")
    index = tmp_path / "index"
    with cluster.stage() as stage:
        honest = Indexer("docs", index_dir=index, embedder=embedder or "none", map_stage=stage).ingest([corpus])
    assert honest.published and honest.added == 4
    before = published_rows(index)
    assert [acl for _s, acl, _h in before] == ['{"groups":["staff"],"users":[]}'] * 4
    for n in range(4):  # every file changed: each goes to the (now lying) workers
        (corpus / f"doc{n:03d}.md").write_text(f"# Changed {n}\n\nCedar and prairie {n}.\n")
    with lying(cluster, mode), cluster.stage() as stage:
        report = Indexer("docs", index_dir=index, map_stage=stage).ingest([corpus])
        rejected = stage.documents_rejected
    assert report.failed == 4 and report.written == 0
    assert sorted(report.failed_files) == [(f"doc{n:03d}.md", reason) for n in range(4)]
    assert rejected == (0 if mode == "count" else 4)
    assert published_rows(index) == before


def test_a_lying_worker_cannot_publish_a_first_collection_without_its_access_list(cluster, tmp_path):
    """The issue's attack: on a first ingest every worker drops the access list. Nothing is
    published (no document was written), and the exit is the CLI's "all failed"."""
    corpus = acl_corpus(tmp_path / "corpus")
    index = tmp_path / "index"
    certs = cluster.certs
    with lying(cluster, "acl"):
        run = cli(corpus, "-c", "docs", "--index-dir", index, "--embedder", "none", "--cluster",
                  cluster.address, "--cluster-tls-ca", certs["ca"], "--cluster-tls-cert", certs["client"],
                  "--cluster-tls-key", certs["client"].replace(".pem", "-key.pem"), "--json")
    assert run.returncode == 3, run.stderr
    summary = json.loads(run.stdout)
    assert summary["failed"] == 4 and summary["published"] is False
    assert {f["reason"] for f in summary["failed_files"]} == {"cluster result rejected: fields"}
    assert published_rows(index) == []


@pytest.mark.parametrize("mode", ["return_evil", "raise_evil", "scheduler_frame"])
def test_a_pickle_from_the_cluster_does_not_run_in_the_ingesting_process(cluster, tmp_path, mode):
    """The cluster answers with an object whose unpickling runs code (it writes
    ``ran-in-<pid>``): a worker returns it as its result, or raises an error carrying it (Dask
    pickles the error, and its client unpickles it to re-raise it), or the scheduler answers the
    gather with a message part marked pickled (Dask's wire protocol unpickles those on read,
    whatever the client's deserializers). No marker names this process, the documents are
    failed, and the payload is live: unpickled here outside a cluster map, it writes its marker."""
    markers = tmp_path / "markers"
    markers.mkdir()
    marker = markers / f"ran-in-{os.getpid()}"
    corpus = write_corpus(tmp_path / "corpus", files=3)
    refused = unpicklings_refused()
    try:
        with lying(cluster, mode, markers), cluster.stage() as stage:
            report = Indexer("docs", index_dir=tmp_path / "index", embedder="none",
                             map_stage=stage).ingest([corpus])
    finally:
        assert not marker.exists(), "a pickle from the cluster ran in the ingesting process"
    assert report.failed == 3 and not report.published
    assert {r for _s, r in report.failed_files} == {"cluster batch failed"}
    if mode != "return_evil":  # that one the deserializers refuse before any unpickling
        assert unpicklings_refused() > refused
    # The control: the same payload, unpickled in this process outside a cluster map.
    import pickle

    pickle.loads(pickle.dumps(cluster_liar.Evil(markers)))
    assert marker.exists()


def test_an_honest_run_refuses_no_unpickling(cluster, tmp_path):
    """The guard costs an honest run nothing: no unpickling is refused, and the documents are
    those of a local run."""
    corpus = write_corpus(tmp_path / "corpus", files=6)
    refused = unpicklings_refused()
    with cluster.stage() as stage:
        report = Indexer("docs", index_dir=tmp_path / "index", embedder=cluster_poison.NAME,
                         map_stage=stage).ingest([corpus])
        assert stage.documents_rejected == 0
    assert report.published and report.added == 6 and report.failed == 0
    assert unpicklings_refused() == refused


# -- the writer's side, without a cluster ----------------------------------------


def format_files(root: Path) -> dict:
    """One file of every kind ingest reads, and two it skips."""
    from tests.pdf_support import make_pdf
    from tests.test_formats import CASES, make_blank_pdf

    root.mkdir(parents=True, exist_ok=True)
    for name, maker, *_ in CASES:
        maker(root / name)
    make_blank_pdf(root / "scan.pdf")
    (root / "paper.pdf").write_bytes(make_pdf([["Page one about harbours."], [], ["Page three: lanterns."]]))
    (root / "notes.md").write_text("---\ntitle: Notes\n---\n# Notes\n\n## A\n\n" + "word " * 300, encoding="utf-8")
    (root / "latin.txt").write_bytes("Caf\xe9 cr\xe8me, na\xefve fa\xe7ade.\n".encode("latin-1") * 40)
    (root / "page.html").write_text("<html><head><title>Page</title></head><body><h1>Hi</h1><p>"
                                    + "text " * 400 + "</p></body></html>", encoding="utf-8")
    (root / "code.py").write_text("def f():\n    return 1\n" * 80, encoding="utf-8")
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    (root / "blank.txt").write_text("   \n\n", encoding="utf-8")
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def job_for(name: str, data: bytes, acl=None) -> _Job:
    return _Job(name, data, _sha(data), acl, None, len(data), 1_700_000_000_000_000_000, True)


def test_a_workers_answer_gives_the_local_record_for_every_format(tmp_path):
    """The worker's function (run here) and the writer's check of its answer give, for every
    format, skipped and empty files included, exactly the document a local run prepares:
    same columns, chunks, chunk ids, pages and vectors (embedded from the same chunk texts)."""
    cluster_poison.register()
    try:
        files = format_files(tmp_path / "files")
        settings = (300, 30, True, cluster_poison.NAME, {})
        jobs = [job_for(name, data, acl='{"groups":["staff"],"users":[]}') for name, data in files.items()]
        answers = process_batch([[j.source, j.file_hash, j.data] for j in jobs], [[] for _ in jobs], settings)
        from groundkit_datasette.embedding.embedders import get_embedder

        embedder = get_embedder(cluster_poison.NAME)
        kinds = set()
        for job, answer in zip(jobs, answers):
            assert set(answer) <= {"source", "file_hash", "text", "title", "extractor", "extractor_version",
                                   "encoding", "pages", "chunks", "vectors", "skipped", "failed"}
            mine = accept(job, answer, settings, (), embedder.dimensions)
            local = prepare_document(job, 300, 30, True)
            if isinstance(local, Outcome):
                assert mine == local, job.source
                continue
            kinds.add(local.document.extractor)
            vectors = mine.vectors
            mine.vectors = None
            assert mine == local, job.source
            from groundkit_datasette.indexing.ingest import embedding_text

            expected = embedder.embed([embedding_text(c.heading, c.text) for c in local.chunks])
            assert list(vectors) == local.chunk_ids
            assert all(np.array_equal(vectors[c], np.asarray(v, dtype=np.float32))
                       for c, v in zip(local.chunk_ids, expected))
        assert kinds == {"text", "html", "pypdf", "docx", "pptx", "xlsx", "odt", "epub"}
    finally:
        cluster_poison.unregister()


def honest(text="# T\n\n" + "alpha beta gamma delta. " * 40, name="a.md"):
    data = text.encode("utf-8")
    job = job_for(name, data, acl='{"groups":["staff"],"users":[]}')
    answer = process_batch([[job.source, job.file_hash, data]], [[]], (200, 20, True, None, {}))[0]
    return job, answer


def changed(answer, **fields):
    return {**answer, **fields}


BAD_ANSWERS = [
    ("not a record", lambda a: ["text"]),
    ("source", lambda a: changed(a, source="b.md")),
    ("file hash", lambda a: changed(a, file_hash="0" * 64)),
    ("fields", lambda a: changed(a, acl=None)),
    ("fields", lambda a: changed(a, document_id="d_x")),
    ("fields", lambda a: {k: v for k, v in a.items() if k != "pages"}),
    ("text", lambda a: changed(a, text=b"bytes")),
    ("text", lambda a: changed(a, text=a["text"] + " " * MAX_TEXT_CHARS)),  # over the extraction budget
    ("extractor", lambda a: changed(a, extractor="pypdf")),
    ("extractor", lambda a: changed(a, extractor="custom")),
    ("extractor", lambda a: changed(a, extractor_version="999")),
    ("encoding", lambda a: changed(a, encoding="no-such-codec")),
    ("pages", lambda a: changed(a, pages=[0, 10])),
    ("chunk offsets", lambda a: changed(a, chunks=[[0, len(a["text"]) + 1, ""]])),
    ("chunk offsets", lambda a: changed(a, chunks=[[-1, 5, ""]])),
    ("chunk offsets", lambda a: changed(a, chunks=[[5, 5, ""]])),
    ("chunk offsets", lambda a: changed(a, chunks=[[0, 201, ""]])),  # longer than chunk_size
    ("chunk offsets", lambda a: changed(a, chunks=[[0, 150, ""], [100, 250, ""]])),  # overlap > 20
    ("chunk offsets", lambda a: changed(a, chunks=[[10, 50, ""], [10, 60, ""]])),  # start not increasing
    ("offsets", lambda a: changed(a, chunks=[[True, 50, ""]])),
    ("offsets", lambda a: changed(a, chunks=[[0.0, 50, ""]])),
    ("chunks", lambda a: changed(a, chunks=[[0, 50]])),
    ("chunks", lambda a: changed(a, chunks="0,50")),
    ("vectors", lambda a: changed(a, vectors=b"\0" * 8)),  # none were asked for
    ("skip reason", lambda a: {"source": a["source"], "file_hash": a["file_hash"], "skipped": "x" * 500}),
    ("skip reason", lambda a: {"source": a["source"], "file_hash": a["file_hash"], "skipped": "a\nb"}),
]


@pytest.mark.parametrize("why,lie", BAD_ANSWERS, ids=[f"{n}-{b[0]}" for n, b in enumerate(BAD_ANSWERS)])
def test_an_answer_that_disagrees_with_the_record_is_rejected(why, lie):
    job, answer = honest()
    assert accept(job, answer, (200, 20)).acl == job.acl  # the honest answer is accepted
    with pytest.raises(Rejected) as raised:
        accept(job, lie(answer), (200, 20))
    assert str(raised.value) == why


def test_vectors_must_be_exactly_the_asked_ones_and_finite():
    """With vectors asked for, the answer must hold one finite float32 vector of the collection's
    dimensions per chunk the collection lacks, no more and no fewer."""
    job, answer = honest()
    chunks = len(answer["chunks"])
    assert chunks >= 3
    good = np.arange(chunks * 4, dtype="<f4").tobytes()
    doc = accept(job, changed(answer, vectors=good), (200, 20), (), 4)
    assert list(doc.vectors) == doc.chunk_ids and doc.vectors[doc.chunk_ids[1]].tolist() == [4, 5, 6, 7]
    have = frozenset(doc.chunk_ids[:1])  # the collection has the first chunk's vector
    assert list(accept(job, changed(answer, vectors=good[16:]), (200, 20), have, 4).vectors) == doc.chunk_ids[1:]
    nan = np.frombuffer(good, dtype="<f4").copy()
    nan[5] = np.inf
    for bad in (good[:-4], good + good[:16], nan.tobytes(), None, list(range(chunks * 4))):
        with pytest.raises(Rejected, match="vectors"):
            accept(job, changed(answer, vectors=bad), (200, 20), (), 4)
    with pytest.raises(Rejected, match="vectors"):
        accept(job, changed(answer, vectors=good), (200, 20), have, 4)  # one more than asked


def test_a_workers_failure_reason_is_one_of_its_own():
    job, answer = honest()
    head = {"source": answer["source"], "file_hash": answer["file_hash"]}
    assert accept(job, {**head, "failed": "embedding failed"}, (200, 20)) == Outcome(False, "embedding failed")
    assert accept(job, {**head, "failed": "<script>"}, (200, 20)) == Outcome(False, "worker failed")
    assert accept(job, {**head, "skipped": "empty"}, (200, 20)) == Outcome(True, "empty")
