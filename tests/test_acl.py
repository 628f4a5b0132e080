"""What the caller may read: document access lists set at ingest (front matter, sidecar,
directory file), and search (bm25, dense, hybrid, rerank), fetch_chunk and index_status that
only ever include what the actor may read, filtered before anything is truncated."""

import json
import logging
import os
import shutil
import sqlite3

import httpx
import pytest
from datasette.app import Datasette

from groundkit_datasette import registry as gk_registry
from groundkit_datasette.retrieval import search as gk_search
from groundkit_datasette.indexing.access_lists import DENY_ALL, DIRECTORY_FILE as DIRECTORY, normalize
from groundkit_datasette.retrieval.permissions import Reader, ScopedCollection
from groundkit_datasette.security.auth import hash_token
from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.hookspecs import hookimpl
from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.retrieval.models import SearchRequest

WORD = "quarterly"
PUBLIC = [f"pub{i:02d}.txt" for i in range(8)]


def write_acl_corpus(root):
    """Restricted documents mention WORD more often than public ones, so they outrank them."""
    (root / "hr").mkdir(parents=True)
    (root / "hr" / ".groundkit-acl.json").write_text(json.dumps({"groups": ["hr"]}))
    (root / "hr" / "salaries.md").write_text(
        "# Salaries\n\nquarterly quarterly quarterly salary bands and bonuses zebrafinch\n")
    (root / "hr" / "deeper").mkdir()
    (root / "hr" / "deeper" / "reviews.txt").write_text("quarterly quarterly quarterly reviews kestrelwing\n")
    (root / "hr" / "open.md").write_text(
        "---\ntitle: Open\ngroundkit_acl:\n  groups: [staff]\n---\n# Open\n\nquarterly quarterly "
        "quarterly staff handbook\n")
    (root / "secret.md").write_text(
        "---\ngroundkit_acl:\n  users: [alice]\n---\n# Merger\n\nquarterly quarterly quarterly "
        "quarterly merger plans ospreyfalcon\n")
    (root / "plan.txt").write_text("quarterly quarterly quarterly quarterly board plan\n")
    (root / "plan.txt.acl.json").write_text(json.dumps({"users": ["bob"], "groups": ["exec"]}))
    (root / "broken.md").write_text("quarterly quarterly quarterly quarterly broken acl\n")
    (root / "broken.md.acl.json").write_text("{not json")
    for i, name in enumerate(PUBLIC):
        (root / name).write_text(f"{WORD} note number {i} about general topic {i}\n")
    return root


READABLE = {
    "anonymous": set(PUBLIC),
    "alice": set(PUBLIC) | {"secret.md"},
    "carol-hr": set(PUBLIC) | {"hr/salaries.md", "hr/deeper/reviews.txt"},
    "dave-staff-hr": set(PUBLIC) | {"hr/salaries.md", "hr/deeper/reviews.txt", "hr/open.md"},
    "bob": set(PUBLIC) | {"plan.txt"},
    "erin-exec": set(PUBLIC) | {"plan.txt"},
}
ACTORS = {
    "anonymous": None,
    "alice": {"id": "alice"},
    "carol-hr": {"id": "carol", "groups": ["hr"]},
    "dave-staff-hr": {"id": "dave", "groups": ["staff", "hr"]},
    "bob": {"id": "bob", "groups": "not-a-list"},
    "erin-exec": {"id": "erin", "groups": ["exec", 7]},
}


class Spy:
    """A reranker that records every text it is shown."""

    seen: list[str] = []
    name = "spy"
    model_name = "spy-overlap"

    def score(self, query, texts):
        Spy.seen.extend(texts)
        words = set(query.lower().split())
        return [float(len(words & set(t.lower().split()))) + len(t) / 1e6 for t in texts]


