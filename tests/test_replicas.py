"""Two `groundkit serve` replicas of one index directory behind Debian's nginx (the shipped
deploy/nginx config), re-ingested while a bounded load runs through the balancer.

Real processes throughout: the replicas, nginx and the load's HTTP requests. The replicas are
a published service (allow_remote_access with a static token), on loopback only.
"""

import threading
import time

import httpx
import pytest

from groundkit_datasette.indexing.ingest import Indexer

from .replica_support import Replicas, published_metadata

CLIENTS = 6
EDITIONS = 4


def write_edition(corpus, edition: int):
    corpus.mkdir(exist_ok=True)
    for n in range(8):
        (corpus / f"doc{n}.md").write_text(
            f"# Document {n}\n\nThe lantern at harbour {n} belongs to edition {edition}. "
            f"Edition {edition} replaces every earlier one.\n", encoding="utf-8")


@pytest.fixture
def served(tmp_path):
    corpus, index = tmp_path / "corpus", tmp_path / "index"
    write_edition(corpus, 1)
    Indexer("docs", index_dir=index, embedder="none").ingest([corpus])
    replicas = Replicas(tmp_path, index, count=2)
    try:
        yield replicas, corpus, index
    finally:
        replicas.close()


def search(client, base, headers):
    r = client.get(f"{base}/docs/-/groundkit/search.json", params={"query": "lantern edition", "mode": "bm25",
                                                                    "top_k": 8}, headers=headers)
    return r.status_code, (r.json() if r.headers.get("content-type", "").startswith("application/json") else None)


def test_reingest_under_load_through_nginx(served):
    """0 errors; every answer is one version (its hits all say the edition of its generation);
    each client sees generations in order; both replicas answer and both follow each publish."""
    replicas, corpus, index = served
    stop = threading.Event()
    seen: list[list] = [[] for _ in range(CLIENTS)]

    def client(n):
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                seen[n].append(search(c, replicas.url, replicas.headers))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while not all(seen) and time.monotonic() < deadline:  # every client has an answer
            time.sleep(0.1)
        for edition in range(2, EDITIONS + 1):
            time.sleep(0.5)
            write_edition(corpus, edition)
            report = Indexer("docs", index_dir=index).ingest([corpus])
            assert report.published and report.generation == edition
        # Every replica, asked directly, follows the last publish.
        with httpx.Client(timeout=30) as c:
            for port in replicas.ports:
                status, body = search(c, f"http://127.0.0.1:{port}", replicas.headers)
                assert status == 200 and body["generation"] == EDITIONS
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(
                1 for s in seen for _st, b in s[-3:] if b and b["generation"] == EDITIONS) < CLIENTS:
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(60)

    answers = [a for s in seen for a in s]
    assert len(answers) > 50
    assert [st for st, _ in answers if st != 200] == []
    for _status, body in answers:
        g = body["generation"]
        assert len(body["hits"]) == 8
        assert all(f"edition {g}." in h["content"] for h in body["hits"]), (g, [h["content"] for h in body["hits"]])
    for s in seen:
        generations = [b["generation"] for _st, b in s]
        assert generations == sorted(generations)  # sequential requests never go back a version
    assert {b["generation"] for _st, b in answers} >= {1, EDITIONS}
    assert replicas.upstreams_used() == {f"127.0.0.1:{p}" for p in replicas.ports}


def test_balancer_does_not_make_the_service_anonymous(served):
    """Through nginx the forwarded Host is accepted (allow_remote_access), and that is exactly
    why every request needs an actor: without the token, 401 from the replicas."""
    replicas, _corpus, _index = served
    r = httpx.get(f"{replicas.url}/docs/-/groundkit/search.json", params={"query": "lantern"},
                  headers={"Host": "search.example.com"}, timeout=30)
    assert r.status_code == 401
    r = httpx.get(f"{replicas.url}/docs/-/groundkit/search.json", params={"query": "lantern"},
                  headers={"Host": "search.example.com", **replicas.headers}, timeout=30)
    assert r.status_code == 200


def test_replica_refuses_a_public_host_without_publishing(tmp_path):
    """Without allow_remote_access (the default), a replica behind the same nginx still refuses
    a public Host: the setup needs the documented setting, it does not loosen the default."""
    corpus, index = tmp_path / "corpus", tmp_path / "index"
    write_edition(corpus, 1)
    Indexer("docs", index_dir=index, embedder="none").ingest([corpus])
    replicas = Replicas(tmp_path, index, count=1, metadata={})
    try:
        r = httpx.get(f"{replicas.url}/docs/-/groundkit/search.json", params={"query": "lantern"},
                      headers={"Host": "search.example.com"}, timeout=30)
        assert r.status_code == 403 and "host_not_allowed" in r.text
    finally:
        replicas.close()
