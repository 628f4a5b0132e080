"""Permissions are decided against the collection version that answers the query
(adr/0011, adr/0053): a publish forced between the check and the query leaks nothing, and a
protected collection's text is refused on every route of a live instance, on Datasette 0.65
(``permission_allowed``) and 1.0 (``permission_resources_sql``) alike.

Each race test makes the publish land at the exact point of the race, with a real re-ingest,
instead of hoping a load test hits it."""

import json

import httpx
import pytest
from datasette import hookimpl
from datasette.app import Datasette
from datasette.plugins import pm

from groundkit_datasette.security.auth import hash_token
from groundkit_datasette.surfaces.datasette_compat import DATASETTE_1, CollectionVersion

from groundkit_datasette.retrieval.permissions import Reader, ScopedCollection
from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.errors import ChunkNotFound
from groundkit_datasette.indexing.ingest import ingest

from .conftest import write_corpus

SECRET_WORD = "Photovoltaic"  # only in solar.md


def protect_solar(corpus):
    (corpus / "solar.md.acl.json").write_text(json.dumps({"users": ["alice"]}))


def solar_chunk_ids(index_dir):
    with Collection.open("energy", index_dir=index_dir) as col:
        return [r[0] for r in col.query(
            "SELECT chunk_id FROM chunks JOIN documents USING (document_id) WHERE source = 'solar.md'")]