class SpyPlugin:
    @staticmethod
    @hookimpl
    def register_rerankers(register):
        register("spy", Spy)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("acl")
    corpus = write_acl_corpus(root / "corpus")
    index_dir = root / "index"
    ingest([corpus], collection="acl", index_dir=index_dir)  # real MiniLM vectors
    write_acl_corpus(root / "plain")
    for p in (root / "plain").rglob("*acl.json"):
        p.unlink()
    for p in (root / "plain").rglob("*.md"):
        p.write_text(p.read_text().replace("groundkit_acl", "other_key"))
    ingest([root / "plain"], collection="plain", index_dir=index_dir, embedder="none")
    gk_registry.pm.register(SpyPlugin, name="acl-test-spy")
    yield corpus, index_dir
    gk_registry.pm.unregister(name="acl-test-spy")


def make_ds(built, **config):
    corpus, index_dir = built
    return Datasette(
        files=[], immutables=[str(index_dir / "acl.sqlite3"), str(index_dir / "plain.sqlite3")],
        secret="acl-test", metadata={"plugins": {"groundkit": {
            "base_dir": str(corpus), "reranker": "spy", **config}}},
    )


def cookies(ds, who):
    actor = ACTORS[who]
    return {"ds_actor": ds.sign({"a": actor}, "actor")} if actor else {}


async def search(ds, who, collection="acl", **body):
    r = await ds.client.post(f"/{collection}/-/groundkit/search.json", content=json.dumps(body),
                             headers={"content-type": "application/json"}, cookies=cookies(ds, who))
    assert r.status_code == 200, r.text
    return r.json()


def acls(index_dir, name="acl"):
    conn = sqlite3.connect(index_dir / f"{name}.sqlite3")
    try:
        return dict(conn.execute("SELECT source, acl FROM documents"))
    finally:
        conn.close()


def test_ingest_records_access_lists(built):
    _corpus, index_dir = built
    found = acls(index_dir)
    assert found["hr/salaries.md"] == normalize({"groups": ["hr"]})
    assert found["hr/deeper/reviews.txt"] == normalize({"groups": ["hr"]})  # nearest parent's file
    assert found["hr/open.md"] == '{"groups":["staff"],"users":[]}'  # front matter wins
    assert found["secret.md"] == '{"groups":[],"users":["alice"]}'
    assert found["plan.txt"] == '{"groups":["exec"],"users":["bob"]}'
    assert found["broken.md"] == DENY_ALL  # an unreadable list fails closed
    assert all(found[p] is None for p in PUBLIC)
    assert not [s for s in found if s.endswith("acl.json")]  # sidecars are not documents
    assert all(v is None for v in acls(index_dir, "plain").values())


def test_front_matter_wins_over_a_sidecar_which_wins_over_the_directory_file(tmp_path):
    """The most specific list applies and the others are not even read: a broken sidecar beside
    valid front matter changes nothing, while broken front matter fails closed."""
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / DIRECTORY).write_text(json.dumps({"groups": ["dir"]}))
    front = "---\ngroundkit_acl:\n  users: [front]\n---\n# Doc\n\nbody text\n"
    (corpus / "both.md").write_text(front)
    (corpus / "both.md.acl.json").write_text(json.dumps({"users": ["side"]}))
    (corpus / "bad-side.md").write_text(front)
    (corpus / "bad-side.md.acl.json").write_text("{not json")
    (corpus / "bad-front.md").write_text("---\ngroundkit_acl: [front]\n---\nbody\n")
    (corpus / "bad-front.md.acl.json").write_text(json.dumps({"users": ["side"]}))
    (corpus / "other-key.md").write_text("---\ntitle: T\n---\n# T\n\nbody\n")
    (corpus / "other-key.md.acl.json").write_text(json.dumps({"users": ["side"]}))
    (corpus / "plain.txt").write_text("body\n")
    (corpus / "plain.txt.acl.json").write_text(json.dumps({"users": ["side"]}))
    (corpus / "dir-only.txt").write_text("body\n")
    ingest([corpus], collection="order", index_dir=tmp_path / "i", embedder="none")
    assert acls(tmp_path / "i", "order") == {
        "both.md": normalize({"users": ["front"]}),
        "bad-side.md": normalize({"users": ["front"]}),
        "bad-front.md": DENY_ALL,
        "other-key.md": normalize({"users": ["side"]}),
        "plain.txt": normalize({"users": ["side"]}),
        "dir-only.txt": normalize({"groups": ["dir"]}),
    }


