"""Brief calls run on the event loop, slow ones in a worker thread (surfaces/inline_calls.py)."""

import asyncio
import threading
import time

import pytest

from datasette.app import Datasette

from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.surfaces import inline_calls
from groundkit_datasette.surfaces.inline_calls import InlineCalls

from .conftest import write_corpus


def where():
    return threading.get_ident()


async def test_a_brief_call_moves_to_the_loop_after_its_warm_runs_and_a_slow_one_moves_back():
    calls = InlineCalls()
    loop_thread = threading.get_ident()
    first = [await calls.run("k", where) for _ in range(inline_calls.WARM_RUNS)]
    assert loop_thread not in first  # timed in threads while the pages may be cold
    assert await calls.run("k", where) == loop_thread

    def slow():
        time.sleep(0.01)
        return where()

    assert await calls.run("k", slow) == loop_thread  # it was brief until this run said otherwise
    assert await calls.run("k", where) != loop_thread  # one slow run sends the call to threads
    for _ in range(10):  # quick runs in the thread bring it back
        await calls.run("k", where)
    assert await calls.run("k", where) == loop_thread
    assert calls.brief("k") and not calls.brief("another key")


async def test_an_error_is_raised_where_the_call_ran_and_still_counts_as_a_run():
    calls = InlineCalls()

    def fails():
        raise ValueError("no")

    for _ in range(inline_calls.WARM_RUNS + 2):
        try:
            await calls.run("k", fails)
        except ValueError:
            pass
        else:
            raise AssertionError("the error was swallowed")
    assert calls.brief("k")


@pytest.fixture
def ran_in(monkeypatch):
    """The thread each search ran in. The line is raised to 50 ms: the wiring is under test,
    not the line, which this slow machine's searches may cross."""
    from groundkit_datasette.retrieval import search as search_module

    monkeypatch.setattr(inline_calls, "BRIEF_SECONDS", 0.05)
    seen = []
    real = search_module.search_plain

    def recording(*args, **kwargs):
        seen.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(search_module, "search_plain", recording)
    return seen


async def test_bm25_searches_of_a_small_collection_run_on_the_loop_and_answer_alike(tmp_path, monkeypatch, ran_in):
    """Through a real Datasette app: the same answers whether a search ran in a thread or on
    the loop, and the loop does not wait on a search that became slow."""
    from groundkit_datasette.retrieval import search as search_module

    corpus = write_corpus(tmp_path / "corpus")
    ingest([corpus], collection="energy", index_dir=tmp_path / "index", embedder="none")
    ds = Datasette(files=[], metadata={"plugins": {"groundkit": {"index_dir": str(tmp_path / "index")}}})
    recording = search_module.search_plain
    loop_thread = threading.get_ident()
    bodies = []
    for _ in range(inline_calls.WARM_RUNS + 2):
        r = await ds.client.post("/energy/-/groundkit/search.json", json={"query": "turbines"})
        assert r.status_code == 200
        body = r.json()
        body.pop("timings_ms", None)
        body.pop("request_id", None)
        bodies.append(body)
    assert all(b == bodies[0] for b in bodies) and bodies[0]["hits"]
    assert loop_thread not in ran_in[: inline_calls.WARM_RUNS] and ran_in[-1] == loop_thread

    def slow(*args, **kwargs):
        time.sleep(0.2)
        return recording(*args, **kwargs)

    monkeypatch.setattr(search_module, "search_plain", slow)
    await ds.client.post("/energy/-/groundkit/search.json", json={"query": "turbines"})  # on the loop, once
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    task = asyncio.create_task(ticker())
    r = await ds.client.post("/energy/-/groundkit/search.json", json={"query": "turbines"})
    task.cancel()
    assert r.status_code == 200 and ran_in[-1] != loop_thread
    assert ticks >= 3  # the loop ran other work while the slow search ran in a thread


def _request(**fields):
    from groundkit_datasette.retrieval.models import SearchRequest

    return SearchRequest(**{"query": "wind turbines", "mode": "bm25", **fields})


class _Col:
    def __init__(self, embedding=None):
        self.embedding, self.path, self.identity = embedding, "/x/energy.sqlite3", ("dev", 1)


def test_only_a_bounded_bm25_shape_may_run_in_place():
    """An average says nothing about the next request: a long query, a deep or wide page, a
    filter, a model or a network mount always goes to a thread, however brief the others were."""
    from groundkit_datasette.surfaces.inline_calls import MAX_HITS, MAX_QUERY_CHARS, search_key

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


async def test_a_long_query_after_brief_ones_runs_in_a_thread_and_a_new_version_warms_again(tmp_path, ran_in):
    corpus = write_corpus(tmp_path / "corpus")
    index = tmp_path / "index"
    ingest([corpus], collection="energy", index_dir=index, embedder="none")
    ds = Datasette(files=[], metadata={"plugins": {"groundkit": {"index_dir": str(index)}}})
    loop_thread = threading.get_ident()

    async def search(query):
        r = await ds.client.post("/energy/-/groundkit/search.json", json={"query": query})
        assert r.status_code == 200
        return ran_in[-1] == loop_thread

    # The first search learns whether the sources are local; the warm runs follow, in threads.
    cold = inline_calls.WARM_RUNS + 1
    assert [await search("turbines") for _ in range(cold + 1)] == [False] * cold + [True]
    assert await search("turbines " * 10) is False  # past MAX_QUERY_CHARS
    assert await search("turbines") is True
    (corpus / "tides.md").write_text("# Tides\n\nLagoons store energy.\n")
    ingest([corpus], collection="energy", index_dir=index, embedder="none")  # a new version
    assert [await search("turbines") for _ in range(cold + 1)] == [False] * cold + [True]
