"""Datasette's own pages follow a re-ingest (adr/0010, adr/0053): each published version is
its own Database, swapped in before a request is routed; on both Datasette lines."""

import asyncio
import sqlite3
import time
import types

import pytest
from datasette.app import Datasette
from datasette.database import Database

from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.datasette_plugin import live_database
from groundkit_datasette.surfaces.datasette_compat import CollectionVersion


def serve(*immutables):
    # Three SQL threads (Datasette's default), each keeping its own connection per database.
    return Datasette(files=[], immutables=[str(p) for p in immutables],
                     settings={"num_sql_threads": 3})


async def page_counts(ds):
    tables = (await ds.client.get("/energy.json")).json()["tables"]
    return {t["name"]: t["count"] for t in tables if t["name"] in ("documents", "chunks")}


async def per_thread_answers(db, sql):
    """Run ``sql`` once on each SQL thread: the sleeps keep all three busy at once."""
    import threading

    def fn(conn):
        time.sleep(0.1)
        return threading.get_ident(), conn.execute(sql).fetchone()[0]

    answers = await asyncio.gather(*[db.execute_fn(fn) for _ in range(6)])
    assert len({ident for ident, _ in answers}) == 3  # every thread answered
    return {value for _, value in answers}


async def test_datasette_pages_follow_a_reingest_on_every_thread(corpus, index_dir, monkeypatch):
    monkeypatch.setattr(live_database, "GRACE_SECONDS", 0)
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    path = index_dir / "energy.sqlite3"
    ds = serve(path)
    r = await ds.client.get("/energy/chunks.json?_search=flywheels&_shape=array")
    assert r.status_code == 200 and r.json() == []
    old = ds.get_database("energy")
    assert isinstance(old, CollectionVersion)
    before = await per_thread_answers(old, "SELECT count(*) FROM documents")
    assert before == {4}
    before_counts = await page_counts(ds)
    assert before_counts["documents"] == 4 and before_counts["chunks"] >= 4

    (corpus / "tides.md").write_text("# Tides\n\nFlywheels and lagoons store energy.\n")
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")

    # Every thread had a connection to the replaced file; the next request serves the new
    # version, on which each thread reads the new file.
    responses = await asyncio.gather(
        *[ds.client.get("/energy/chunks.json?_search=flywheels&_shape=array") for _ in range(6)]
    )
    assert all(len(r.json()) == 1 for r in responses)
    new = ds.get_database("energy")
    assert new is not old and (new.name, new.route) == ("energy", "energy")
    assert await per_thread_answers(new, "SELECT count(*) FROM documents") == {5}
    # The counts are the new version's, counted without the page's 10 ms limit.
    # tides.md is one short paragraph: one more document, one more chunk.
    assert await page_counts(ds) == {"documents": 5, "chunks": before_counts["chunks"] + 1}
    # The replaced version is closed once its grace period is over.
    assert await asyncio.to_thread(old.closed.wait, 60)


async def test_other_databases_are_left_alone_and_nothing_is_created(corpus, index_dir, tmp_path):
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    plain = tmp_path / "plain.db"
    conn = sqlite3.connect(plain)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    path = index_dir / "energy.sqlite3"
    ds = serve(path, plain)
    assert (await ds.client.get("/plain.json")).status_code == 200
    assert type(ds.get_database("plain")) is Database
    assert isinstance(ds.get_database("energy"), CollectionVersion)
    # Swapped in place: the order Datasette lists databases in is kept.
    assert [n for n in ds.databases if not n.startswith("_")] == ["energy", "plain"]

    # A collection deleted while served: its pages answer 404, and reading never creates
    # an empty file in its place.
    path.unlink()
    assert (await ds.client.get("/energy/documents.json")).status_code == 404
    await asyncio.gather(*[ds.client.get("/energy/chunks.json") for _ in range(6)])
    assert not path.exists()
    assert (await ds.client.get("/plain.json")).status_code == 200
    # Published again, it is served again.
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    assert (await page_counts(ds))["documents"] == 4