def test_a_bad_access_list_is_logged_and_fails_closed(tmp_path, caplog):
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.md").write_text("---\ngroundkit_acl: [alice]\n---\nalpha\n")
    (corpus / "b.md").write_text("---\ngroundkit_acl: {users: [alice\n---\nbeta\n")
    (corpus / "c.txt").write_text("gamma\n")
    (corpus / "c.txt.acl.json").write_text(json.dumps({"users": "alice", "admins": ["x"]}))
    (corpus / "d.txt").write_text("delta\n")
    (corpus / "d.txt.acl.json").symlink_to("/etc/hostname")
    with caplog.at_level(logging.WARNING):
        ingest([corpus], collection="bad", index_dir=tmp_path / "i", embedder="none")
    assert set(acls(tmp_path / "i", "bad").values()) == {DENY_ALL}
    assert len([r for r in caplog.records if "access list refused" in r.getMessage()]) == 4


def test_changing_only_an_access_list_republishes_without_re_embedding(tmp_path):
    corpus = write_acl_corpus(tmp_path / "corpus")
    index_dir = tmp_path / "index"
    ingest([corpus], collection="acl", index_dir=index_dir, embedder="none")
    (corpus / "plan.txt.acl.json").write_text(json.dumps({"users": ["zoe"]}))
    report = ingest([corpus], collection="acl", index_dir=index_dir, embedder="none")
    assert (report.updated, report.added, report.chunks_written, report.published) == (1, 0, 0, True)
    assert acls(index_dir)["plan.txt"] == '{"groups":[],"users":["zoe"]}'
    (corpus / "plan.txt.acl.json").unlink()
    ingest([corpus], collection="acl", index_dir=index_dir, embedder="none")
    assert acls(index_dir)["plan.txt"] is None
    report = ingest([corpus], collection="acl", index_dir=index_dir, embedder="none")
    assert not report.published and report.unchanged == len(acls(index_dir))


def unrestricted_ranking(built, mode, top_k=50):
    _corpus, index_dir = built
    with Collection.open("acl", index_dir=index_dir) as col:
        return col.search(query=f"{WORD} plans", mode=mode, top_k=top_k).hits


@pytest.mark.parametrize("who", list(ACTORS))
@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
async def test_search_returns_only_readable_hits_and_still_fills_top_k(built, who, mode):
    ds = make_ds(built)
    top_k = 5
    body = await search(ds, who, query=f"{WORD} plans", mode=mode, top_k=top_k)
    sources = [h["source"] for h in body["hits"]]
    assert set(sources) <= READABLE[who], sources
    assert len(sources) == top_k  # hidden hits did not use up top-k slots
    assert body["complete"] is True
    everything = unrestricted_ranking(built, mode)
    if mode != "hybrid":  # same scores, only readable: exactly the unrestricted list filtered
        expected = [h.chunk_id for h in everything if h.source in READABLE[who]][:top_k]
        assert [h["chunk_id"] for h in body["hits"]] == expected
    if who == "anonymous" and mode == "bm25":
        # The restricted documents outrank every public one: without filtering before
        # truncation the top 5 would hold no public hit at all.
        assert not {h.source for h in everything[:top_k]} & READABLE[who]


