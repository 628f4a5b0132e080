"""Permissions are decided against the collection version that answers the query
(adr/0011): a publish forced between the check and the query leaks nothing.

Each test makes the publish land at the exact point of the race, with a real re-ingest,
instead of hoping a load test hits it."""

import json

import pytest
from datasette import hookimpl
from datasette.app import Datasette
from datasette.plugins import pm

from groundkit_datasette.retrieval.permissions import Reader, ScopedCollection
from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.errors import ChunkNotFound
from groundkit_datasette.collection.ingest import ingest

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
    with an access list there, between Datasette's permission check and its query."""

    def __init__(self, corpus, index_dir):
        self.corpus, self.index_dir, self.fired = corpus, index_dir, False

    @hookimpl
    def permission_allowed(self, datasette, actor, action, resource):
        if action not in ("view-table", "execute-sql") or self.fired:
            return None

        async def inner():
            self.fired = True
            protect_solar(self.corpus)
            ingest([self.corpus], collection="energy", index_dir=self.index_dir, embedder="none")
            return None

        return inner


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
    r = await ds.client.get("/energy/chunks.json?_shape=array")
    assert r.status_code == 200 and SECRET_WORD in r.text

    plugin = PublishAfterTheCheck(corpus, index_dir)
    pm.register(plugin, name="publish-after-the-check")
    try:
        r = await ds.client.get(path)
    finally:
        pm.unregister(name="publish-after-the-check")
    assert plugin.fired
    assert SECRET_WORD not in r.text
    assert r.status_code in (400, 403, 500)
    # And afterwards the view is closed by the permission check itself.
    r = await ds.client.get("/energy/chunks.json?_shape=array")
    assert r.status_code == 403 and SECRET_WORD not in r.text


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
    r = await ds.client.get("/_memory.json?sql=select+content+from+energy.chunks&_shape=array")
    assert r.status_code == 403 and SECRET_WORD not in r.text