def test_a_version_whose_file_is_gone_never_creates_one(corpus, index_dir):
    """A thread's first connection to a version whose file was deleted meanwhile is an
    error, not a new empty file (SQLite's immutable=1 alone would create one)."""
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    path = index_dir / "energy.sqlite3"
    version = CollectionVersion(Datasette(), path)
    path.unlink()
    with pytest.raises(sqlite3.OperationalError):
        version.connect()
    assert not path.exists()


async def test_a_positional_collection_is_served_immutable_and_follows_a_reingest(corpus, index_dir):
    """``datasette energy.sqlite3`` (no -i) opens the file mutable; a collection, recognised
    by its application id, is served like ``-i`` all the same, and its pages see a re-ingest."""
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    path = index_dir / "energy.sqlite3"
    for ds in (Datasette(files=[str(path)]), Datasette(immutables=[str(path)])):
        assert (await page_counts(ds))["documents"] == 4
        db = ds.get_database("energy")
        assert isinstance(db, CollectionVersion) and not db.is_mutable
    (corpus / "tides.md").write_text("# Tides\n\nFlywheels and lagoons store energy.\n")
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    for ds in (Datasette(files=[str(path)]), Datasette(immutables=[str(path)])):
        assert (await page_counts(ds))["documents"] == 5


async def test_one_server_opened_without_i_sees_the_reingest(corpus, index_dir):
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    path = index_dir / "energy.sqlite3"
    ds = Datasette(files=[str(path)], settings={"num_sql_threads": 3})
    assert (await page_counts(ds))["documents"] == 4
    before = await per_thread_answers(ds.get_database("energy"), "SELECT count(*) FROM documents")
    assert before == {4}
    (corpus / "tides.md").write_text("# Tides\n\nFlywheels and lagoons store energy.\n")
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    assert (await page_counts(ds))["documents"] == 5
    after = await per_thread_answers(ds.get_database("energy"), "SELECT count(*) FROM documents")
    assert after == {5}
    r = await ds.client.get("/energy/chunks.json?_search=flywheels&_shape=array")
    assert len(r.json()) == 1


async def test_a_file_that_stops_being_a_collection_is_not_searched_from_the_open_copy(corpus, index_dir):
    """The search API keeps the collection it opened while the file at the path is the same
    one; once another file (not a collection) is moved there, it answers not found."""
    import os

    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    path = index_dir / "energy.sqlite3"
    ds = serve(path)
    url, body = "/energy/-/groundkit/search.json", {"query": "turbines"}
    r = await ds.client.post(url, json=body)
    assert r.status_code == 200 and r.json()["hits"]
    other = index_dir / "other.sqlite3"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    os.replace(other, path)
    r = await ds.client.post(url, json=body)
    assert r.status_code == 404 and r.json()["error"] == "collection_not_found"


async def test_a_versions_connections_are_prepared_by_datasette_on_each_line(corpus, index_dir):
    """1.0 keeps read connections per Database object itself; on 0.65 ``CollectionVersion``
    keeps them per version through its one private call (adr/0059). Either way each is
    prepared as Datasette prepares its own: rows as ``sqlite3.Row`` and every plugin's
    ``prepare_connection`` hook."""
    from datasette import hookimpl
    from datasette.plugins import pm

    from groundkit_datasette.surfaces.datasette_compat import DATASETTE_1

    @hookimpl
    def prepare_connection(conn):
        conn.create_function("groundkit_test_prepared", 0, lambda: 1)

    assert ("execute_fn" in vars(CollectionVersion)) is (not DATASETTE_1)
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    plugin = types.ModuleType("groundkit_test_prepared")  # a plugin as Datasette lists one
    plugin.prepare_connection = prepare_connection
    pm.register(plugin, name="groundkit_test_prepared")
    try:
        ds = serve(index_dir / "energy.sqlite3")
        await ds.invoke_startup()
        db = ds.get_database("energy")
        assert isinstance(db, CollectionVersion)
        assert await per_thread_answers(db, "SELECT groundkit_test_prepared()") == {1}
        rows = await db.execute_fn(lambda conn: conn.execute("SELECT 1 AS one").fetchall())
        assert isinstance(rows[0], sqlite3.Row) and rows[0]["one"] == 1
    finally:
        pm.unregister(plugin)