def test_an_open_version_with_access_lists_stays_filtered_after_a_publish_without(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    index_dir = tmp_path / "index"
    protect_solar(corpus)
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    hidden = solar_chunk_ids(index_dir)
    col = Collection.open("energy", index_dir=index_dir)  # the version a request holds
    try:
        # The publish lands mid-request: the new version has no access list at all.
        (corpus / "solar.md.acl.json").unlink()
        ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
        assert not col.is_current()
        anonymous = ScopedCollection(col, Reader.from_actor(None))
        hits = anonymous.search(query="photovoltaic panels sunlight", mode="bm25", top_k=10).hits
        assert all(SECRET_WORD not in h.content for h in hits)
        assert all(h.chunk_id not in hidden for h in hits)
        with pytest.raises(ChunkNotFound):
            anonymous.fetch_chunk(hidden[0])
        assert anonymous.status().documents == col.status().documents - 1
        alice = ScopedCollection(col, Reader.from_actor({"id": "alice"}))
        assert any(SECRET_WORD in h.content for h in alice.search(
            query="photovoltaic panels sunlight", mode="bm25", top_k=10).hits)
    finally:
        col.close()


def test_a_version_that_ever_had_access_lists_says_so(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    index_dir = tmp_path / "index"
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    with Collection.open("energy", index_dir=index_dir) as col:
        assert not col.protected
    protect_solar(corpus)
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    (corpus / "solar.md.acl.json").unlink()
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    with Collection.open("energy", index_dir=index_dir) as col:
        assert col.query("SELECT count(*) FROM documents WHERE acl IS NOT NULL")[0][0] == 0
        assert col.protected and col.manifest["access_lists"] == "1"


class PublishAfterTheCheck:
    """A plugin whose permission answer runs after groundkit's: it publishes a new version
    with an access list there, between Datasette's permission check and its query. The hook
    is the line's own: ``permission_allowed`` on 0.65, ``permission_resources_sql`` on 1.0."""

    def __init__(self, corpus, index_dir):
        self.corpus, self.index_dir, self.fired = corpus, index_dir, False

    def _publish(self, action):
        if action not in ("view-table", "execute-sql") or self.fired:
            return None

        async def inner():
            self.fired = True
            protect_solar(self.corpus)
            ingest([self.corpus], collection="energy", index_dir=self.index_dir, embedder="none")
            return None

        return inner

    if DATASETTE_1:
        @hookimpl
        def permission_resources_sql(self, datasette, actor, action):
            return self._publish(action)
    else:
        @hookimpl
        def permission_allowed(self, datasette, actor, action, resource):
            return self._publish(action)


@pytest.mark.parametrize("path", [
    "/energy/chunks.json?_shape=array",
    "/energy/chunks.json?_search=photovoltaic&_shape=array",
    "/energy.json?sql=select+content+from+chunks&_shape=array",
])
async def test_datasettes_own_views_leak_nothing_when_a_publish_adds_the_first_access_list(
        tmp_path, path):
    corpus = write_corpus(tmp_path / "corpus")
    index_dir = tmp_path / "index"
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    ds = Datasette(files=[], immutables=[str(index_dir / "energy.sqlite3")],
                   metadata={"plugins": {"groundkit": {"base_dir": str(corpus)}}})
    # Before: the collection has no access list and the raw view answers with its text.
    r = await ds.client.get(path, follow_redirects=True)
    assert r.status_code == 200 and SECRET_WORD in r.text
    before = r.json()

    plugin = PublishAfterTheCheck(corpus, index_dir)
    pm.register(plugin, name="publish-after-the-check")
    try:
        r = await ds.client.get(path, follow_redirects=True)
    finally:
        pm.unregister(name="publish-after-the-check")
    assert plugin.fired
    # The request is answered by the version it was routed to, which had no access list
    # (the same rows as before), or it is refused: never rows read from the new version.
    if r.status_code == 200:
        assert r.json() == before
    else:
        assert r.status_code in (400, 403, 500) and SECRET_WORD not in r.text
    # And afterwards the view is closed by the permission check itself.
    r = await ds.client.get("/energy/chunks.json?_shape=array")
    assert r.status_code == 403 and SECRET_WORD not in r.text


async def test_a_connection_opened_after_a_publish_reads_nothing_of_a_protected_version(
        tmp_path):
    """The version a request was routed to opens a thread's first connection after a publish
    added an access list: that connection reads the protected file, and refuses every
    column read (the ``prepare_connection`` hook), whatever a permission check said before."""
    corpus = write_corpus(tmp_path / "corpus")
    index_dir = tmp_path / "index"
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    ds = Datasette(files=[], immutables=[], settings={"num_sql_threads": 1},
                   metadata={"plugins": {"groundkit": {"base_dir": str(corpus)}}})
    version = ds.add_database(CollectionVersion(ds, index_dir / "energy.sqlite3"), name="energy")
    protect_solar(corpus)
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    with pytest.raises(Exception) as refused:
        await version.execute("select content from chunks")
    assert "prohibited" in str(refused.value)
    assert (await version.execute("select count(*) from chunks")).first()[0] > 0


async def test_database_page_of_a_protected_collection_still_opens(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    index_dir = tmp_path / "index"
    protect_solar(corpus)
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    ds = Datasette(files=[], immutables=[str(index_dir / "energy.sqlite3")],
                   metadata={"plugins": {"groundkit": {"base_dir": str(corpus)}}})
    r = await ds.client.get("/energy")
    assert r.status_code == 200 and SECRET_WORD not in r.text


async def test_collections_are_never_downloaded_and_crossdb_sql_is_closed(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    index_dir = tmp_path / "index"
    ingest([corpus], collection="open", index_dir=index_dir, embedder="none")
    protect_solar(corpus)
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    ds = Datasette(files=[], immutables=[str(index_dir / "energy.sqlite3"),
                                         str(index_dir / "open.sqlite3")], crossdb=True,
                   metadata={"plugins": {"groundkit": {"base_dir": str(corpus)}}})
    assert (await ds.client.get("/open.db")).status_code == 403
    r = await ds.client.get("/_memory.json?sql=select+content+from+energy.chunks&_shape=array",
                            follow_redirects=True)  # 1.0 redirects ?sql= to /_memory/-/query
    assert r.status_code == 403 and SECRET_WORD not in r.text


# -- every route of a live instance ----------------------------------------------------------

ALICE_TOKEN = "permissions-alice-token-0123456789"


@pytest.fixture(scope="module")
def protected(tmp_path_factory):
    root = tmp_path_factory.mktemp("protected")
    corpus = write_corpus(root / "corpus")
    protect_solar(corpus)
    index_dir = root / "index"
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    chunk_id = solar_chunk_ids(index_dir)[0]
    return {"corpus": corpus, "index_dir": index_dir, "chunk_id": chunk_id}


def protected_ds(built, **options):
    """An operator who opened the tables and SQL to everyone in Datasette's own terms: the
    collection's access lists still close Datasette's raw views (a deny wins on both lines)."""
    return Datasette(
        files=[], immutables=[str(built["index_dir"] / "energy.sqlite3")], secret="perms",
        metadata={
            "databases": {"energy": {"allow_sql": True, "tables": {
                "chunks": {"allow": True}, "documents": {"allow": True}}}},
            "plugins": {"groundkit": {
                "base_dir": str(built["corpus"]), "index_dir": str(built["index_dir"]),
                "tokens": [{"id": "alice", "sha256": hash_token(ALICE_TOKEN)}]}},
        },
        **options,
    )


# Raw views of the collection, by every spelling of each line (1.0 redirects ?sql= to -/query).
RAW_VIEWS = (
    "/energy/chunks.json?_shape=array", "/energy/chunks.csv", "/energy/chunks",
    "/energy/chunks/1.json", "/energy/chunks.json?_search=photovoltaic",
    "/energy/documents.json?_shape=array", "/energy.json?sql=select+content+from+chunks",
    "/energy/-/query.json?sql=select+content+from+chunks",
    "/energy/-/query.csv?sql=select+content+from+chunks", "/energy.db", "/-/schema.json",
)


async def test_a_protected_collection_s_text_is_refused_on_every_route_of_the_instance(protected):
    """Every route the live instance serves (its own, groundkit's, datasette-mcp's), by GET and
    POST, as an anonymous caller and as alice, who may read solar.md: none answers with
    solar.md's text but groundkit's own tools, for alice only, which apply the access list."""
    from .test_boundary import instance_paths, probe
    from .test_datasette_mcp import mcp_client
    from .test_mcp import Served

    pytest.importorskip("datasette_mcp")
    ds = protected_ds(protected)
    server = Served(ds.app())
    alice = {"authorization": f"Bearer {ALICE_TOKEN}"}
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30,
                                     follow_redirects=True) as client:
            paths = sorted(set(instance_paths(ds, protected)) | set(RAW_VIEWS))
            for headers in ({}, alice):
                for method, path, r in await probe(client, paths, headers):
                    if headers and "/-/groundkit/" in path:
                        continue  # alice's own reads through groundkit: the control below
                    assert SECRET_WORD not in r.text, (method, path, r.status_code)
            for path in ("/energy/chunks.json", "/energy/-/query.json?sql=select+1", "/energy.db"):
                assert (await client.get(path)).status_code == 403, path

            # datasette-mcp's own SQL tool is refused too.
            for headers in (None, alice):
                http_client, mcp = mcp_client(server, headers=headers)
                async with http_client, mcp:
                    result = await mcp.call_tool(
                        "execute_sql", {"database": "energy", "sql": "select content from chunks"})
                assert result.is_error and SECRET_WORD not in json.dumps(result.model_dump())

            # Positive control: groundkit's search gives alice solar.md, and nobody else.
            body = {"query": "photovoltaic panels", "top_k": 5}
            r = await client.post("/energy/-/groundkit/search.json", json=body, headers=alice)
            assert r.status_code == 200 and SECRET_WORD in r.text
            r = await client.post("/energy/-/groundkit/search.json", json=body)
            assert r.status_code == 200 and SECRET_WORD not in r.text
    finally:
        server.stop()


async def test_an_unprotected_collection_s_raw_views_stay_open(protected, tmp_path):
    """The same operator settings on a collection without access lists: the raw views answer
    (the refusals above are groundkit's, not Datasette's defaults)."""
    corpus = write_corpus(tmp_path / "corpus")
    index_dir = tmp_path / "index"
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    ds = protected_ds({"corpus": corpus, "index_dir": index_dir})
    for path in ("/energy/chunks.json?_shape=array",
                 "/energy/-/query.json?sql=select+content+from+chunks&_shape=array"
                 if DATASETTE_1 else "/energy.json?sql=select+content+from+chunks&_shape=array"):
        r = await ds.client.get(path)
        assert r.status_code == 200 and SECRET_WORD in r.text, path
    assert (await ds.client.get("/energy.db")).status_code == 403  # never downloaded