async def test_rerank_never_sees_a_hidden_chunk(built):
    ds = make_ds(built)
    Spy.seen.clear()
    body = await search(ds, "anonymous", query=f"{WORD} merger plans", mode="hybrid", rerank=True, top_k=5)
    assert body["reranked"] and len(body["hits"]) == 5 and body["complete"] is True
    assert {h["source"] for h in body["hits"]} <= READABLE["anonymous"]
    assert Spy.seen and not [t for t in Spy.seen if "ospreyfalcon" in t or "zebrafinch" in t
                             or "board plan" in t]
    Spy.seen.clear()
    body = await search(ds, "alice", query=f"{WORD} merger plans", mode="bm25", rerank=True, top_k=3)
    assert body["hits"][0]["source"] == "secret.md"


async def test_a_hidden_chunk_looks_exactly_like_a_missing_one(built):
    ds = make_ds(built)
    secret = (await search(ds, "alice", query="ospreyfalcon merger", mode="bm25"))["hits"][0]
    assert secret["source"] == "secret.md"
    path = f"/acl/-/groundkit/chunks/{secret['chunk_id']}.json"
    allowed = await ds.client.get(path, cookies=cookies(ds, "alice"))
    assert allowed.status_code == 200 and "ospreyfalcon" in allowed.text
    for who in ("anonymous", "bob", "carol-hr"):
        hidden = await ds.client.get(path, cookies=cookies(ds, who))
        missing = await ds.client.get("/acl/-/groundkit/chunks/c_000000000000000000000000.json",
                                      cookies=cookies(ds, who))
        assert hidden.status_code == missing.status_code == 404
        strip = lambda r: {k: v for k, v in r.json().items() if k != "request_id"}  # noqa: E731
        assert strip(hidden) == strip(missing)
        assert secret["chunk_id"] not in hidden.text
    assert (await search(ds, "anonymous", query="ospreyfalcon zebrafinch kestrelwing", mode="bm25"))["hits"] == []


async def test_counts_include_only_what_the_reader_may_read(built):
    ds = make_ds(built)
    conn = sqlite3.connect(built[1] / "acl.sqlite3")
    chunks_of = dict(conn.execute("SELECT source, chunk_count FROM documents"))
    conn.close()
    status = {}
    for who in ACTORS:
        r = await ds.client.get("/acl/-/groundkit/status.json", cookies=cookies(ds, who))
        status[who] = r.json()
        assert status[who]["documents"] == len(READABLE[who]), who
        assert status[who]["chunks"] == sum(chunks_of[s] for s in READABLE[who]), who
    plain = (await ds.client.get("/plain/-/groundkit/status.json")).json()
    assert plain["documents"] == len(READABLE["anonymous"]) + 6
    # The vocabulary count excludes terms only hidden documents contain.
    assert status["anonymous"]["bm25_terms"] < status["alice"]["bm25_terms"] < plain["bm25_terms"]


async def test_groups_from_a_token_apply(built):
    ds = make_ds(built, tokens=[{"id": "hr-bot", "sha256": hash_token("hr-bot-token-123"),
                                 "groups": ["hr"]}])
    r = await ds.client.post("/acl/-/groundkit/search.json",
                             content=json.dumps({"query": "zebrafinch", "mode": "bm25"}),
                             headers={"content-type": "application/json",
                                      "authorization": "Bearer hr-bot-token-123"})
    assert [h["source"] for h in r.json()["hits"]] == ["hr/salaries.md"]


async def test_mcp_answers_what_the_json_api_answers(built):
    ds = make_ds(built)
    arguments = {"collection": "acl", "query": f"{WORD} plans", "mode": "bm25", "top_k": 5}
    for who in ("anonymous", "alice"):
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "search", "arguments": arguments}}
        r = await ds.client.post("/-/groundkit/mcp", content=json.dumps(body), cookies=cookies(ds, who),
                                 headers={"content-type": "application/json",
                                          "accept": "application/json, text/event-stream"})
        mcp_hits = r.json()["result"]["structuredContent"]["hits"]
        json_hits = (await search(ds, who, **{k: v for k, v in arguments.items() if k != "collection"}))["hits"]
        assert [h["chunk_id"] for h in mcp_hits] == [h["chunk_id"] for h in json_hits]
        assert {h["source"] for h in mcp_hits} <= READABLE[who]


