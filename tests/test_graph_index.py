"""The index file's proximity graph (indexing/vector_index.py, adr/0033 "Graph index"): above
IVF_MIN_ROWS a base file also holds an HNSW graph (usearch) viewed in place in the file's
mapping. A query walks it to a shortlist and ranks the shortlist by exact cosine scores, so
what it returns is scored as exact search scores it; filters stay prefilters; deltas (small
edits) still work on a graph base; and files without a graph, or a server without usearch,
answer from the inverted file as before."""

import numpy as np
import pytest

from groundkit_datasette import registry as gk_registry
from groundkit_datasette.indexing import vector_index as vectors
from groundkit_datasette.indexing.ingest import Indexer, ingest
from groundkit_datasette.indexing.vector_index import IndexSearch
from groundkit_datasette.indexing.vector_search import VectorSearch
from groundkit_datasette.retrieval.collection import Collection

from .embedder_support import ClusteredEmbedder, embedder_plugin

DIMS = 32
CENTRES = np.random.default_rng(11).normal(size=(8, DIMS)).astype(np.float32)

Plugin = embedder_plugin("graph32", ClusteredEmbedder("graph-32", CENTRES, 0.8))


@pytest.fixture(autouse=True)
def graph_sized(monkeypatch):
    """A few hundred chunks take the large-collection path (inverted file and graph)."""
    gk_registry.pm.register(Plugin, name="graph32-test")
    monkeypatch.setattr(vectors, "IVF_MIN_ROWS", 100)
    yield
    gk_registry.pm.unregister(name="graph32-test")


def _write_corpus(corpus, files=6, entries=60, tag=""):
    corpus.mkdir(exist_ok=True)
    for f in range(files):
        (corpus / f"f{f}.txt").write_text("\n\n".join(
            f"entry {tag}{f}-{i} about thing {i * 7 % 13} " + "word " * 10 for i in range(entries)))


def _ingest(tmp_path):
    return ingest([tmp_path / "c"], collection="gi", index_dir=tmp_path / "i", embedder="graph32",
                  chunk_size=50, chunk_overlap=0)


def _open(tmp_path):
    return Collection.open("gi", index_dir=tmp_path / "i")


def _queries(n=20):
    rng = np.random.default_rng(3)
    q = CENTRES[rng.integers(len(CENTRES), size=n)] + rng.normal(size=(n, DIMS))
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def _recall(got, want):
    return len({c for c, _ in got} & {c for c, _ in want}) / max(1, len(want))


def test_a_large_base_file_holds_a_graph_and_the_query_walks_it(tmp_path):
    """The default search of a large file is the graph's (not the inverted file's), its hits
    carry exact cosine scores, and it finds what exact search finds."""
    _write_corpus(tmp_path / "c")
    _ingest(tmp_path)
    with _open(tmp_path) as col:
        header = vectors.IndexFile(col.lance_path / col.manifest["vector_index"]).header
        assert header["graph"]["engine"] == "usearch" and header["graph"]["dtype"] == vectors.GRAPH_DTYPE
        search = col.vector_search()
        assert isinstance(search, IndexSearch) and search.ivf
        exact = VectorSearch(col.vectors(), ann=False)
        recalls = []
        for q in _queries():
            got = search.search(q, 10)
            assert search.graph is not None  # the graph answered
            want = exact.search(q, 10)
            recalls.append(_recall(got, want))
            truth = dict(exact.search(q, 10**6))
            for cid, score in got:  # every score is the exact cosine of that chunk
                assert score == pytest.approx(truth[cid], abs=1e-5)
            assert [s for _, s in got] == sorted((s for _, s in got), reverse=True)
        assert np.mean(recalls) >= 0.95


def test_the_shortlist_does_not_depend_on_the_depth(tmp_path):
    """Paging: the top 10 is the first ten of the top 100 (the graph walk is the same)."""
    _write_corpus(tmp_path / "c")
    _ingest(tmp_path)
    with _open(tmp_path) as col:
        search = col.vector_search()
        for q in _queries(8):
            deep = search.search(q, vectors.GRAPH_SHORTLIST)
            for depth in (1, 5, 10, 40):
                assert search.search(q, depth) == deep[:depth]


def test_filters_stay_prefilters_on_the_graph(tmp_path, monkeypatch):
    """A deny-list never lets a hidden chunk through and still fills the depth; an allow-list
    answers exactly what exact search answers over its own rows."""
    monkeypatch.setattr(vectors, "DENY_EXACT_ROWS", 0)  # every deny-list walks the graph
    _write_corpus(tmp_path / "c")
    _ingest(tmp_path)
    with _open(tmp_path) as col:
        search = col.vector_search()
        exact = VectorSearch(col.vectors(), ann=False)
        docs = sorted(r[0] for r in col.query("SELECT document_id FROM documents"))
        hidden = set(docs[:3])
        by_chunk = dict(col.query("SELECT chunk_id, document_id FROM chunks"))
        walks = _count_walks(search, monkeypatch)
        for q in _queries(10):
            got = search.search(q, 10, docs[:3], exclude=True)
            assert len(got) == 10 and not {by_chunk[c] for c, _ in got} & hidden
            assert _recall(got, exact.search(q, 10, docs[:3], exclude=True)) >= 0.7
            got, want = search.search(q, 10, docs[3:4]), exact.search(q, 10, docs[3:4])
            assert [c for c, _ in got] == [c for c, _ in want]
            assert np.allclose([s for _, s in got], [s for _, s in want], atol=1e-5)
        assert walks and len(walks) >= 10  # the deny-lists above were answered by the graph


