"""Bounded BM25 searches run on the event loop, every other call in a worker thread, by a
fixed rule on the request and the version (surfaces/inline_calls.py, adr/0058)."""

import asyncio
import threading
import time

import pytest

from datasette.app import Datasette

from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.surfaces.inline_calls import InlineCalls

from .conftest import write_corpus


async def test_a_call_given_a_key_runs_on_the_loop_and_its_error_is_raised_there():
    calls = InlineCalls()
    loop_thread = threading.get_ident()
    assert await calls.run("k", threading.get_ident) == loop_thread

    def fails():
        raise ValueError("no")

    with pytest.raises(ValueError):
        await calls.run("k", fails)
    assert await calls.run("k", threading.get_ident) == loop_thread  # nothing was learnt


@pytest.fixture
def ran_in(monkeypatch):
    """The thread each search ran in."""
    from groundkit_datasette.retrieval import search as search_module

    seen = []
    real = search_module.search_plain

    def recording(*args, **kwargs):
        seen.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(search_module, "search_plain", recording)
    return seen


async def test_bm25_searches_of_a_small_collection_run_on_the_loop_and_answer_alike(tmp_path, monkeypatch, ran_in):
    """Through a real Datasette app: the same answers on the loop and in a thread, and the
    loop does not wait on a search outside the bound, however slow it is."""
    from groundkit_datasette.retrieval import search as search_module

    corpus = write_corpus(tmp_path / "corpus")
    ingest([corpus], collection="energy", index_dir=tmp_path / "index", embedder="none")
    ds = Datasette(files=[], metadata={"plugins": {"groundkit": {"index_dir": str(tmp_path / "index")}}})
    recording = search_module.search_plain
    loop_thread = threading.get_ident()
    bodies = []
    # The first search learns whether the sources are local (the reader's check), then
    # every search of this shape runs on the loop.
    for _ in range(5):
        r = await ds.client.post("/energy/-/groundkit/search.json", json={"query": "turbines"})
        assert r.status_code == 200
        body = r.json()
        body.pop("timings_ms", None)
        body.pop("request_id", None)
        bodies.append(body)
    assert all(b == bodies[0] for b in bodies) and bodies[0]["hits"]
    assert ran_in[1:] == [loop_thread] * 4
    r = await ds.client.post("/energy/-/groundkit/search.json", json={"query": "turbines", "top_k": 21})
    assert ran_in[-1] != loop_thread
    in_thread = r.json()
    assert in_thread["hits"][: len(bodies[0]["hits"])] == bodies[0]["hits"]

    def slow(*args, **kwargs):
        time.sleep(0.2)
        return recording(*args, **kwargs)

    monkeypatch.setattr(search_module, "search_plain", slow)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    task = asyncio.create_task(ticker())
    r = await ds.client.post("/energy/-/groundkit/search.json", json={"query": "turbines " * 10})
    task.cancel()
    assert r.status_code == 200 and ran_in[-1] != loop_thread
    assert ticks >= 3  # the loop ran other work while the slow search ran in a thread


def _request(**fields):
    from groundkit_datasette.retrieval.models import SearchRequest

    return SearchRequest(**{"query": "wind turbines", "mode": "bm25", **fields})


class _Identity:
    def __init__(self, size):
        self.size = size


class _Col:
    def __init__(self, embedding=None, size=1 << 20):
        self.embedding, self.path, self.identity = embedding, "/x/energy.sqlite3", _Identity(size)


def test_only_a_bounded_bm25_shape_of_a_bounded_file_runs_in_place():
    """A long query, a deep or wide page, a filter, a model, a network mount or a large
    collection file always goes to a thread."""
    from groundkit_datasette.surfaces.inline_calls import MAX_FILE_BYTES, MAX_HITS, MAX_QUERY_CHARS, search_key

    col = _Col()
    assert search_key(col, _request(), True) is not None
    assert search_key(col, _request(mode=None), True) is not None  # auto is BM25 without vectors
    refused = [
        _request(query="w" * (MAX_QUERY_CHARS + 1)), _request(top_k=MAX_HITS + 1), _request(offset=10),
        _request(source="notes/*"), _request(document_id="d_0123456789abcdef0123"),
        _request(group_by_document=True), _request(rerank=True), _request(mode="dense"),
        _request(mode="hybrid"),
    ]
    assert [search_key(col, r, True) for r in refused] == [None] * len(refused)
    assert search_key(col, _request(), False) is None  # source checks on a network mount
    assert search_key(_Col(embedding=object()), _request(mode=None), True) is None  # auto is hybrid
    assert search_key(_Col(size=MAX_FILE_BYTES + 1), _request(), True) is None
    assert search_key(_Col(size=MAX_FILE_BYTES), _request(), True) is not None


async def test_where_a_search_runs_does_not_depend_on_what_ran_before(tmp_path, ran_in):
    corpus = write_corpus(tmp_path / "corpus")
    index = tmp_path / "index"
    ingest([corpus], collection="energy", index_dir=index, embedder="none")
    ds = Datasette(files=[], metadata={"plugins": {"groundkit": {"index_dir": str(index)}}})
    loop_thread = threading.get_ident()

    async def search(query):
        r = await ds.client.post("/energy/-/groundkit/search.json", json={"query": query})
        assert r.status_code == 200
        return ran_in[-1] == loop_thread

    await search("turbines")  # the reader learns whether the sources are local
    assert [await search("turbines") for _ in range(3)] == [True] * 3
    assert await search("turbines " * 10) is False  # past MAX_QUERY_CHARS
    assert await search("turbines") is True
    (corpus / "tides.md").write_text("# Tides\n\nLagoons store energy.\n")
    ingest([corpus], collection="energy", index_dir=index, embedder="none")  # a new version
    await search("turbines")
    assert [await search("turbines") for _ in range(3)] == [True] * 3
