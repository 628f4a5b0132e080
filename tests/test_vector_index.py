"""The memory-mapped vector index file (indexing/vector_index.py ``IndexSearch``): written by
ingest beside the LanceDB table it copies, named by the collection's manifest, opened by a
query process without lancedb. It must answer what exact search over LanceDB's vectors
answers, follow every re-ingest (small edits as a delta), never be written by a read, and
be optional: a collection from before it still answers, and gets one on its next ingest."""

import os
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from groundkit_datasette import registry as gk_registry
from groundkit_datasette.indexing import vector_index, vectors
from groundkit_datasette.indexing.ingest import Indexer, ingest
from groundkit_datasette.indexing.vector_index import IndexSearch
from groundkit_datasette.indexing.vector_search import VectorSearch
from groundkit_datasette.retrieval.collection import Collection

from .embedder_support import ClusteredEmbedder, embedder_plugin

DIMS = 24
CENTRES = np.random.default_rng(5).normal(size=(6, DIMS)).astype(np.float32)

Plugin = embedder_plugin("topics24", ClusteredEmbedder("topics-24", CENTRES, 0.7))


@pytest.fixture(autouse=True)
def topics():
    gk_registry.pm.register(Plugin, name="topics24-test")
    yield
    gk_registry.pm.unregister(name="topics24-test")


def _write_corpus(corpus, files=5, entries=50, tag=""):
    corpus.mkdir(exist_ok=True)
    for f in range(files):
        (corpus / f"f{f}.txt").write_text("\n\n".join(
            f"entry {tag}{f}-{i} about thing {i * 7 % 11} " + "word " * 10 for i in range(entries)))


def _ingest(tmp_path, **kw):
    return ingest([tmp_path / "c"], collection="vi", index_dir=tmp_path / "i", embedder="topics24",
                  chunk_size=50, chunk_overlap=0, **kw)


def _open(tmp_path):
    return Collection.open("vi", index_dir=tmp_path / "i")


def _queries(n=15):
    rng = np.random.default_rng(9)
    q = CENTRES[rng.integers(len(CENTRES), size=n)] + rng.normal(size=(n, DIMS))
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def _same_as_exact(col, search, depth=10):
    """Every query answers the chunks, order and scores of exact numpy search over the
    table LanceDB holds at the published version."""
    exact = VectorSearch(col.vectors(), ann=False)
    assert exact.exact
    docs = sorted(r[0] for r in col.query("SELECT document_id FROM documents"))
    for q in _queries():
        for kw in ({}, {"documents": docs[:2]}, {"documents": docs[:1], "exclude": True}):
            got = search.search(q, depth, **kw)
            want = exact.search(q, depth, **kw)
            assert [c for c, _ in got] == [c for c, _ in want], kw
            assert np.allclose([s for _, s in got], [s for _, s in want], atol=1e-5)


def _tree(root):
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            st = os.stat(p)
            out[p] = (st.st_size, st.st_mtime_ns)
    return out


def test_ingest_publishes_an_index_file_that_answers_as_exact_search(tmp_path):
    """Flat (small) index: the query side opens it, and it ranks exactly as numpy over LanceDB."""
    _write_corpus(tmp_path / "c")
    _ingest(tmp_path)
    with _open(tmp_path) as col:
        name = col.manifest["vector_index"]
        assert name == f"_groundkit/v{col.manifest['lance_version']}.gkv"
        assert (col.lance_path / name).is_file()
        search = col.vector_search()
        assert isinstance(search, IndexSearch) and not search.ivf
        assert search.rows == col.vectors().count_rows() == col.vector_count()
        _same_as_exact(col, search)