def _count_walks(search, monkeypatch):
    """The widths of the graph walks ``search`` takes from now on (the real walk runs)."""
    graph = search._open_graph()
    walks, walk = [], graph.shortlist

    def counted(q, count):
        walks.append(count)
        return walk(q, count)

    monkeypatch.setattr(graph, "shortlist", counted)
    return walks


def test_a_deny_list_that_leaves_few_rows_is_answered_exactly(tmp_path, monkeypatch):
    """Hiding all but one document leaves rows a walk finds only when they lie on its path
    (CI once got another top 10): they are all scored instead, exactly and with no walk, on a
    graph base and on one with a delta."""
    corpus = tmp_path / "c"
    _write_corpus(corpus)
    _ingest(tmp_path)
    for edited in (False, True):
        if edited:
            (corpus / "f2.txt").write_text("\n\n".join(f"changed line {i} " + "text " * 9 for i in range(10)))
            Indexer("gi", index_dir=tmp_path / "i", embedder="graph32", chunk_size=50,
                    chunk_overlap=0).ingest([corpus])
        with _open(tmp_path) as col:
            search = col.vector_search()
            assert (search.delta is not None) == edited
            exact = VectorSearch(col.vectors(), ann=False)
            docs = sorted(r[0] for r in col.query("SELECT document_id FROM documents"))
            walks = _count_walks(search, monkeypatch)
            for only in docs:
                hide = [d for d in docs if d != only]
                for q in _queries(20):
                    got = search.search(q, 10, hide, exclude=True)
                    want = exact.search(q, 10, [only])
                    assert [c for c, _ in got] == [c for c, _ in want]
                    assert np.allclose([s for _, s in got], [s for _, s in want], atol=1e-5)
            assert walks == []
            assert search.search(_queries(1)[0], 10) and walks  # no filter: the graph answers


def test_a_small_edit_on_a_graph_base_is_a_delta_and_deleted_chunks_never_return(tmp_path):
    """The graph is the base's; a one-file edit writes a delta (no new graph), the query walks
    the base's graph, masks the deleted rows and scores the delta's rows exactly."""
    corpus = tmp_path / "c"
    _write_corpus(corpus)
    _ingest(tmp_path)
    with _open(tmp_path) as col:
        base_name = col.manifest["vector_index"]
    (corpus / "f2.txt").write_text("\n\n".join(f"changed line {i} " + "text " * 9 for i in range(10)))
    Indexer("gi", index_dir=tmp_path / "i", embedder="graph32", chunk_size=50, chunk_overlap=0).ingest([corpus])
    with _open(tmp_path) as col:
        header = vectors.IndexFile(col.lance_path / col.manifest["vector_index"]).header
        assert header["kind"] == "delta" and header["base"] == base_name and "graph" not in header
        search = col.vector_search()
        assert search.deleted is not None and search.delta is not None
        live = {r[0] for r in col.query("SELECT chunk_id FROM chunks")}
        new = {r[0] for r in col.query(
            "SELECT c.chunk_id FROM chunks c JOIN documents d ON d.document_id = c.document_id "
            "WHERE d.source LIKE '%f2.txt'")}
        exact = VectorSearch(col.vectors(), ann=False)
        recalls = []
        for q in _queries():
            got = search.search(q, 20)
            assert search.graph is not None
            assert {c for c, _ in got} <= live  # a deleted chunk never comes back
            recalls.append(_recall(got, exact.search(q, 20)))
        assert np.mean(recalls) >= 0.9
        # The edited document's new chunks are found: the delta is scored exactly.
        vec = _vector_of(col, sorted(new)[0])
        assert search.search(vec, 1)[0][0] == sorted(new)[0]


def _vector_of(col, chunk_id):
    import pyarrow.compute as pc

    table = col.vectors().to_arrow()
    row = table.filter(pc.equal(table.column("chunk_id"), chunk_id))
    return np.asarray(row.column("vector")[0].as_py(), dtype=np.float32)


def test_without_usearch_or_without_a_graph_the_inverted_file_answers(tmp_path, monkeypatch):
    """A server without usearch, and a file written without the graph (before it existed),
    answer from the inverted file with its usual probes: the answers of the previous code."""
    _write_corpus(tmp_path / "c")
    _ingest(tmp_path)
    with _open(tmp_path) as col:
        name, version = col.manifest["vector_index"], int(col.manifest["lance_version"])
        ivf = IndexSearch(col.lance_path, name, version, graph=False)
        want = [ivf.search(q, 10) for q in _queries()]
        monkeypatch.setattr(vectors, "_usearch", lambda: None)
        plain = IndexSearch(col.lance_path, name, version)
        assert [plain.search(q, 10) for q in _queries()] == want and plain.graph is None
        # A base written without the graph (the format before it): the same file otherwise.
        table = col.vectors()
        data = table.to_arrow()
        matrix = np.stack(data.column("vector").to_numpy(zero_copy_only=False)).astype(np.float32)
        old = tmp_path / "old"
        old.mkdir()
        vectors.write_base_index(old / vectors.index_file_name(version), version,
                                 data.column("chunk_id").to_pylist(), data.column("document_id").to_pylist(),
                                 matrix, graph_index=False)
        monkeypatch.undo()
        monkeypatch.setattr(vectors, "IVF_MIN_ROWS", 100)
        legacy = IndexSearch(old, vectors.index_file_name(version), version)
        assert "graph" not in legacy.files[0].header and legacy.ivf
        assert [legacy.search(q, 10) for q in _queries()] == want
        assert legacy.graph is None
