"""A process forked from one whose searches already kept ``stat`` answers (a server that
opens its collections, then forks workers) must still see an edit made after the fork on its
very next search. The child's new inotify watcher watches nothing yet, so the answers it
inherited must not pass for answers of its own epochs. Real files, real inotify, a real
fresh interpreter that forks (so the parent's epoch is the first one, as in a new server)."""

import json
import os
import subprocess
import sys

from groundkit_datasette.indexing.ingest import ingest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SCRIPT = """
import json, os, sys
sys.path.insert(0, {root!r})
from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.retrieval import stale

def flags(col):
    return {{h.source: h.source_changed for h in col.search(query="osprey", mode="bm25").hits}}

col = Collection.open("hawks", index_dir={index!r}, base_dir={corpus!r})
seen = {{"watcher": stale._watcher() is not None, "parent": flags(col), "again": flags(col)}}
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        with open({low!r}, "a") as f:
            f.write("More notes.\\n")
        os.write(write, json.dumps(flags(col)).encode())
    finally:
        os._exit(0)
os.close(write)
os.waitpid(pid, 0)
seen["child after edit"] = json.loads(os.read(read, 65536))
seen["parent after edit"] = flags(col)
print(json.dumps(seen))
"""


def test_a_forked_child_sees_an_edit_made_after_the_fork(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "top.txt").write_text("Osprey top notes.\n\nosprey fishing\n")
    (corpus / "low.txt").write_text("Osprey low notes.\n\nosprey dive\n")
    index_dir = tmp_path / "index"
    ingest([corpus], collection="hawks", index_dir=index_dir, embedder="none")
    code = _SCRIPT.format(root=ROOT, index=str(index_dir), corpus=str(corpus), low=str(corpus / "low.txt"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout)
    assert seen["watcher"] is True, "inotify is available on the test machines (Linux)"
    fresh = {"top.txt": False, "low.txt": False}
    assert seen["parent"] == seen["again"] == fresh
    assert seen["child after edit"] == {"top.txt": False, "low.txt": True}
    assert seen["parent after edit"] == {"top.txt": False, "low.txt": True}