async def test_datasette_table_and_sql_views_are_closed_on_a_collection_with_access_lists(built):
    ds = make_ds(built)
    alice = cookies(ds, "alice")
    for path in ("/acl/chunks.json", "/acl/documents.json", "/acl/chunks.json?_search=ospreyfalcon",
                 "/acl.json?sql=select+content+from+chunks", "/acl.db"):
        r = await ds.client.get(path, cookies=alice, follow_redirects=True)  # 1.0: ?sql= redirects
        assert r.status_code == 403, path
        assert "ospreyfalcon" not in r.text
    for path in ("/plain/chunks.json", "/plain.json?sql=select+count(*)+from+chunks"):
        assert (await ds.client.get(path, follow_redirects=True)).status_code == 200, path


def test_complete_is_false_when_the_dense_engine_comes_back_short(built, monkeypatch):
    _corpus, index_dir = built
    with Collection.open("acl", index_dir=index_dir) as col:
        scoped = ScopedCollection(col, Reader.from_actor(None))
        request = SearchRequest(query=f"{WORD} plans", mode="dense", top_k=5)
        assert scoped.search(request).complete is True
        # Fewer results than readable chunks exist: complete stays true only when nothing
        # more is readable (here: 8 public chunks, 50 asked).
        assert scoped.search(SearchRequest(query=WORD, mode="dense", top_k=50)).complete is True
        from groundkit_datasette.retrieval import rankers

        real = rankers.dense_ranked
        # An ANN index probing too few partitions under a selective prefilter returns short.
        monkeypatch.setattr(rankers, "dense_ranked", lambda *a: real(*a)[:2])
        for mode in ("dense", "hybrid"):
            response = scoped.search(SearchRequest(query=f"{WORD} plans", mode=mode, top_k=5))
            assert response.complete is False, mode
        assert scoped.search(SearchRequest(query=f"{WORD} plans", mode="bm25", top_k=5)).complete is True


def test_unscoped_python_api_reads_everything_and_a_corrupt_list_hides_the_document(built, tmp_path):
    _corpus, index_dir = built
    with Collection.open("acl", index_dir=index_dir) as col:
        sources = {h.source for h in col.search(query=WORD, mode="bm25", top_k=50).hits}
    assert "broken.md" in sources and "secret.md" in sources  # the operator's own access
    shutil.copy(index_dir / "plain.sqlite3", tmp_path / "copy.sqlite3")
    conn = sqlite3.connect(tmp_path / "copy.sqlite3")
    with conn:
        conn.execute("UPDATE documents SET acl = '{oops' WHERE source = 'pub00.txt'")
    conn.close()
    with Collection.from_path(tmp_path / "copy.sqlite3") as col:
        scoped = ScopedCollection(col, Reader.from_actor({"id": "alice", "groups": ["hr"]}))
        hits = scoped.search(SearchRequest(query=WORD, mode="bm25", top_k=50)).hits
        assert "pub00.txt" not in {h.source for h in hits} and hits
        assert scoped.status().documents == len(acls(index_dir, "plain")) - 1


