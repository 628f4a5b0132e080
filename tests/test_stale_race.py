"""Two searches of one open collection at once, a file edited between them: the answer a
search keeps for a hit row is the one its own ``stat`` gave, tagged with that stat's epoch.
Tagging it with the epoch of a newer stat (another thread's, after the edit) made an edited
file read ``source_changed`` False on every later search until the next event or the
recheck. Real files, real inotify, real threads; a spy on ``os.lstat`` (the calls still run)
only chooses the moment the second search runs."""

import os
import threading

import pytest

from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.retrieval import stale
from groundkit_datasette.retrieval.collection import Collection


def flags(col):
    return {h.source: h.source_changed for h in col.search(query="osprey", mode="bm25", top_k=5).hits}


def test_an_answer_is_kept_with_the_epoch_of_its_own_stat(tmp_path, monkeypatch):
    if stale._watcher() is None:
        pytest.fail("inotify is available on the test machines (Linux)")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "first.txt").write_text("Osprey osprey osprey notes.\n")
    (corpus / "second.txt").write_text("Osprey notes and other birds, and more words here.\n")
    ingest([corpus], collection="hawks", index_dir=tmp_path / "index", embedder="none")
    first, second = (os.path.join(os.path.realpath(corpus), n) for n in ("first.txt", "second.txt"))
    with Collection.open("hawks", index_dir=tmp_path / "index", base_dir=corpus) as col:
        assert list(col.search(query="osprey", mode="bm25").hits[i].source for i in (0, 1)) == [
            "first.txt", "second.txt"]  # a search stats first.txt, then second.txt
        other = {}
        real = os.lstat
        armed = [True]

        def lstat(path, *a, **kw):
            if path == second and armed[0]:  # the first search has statted first.txt
                armed[0] = False
                with open(first, "a") as f:
                    f.write("Edited while the first search runs.\n")
                t = threading.Thread(target=lambda: other.update(flags(col)))
                t.start()
                t.join()
            return real(path, *a, **kw)

        monkeypatch.setattr(stale.os, "lstat", lstat)
        (corpus / ".scratch").write_text("")  # an event: the next search stats both again
        racing = flags(col)
        assert other == {"first.txt": True, "second.txt": False}  # it ran after the edit
        assert racing["second.txt"] is False  # (first.txt: either answer, the edit raced it)
        assert flags(col) == {"first.txt": True, "second.txt": False}
        assert flags(col) == {"first.txt": True, "second.txt": False}