def test_inverted_file_probing_every_list_is_exact_and_default_probing_finds_most(tmp_path, monkeypatch):
    """Above IVF_MIN_ROWS the file is an inverted file; probing all lists is exact search,
    and the default probe count still finds nearly all of the true top 10."""
    monkeypatch.setattr(vector_index, "IVF_MIN_ROWS", 100)
    _write_corpus(tmp_path / "c")
    _ingest(tmp_path)
    with _open(tmp_path) as col:
        search = col.vector_search()
        assert isinstance(search, IndexSearch) and search.ivf
        lists = search.base.centroids.shape[0]
        assert 2 < lists < search.rows
        everything = IndexSearch(col.lance_path, col.manifest["vector_index"],
                                 int(col.manifest["lance_version"]), nprobe=lists)
        _same_as_exact(col, everything)
        exact = VectorSearch(col.vectors(), ann=False)
        few = IndexSearch(col.lance_path, col.manifest["vector_index"],
                          int(col.manifest["lance_version"]), nprobe=max(1, lists // 3))
        recall = np.mean([len({c for c, _ in few.search(q, 10)} & {c for c, _ in exact.search(q, 10)}) / 10
                          for q in _queries()])
        assert recall >= 0.6


def test_index_follows_small_edits_as_a_delta_and_large_ones_as_a_rebuild(tmp_path, monkeypatch):
    """A one-file edit writes a delta on the previous base (not a copy of every vector);
    edits pile up in deltas until they pass the limit; every version answers as exact."""
    monkeypatch.setattr(vector_index, "IVF_MIN_ROWS", 100)
    corpus = tmp_path / "c"
    _write_corpus(corpus)
    _ingest(tmp_path)
    with _open(tmp_path) as col:
        first_base = col.manifest["vector_index"]
    for step in range(2):
        (corpus / "f1.txt").write_text("\n\n".join(f"edited {step} line {i} " + "text " * 9 for i in range(8)))
        indexer = Indexer("vi", index_dir=tmp_path / "i", embedder="topics24", chunk_size=50, chunk_overlap=0)
        indexer.ingest([corpus])
        with _open(tmp_path) as col:
            search = col.vector_search()
            assert search.delta is not None and search.deleted is not None
            header = vector_index.IndexFile(col.lance_path / col.manifest["vector_index"]).header
            assert header["kind"] == "delta" and header["base"] == first_base
            removed = {r[0] for r in col.query("SELECT chunk_id FROM chunks")}
            assert search.rows == col.vectors().count_rows()
            found = {c for q in _queries() for c, _ in search.search(q, 50)}
            assert found <= removed  # a deleted chunk never comes back
            everything = IndexSearch(col.lance_path, col.manifest["vector_index"],
                                     int(col.manifest["lance_version"]), nprobe=10**6)
            _same_as_exact(col, everything)
    # A change larger than the delta limit writes a new base file.
    monkeypatch.setattr(vectors, "INDEX_DELTA_ROWS", 5)
    monkeypatch.setattr(vectors, "INDEX_DELTA_FRACTION", 0.0)
    _write_corpus(corpus, tag="new")
    _ingest(tmp_path)
    with _open(tmp_path) as col:
        header = vector_index.IndexFile(col.lance_path / col.manifest["vector_index"]).header
        assert header["kind"] == "base"
        _same_as_exact(col, IndexSearch(col.lance_path, col.manifest["vector_index"],
                                        int(col.manifest["lance_version"]), nprobe=10**6))
        kept = {p.name for p in (col.lance_path / "_groundkit").iterdir()}
        assert first_base.split("/")[1] not in kept or len(kept) <= 3


def test_a_read_writes_nothing_and_never_imports_lancedb(tmp_path):
    """Searching (dense, hybrid, filtered) leaves every file as it was, and a fresh process
    answers a dense query from the index file without importing lancedb."""
    _write_corpus(tmp_path / "c")
    _ingest(tmp_path)
    before = _tree(tmp_path / "i")
    with _open(tmp_path) as col:
        for mode in ("dense", "hybrid"):
            col.search(query="thing 3 entry", mode=mode, top_k=5)
        col.status()
    assert _tree(tmp_path / "i") == before
    code = f"""
import sys
sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
from groundkit_datasette import registry
from tests import test_vector_index as t
registry.pm.register(t.Plugin, name="t")
from groundkit_datasette.retrieval.collection import Collection
col = Collection.open("vi", index_dir={str(tmp_path / "i")!r})
r = col.search(query="thing 3 entry", mode="hybrid", top_k=5)
assert r.hits, r
print("lancedb" in sys.modules, "pyarrow" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    assert _tree(tmp_path / "i") == before


def _forget_index(tmp_path):
    """Make the collection look as one ingested before the index file existed."""
    path = tmp_path / "i" / "vi.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM groundkit_manifest WHERE key = 'vector_index'")
    conn.commit()
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    for f in (tmp_path / "i" / "vi.lance" / "_groundkit").iterdir():
        f.unlink()


def test_a_collection_without_the_file_answers_from_lancedb_and_gets_one_on_next_ingest(tmp_path):
    _write_corpus(tmp_path / "c")
    _ingest(tmp_path)
    with _open(tmp_path) as col:
        want = [c for c, _ in col.vector_search().search(_queries()[0], 10)]
    _forget_index(tmp_path)
    with _open(tmp_path) as col:
        search = col.vector_search()
        assert isinstance(search, VectorSearch)  # LanceDB, the store of record
        assert [c for c, _ in search.search(_queries()[0], 10)] == want
        generation = col.generation
    report = _ingest(tmp_path)  # no file changed
    assert report.published
    with _open(tmp_path) as col:
        assert col.generation == generation + 1
        assert isinstance(col.vector_search(), IndexSearch)
        assert [c for c, _ in col.vector_search().search(_queries()[0], 10)] == want
    report = _ingest(tmp_path)  # and then nothing more to do
    assert not report.published


def test_an_unreadable_index_file_falls_back_to_lancedb(tmp_path):
    """A damaged or missing file (not the manifest's version) never breaks a search."""
    _write_corpus(tmp_path / "c")
    _ingest(tmp_path)
    with _open(tmp_path) as col:
        path = col.lance_path / col.manifest["vector_index"]
        want = [c for c, _ in col.vector_search().search(_queries()[1], 10)]
    path.write_bytes(b"garbage" * 10)
    with _open(tmp_path) as col:
        assert isinstance(col.vector_search(), VectorSearch)
        assert [c for c, _ in col.vector_search().search(_queries()[1], 10)] == want
        assert col.search(query="thing", mode="dense", top_k=3).hits


def test_index_file_names_outside_the_folder_are_refused(tmp_path):
    with pytest.raises(ValueError):
        IndexSearch(tmp_path, "../../etc/passwd", 1)
    with pytest.raises(ValueError):
        IndexSearch(tmp_path, "_groundkit/v1.gkv/../../x", 1)