def test_keyword_scores_do_not_depend_on_hidden_documents(tmp_path):
    """BM25's IDF for a reader is computed without the chunks hidden from it."""

    def build(name, secret_text):
        corpus = tmp_path / name
        (corpus / "hr").mkdir(parents=True)
        (corpus / "hr" / ".groundkit-acl.json").write_text(json.dumps({"groups": ["hr"]}))
        (corpus / "hr" / "secret.txt").write_text(secret_text)
        (corpus / "public.txt").write_text("The aurora appeared over the fjord at night.\n")
        for i in range(6):
            (corpus / f"pad{i}.txt").write_text(f"Harbour notes number {i} about ferries and tides.\n")
        ingest([corpus], collection=name, index_dir=tmp_path / "index", embedder="none")
        return Collection.open(name, index_dir=tmp_path / "index")

    # The two hidden documents have the same length; only one mentions the query term.
    with build("mentions", "Aurora aurora borealis memo.\n") as a, \
            build("silent", "Zenith zenith borealis memo.\n") as b:
        def score(col, reader):
            view = col if reader is None else ScopedCollection(col, reader)
            hits = view.search(SearchRequest(query="aurora", mode="bm25", top_k=5)).hits
            return {h.source: h.score for h in hits}

        anonymous = Reader(None, frozenset())
        seen_a, seen_b = score(a, anonymous), score(b, anonymous)
        assert set(seen_a) == set(seen_b) == {"public.txt"}
        assert seen_a["public.txt"] == pytest.approx(seen_b["public.txt"], rel=1e-6)
        # Unscoped (the operator) the hidden mention does move the public score: the test
        # above would catch a leak.
        assert score(a, None)["public.txt"] < score(b, None)["public.txt"] * 0.99
        # A reader who may see the memo gets the collection-wide figures.
        hr = Reader("ann", frozenset({"hr"}))
        assert score(a, hr) == pytest.approx(score(a, None), rel=1e-6)


def test_an_access_list_in_a_directory_that_cannot_be_listed_still_applies(tmp_path, monkeypatch):
    # A directory may be searchable but not listable (mode 711). The tests run as root, who
    # lists everything, so the refusal is simulated; the file itself is real. Directories are
    # listed by descriptor (safe_read.py): the fake names one by its /proc link.
    corpus = tmp_path / "corpus"
    (corpus / "hr" / "sub").mkdir(parents=True)
    (corpus / "hr" / ".groundkit-acl.json").write_text(json.dumps({"groups": ["hr"]}))
    (corpus / "hr" / "sub" / "pay.txt").write_text("Salaries.\n")
    (corpus / "hr" / "sub" / "pay.txt.acl.json").write_text(json.dumps({"users": ["ann"]}))
    (corpus / "hr" / "sub" / "plan.txt").write_text("Plans.\n")
    real_listdir = os.listdir

    def listdir(path):
        name = os.readlink(f"/proc/self/fd/{path}") if isinstance(path, int) else path
        if os.path.basename(name) in ("hr", "sub"):
            raise PermissionError(13, "Permission denied")
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    ingest([corpus / "hr" / "sub"], collection="hr", index_dir=tmp_path / "index", embedder="none",
           base_dir=corpus)
    assert acls(tmp_path / "index", "hr") == {
        "hr/sub/pay.txt": normalize({"users": ["ann"]}),
        "hr/sub/plan.txt": normalize({"groups": ["hr"]}),
    }


def test_reader_from_actor():
    assert Reader.from_actor(None) == Reader(None, frozenset())
    assert Reader.from_actor({"id": 7, "groups": ["a", 1, None]}) == Reader("7", frozenset({"a"}))
    assert Reader.from_actor({"id": "x", "groups": "g"}) == Reader("x", frozenset({"g"}))
    assert Reader.from_actor({"groups": {"a": 1}}) == Reader(None, frozenset())


async def test_a_published_collection_behind_tokens_end_to_end(built):
    ds = make_ds(built, allow_remote_access=True,
                 tokens=[{"id": "alice", "sha256": hash_token("alice-token-0123")}])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=ds.app()),
                                 base_url="http://192.0.2.7") as client:
        r = await client.post("/acl/-/groundkit/search.json",
                              content=json.dumps({"query": "ospreyfalcon", "mode": "bm25"}),
                              headers={"content-type": "application/json"})
        assert r.status_code == 401
        r = await client.post("/acl/-/groundkit/search.json",
                              content=json.dumps({"query": "ospreyfalcon", "mode": "bm25"}),
                              headers={"content-type": "application/json",
                                       "authorization": "Bearer alice-token-0123"})
        assert [h["source"] for h in r.json()["hits"]] == ["secret.md"]


