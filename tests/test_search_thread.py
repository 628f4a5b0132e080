"""Every search runs in a worker thread, whatever its shape and whatever ran before
(adr/0058, which replaced adr/0044's event-loop placement)."""

import asyncio
import threading
import time

from datasette.app import Datasette

from groundkit_datasette.indexing.ingest import ingest

from .conftest import write_corpus


async def test_every_search_runs_in_a_thread_and_the_loop_runs_other_work_meanwhile(tmp_path, monkeypatch):
    from groundkit_datasette.retrieval import search as search_module

    corpus = write_corpus(tmp_path / "corpus")
    ingest([corpus], collection="energy", index_dir=tmp_path / "index", embedder="none")
    ds = Datasette(files=[], metadata={"plugins": {"groundkit": {"index_dir": str(tmp_path / "index")}}})
    loop_thread = threading.get_ident()
    ran_in = []
    real = search_module.search_plain

    def recording(*args, **kwargs):
        ran_in.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(search_module, "search_plain", recording)
    bodies = []
    for _ in range(5):  # the short BM25 shape adr/0044 once ran on the loop
        r = await ds.client.post("/energy/-/groundkit/search.json", json={"query": "turbines"})
        assert r.status_code == 200
        body = r.json()
        body.pop("timings_ms", None)
        body.pop("request_id", None)
        bodies.append(body)
    assert all(b == bodies[0] for b in bodies) and bodies[0]["hits"]
    assert len(ran_in) == 5 and loop_thread not in ran_in

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
    r = await ds.client.post("/energy/-/groundkit/search.json", json={"query": "turbines"})
    task.cancel()
    assert r.status_code == 200 and ran_in[-1] != loop_thread
    assert ticks >= 3  # the loop ran other work while the slow search ran in a thread