DEEP = 30_000  # levels of nesting: 60 KB, under the 64 KiB bounds on list files and front matter


def test_access_lists_nested_too_deep_deny_the_document_and_the_run_goes_on(tmp_path, caplog):
    """A sidecar, a directory file or front matter nested 30,000 levels deep is an invalid
    list (readable by no one, reported), not a RecursionError ending the run; front matter that
    does not parse and does not mention groundkit_acl is no front matter."""
    deep_json = "[" * DEEP + "]" * DEEP
    assert len(deep_json) < 64 * 1024
    corpus = tmp_path / "c"
    (corpus / "deepdir").mkdir(parents=True)
    (corpus / "side.txt").write_text("sidecar document\n")
    (corpus / "side.txt.acl.json").write_text(deep_json)
    (corpus / "deepdir" / DIRECTORY).write_text('{"users": ' + deep_json + "}")
    (corpus / "deepdir" / "in-dir.txt").write_text("directory document\n")
    (corpus / "front.md").write_text(f"---\ngroundkit_acl: {deep_json}\n---\n# Front\n\nbody\n")
    (corpus / "mapping.md").write_text(
        "---\ngroundkit_acl:\n  users: " + "{a: " * 12_000 + "1" + "}" * 12_000 + "\n---\nbody\n")
    (corpus / "title.md").write_text(f"---\ntitle: {deep_json}\n---\nuntitled body\n")
    (corpus / "date.md").write_text("---\ndate: 2024-13-45\n---\nbody with a bad date\n")
    (corpus / "date-acl.md").write_text("---\ndate: 2024-13-45\ngroundkit_acl: {users: [ann]}\n---\nb\n")
    (corpus / "public.txt").write_text("public document\n")
    with caplog.at_level(logging.WARNING):
        report = ingest([corpus], collection="deep", index_dir=tmp_path / "i", embedder="none")
    assert report.published and report.failed == 0
    assert acls(tmp_path / "i", "deep") == {
        "side.txt": DENY_ALL, "deepdir/in-dir.txt": DENY_ALL, "front.md": DENY_ALL,
        "mapping.md": DENY_ALL, "date-acl.md": DENY_ALL,
        "title.md": None, "date.md": None, "public.txt": None,
    }
    refused = {r.getMessage().split(":")[0] for r in caplog.records if "access list refused" in r.getMessage()}
    assert refused == {"side.txt", "deepdir/in-dir.txt", "front.md", "mapping.md", "date-acl.md"}
    assert any("nested too deeply" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if "RecursionError" in r.getMessage()]


def test_deep_nesting_over_the_cli_publishes_the_rest(tmp_path):
    """The same files through ``groundkit ingest`` with enough documents for the forked map
    stage: exit 0, no traceback, every other document published."""
    import subprocess
    import sys

    corpus = tmp_path / "c"
    corpus.mkdir()
    deep_json = "[" * DEEP + "]" * DEEP
    (corpus / "side.txt").write_text("sidecar document\n")
    (corpus / "side.txt.acl.json").write_text(deep_json)
    (corpus / "front.md").write_text(f"---\ngroundkit_acl: {deep_json}\n---\n# Front\n\nbody\n")
    for i in range(80):
        (corpus / f"doc{i:02d}.txt").write_text(f"ordinary document {i}\n")
    result = subprocess.run(
        [sys.executable, "-m", "groundkit_datasette.cli", "ingest", str(corpus), "-c", "deep",
         "--index-dir", str(tmp_path / "i"), "--embedder", "none"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "RecursionError" not in result.stderr
    found = acls(tmp_path / "i", "deep")
    assert len(found) == 82 and found["side.txt"] == found["front.md"] == DENY_ALL
