"""The ANN index is kept current without retraining it for each run (issue 14,
adr/0030-postings-and-index-upkeep.md): a small change leaves it alone (new rows are scanned
exactly), a larger one is added into the trained partitions, and growth past
ANN_RETRAIN_GROWTH trains it again."""


from groundkit_datasette.indexing import vectors as vectors_module
from groundkit_datasette.indexing.ingest import Indexer
from groundkit_datasette.retrieval.collection import Collection

from tests.test_ann import EMBEDDER, clustered  # noqa: F401  (the fixture)


def _write(corpus, name, records, tag):
    corpus.mkdir(exist_ok=True)
    (corpus / name).write_text("\n\n".join(f"record {tag}-{i} of {name}" for i in range(records)))


def _ingest(corpus, index_dir):
    indexer = Indexer("vec", index_dir=index_dir, base_dir=corpus, embedder="clustered", chunk_size=50,
                      chunk_overlap=0, ann_threshold=500)
    report = indexer.ingest([corpus])
    return indexer, report


def _index(index_dir):
    with Collection.open("vec", index_dir=index_dir) as col:
        table = col.vectors()
        config = table.list_indices()[0]
        return config.index_uuid, table.index_stats(config.name), col.query(
            "SELECT value FROM groundkit_manifest WHERE key = 'ann_trained_rows'")[0][0]


def _found(index_dir, source):
    """Whether dense search returns a chunk of ``source`` first for that chunk's own vector."""
    with Collection.open("vec", index_dir=index_dir) as col:
        chunk_id, text = col.query(
            "SELECT c.chunk_id, c.content FROM chunks c JOIN documents d USING (document_id) "
            "WHERE d.source = ? ORDER BY c.chunk_index LIMIT 1 OFFSET 5", (source,))[0]
        vector = EMBEDDER.embed([text])[0]
        return col.search(query="x", mode="dense", vector=vector.tolist(), top_k=1).hits[0].chunk_id == chunk_id


def test_the_ann_index_is_kept_updated_or_retrained_by_how_much_changed(tmp_path, clustered, monkeypatch):
    corpus, index_dir = tmp_path / "c", tmp_path / "index"
    for f in range(15):
        _write(corpus, f"f{f:02d}.txt", 200, "a")
    indexer, report = _ingest(corpus, index_dir)
    assert indexer.ann_action == "trained" and report.chunks_embedded > 1000
    uuid, stats, trained = _index(index_dir)
    rows = stats.num_indexed_rows
    assert int(trained) == rows and stats.num_unindexed_rows == 0

    # One file edited: its new chunks are embedded, the trained index is left as it is, and
    # dense search already finds the new chunk (rows outside the index are scanned exactly).
    old_reader = Collection.open("vec", index_dir=index_dir)
    def answer():
        return [(h.chunk_id, h.score) for h in
                old_reader.search(query="record a-3 of f03.txt", mode="dense", top_k=3).hits]

    old_answer = answer()
    _write(corpus, "f03.txt", 200, "b")
    indexer, report = _ingest(corpus, index_dir)
    assert indexer.ann_action == "kept" and report.updated == 1 and 0 < report.chunks_embedded <= 200
    uuid2, stats2, trained2 = _index(index_dir)
    assert uuid2 == uuid and stats2.num_unindexed_rows == report.chunks_embedded and trained2 == trained
    assert _found(index_dir, "f03.txt")
    # A reader of the previous version keeps its answers.
    assert answer() == old_answer  # (its hits now say source_changed: the file did)
    old_reader.close()

    # Past the unindexed allowance, the new rows join the trained index without retraining it.
    monkeypatch.setattr(vectors_module, "ANN_UNINDEXED_ROWS", 50)
    monkeypatch.setattr(vectors_module, "ANN_UNINDEXED_FRACTION", 0.0)
    _write(corpus, "g00.txt", 300, "c")
    indexer, report = _ingest(corpus, index_dir)
    assert indexer.ann_action == "updated"
    _uuid3, stats3, trained3 = _index(index_dir)
    assert stats3.num_unindexed_rows == 0 and trained3 == trained
    assert stats3.num_indices > 1  # a delta beside the trained segment: no new training
    assert _found(index_dir, "g00.txt")

    # Grown past ANN_RETRAIN_GROWTH times the rows it was trained on: trained again.
    for f in range(8):
        _write(corpus, f"h{f:02d}.txt", 200, "d")
    indexer, report = _ingest(corpus, index_dir)
    assert indexer.ann_action == "trained"
    _uuid4, stats4, trained4 = _index(index_dir)
    assert int(trained4) >= vectors_module.ANN_RETRAIN_GROWTH * rows
    assert stats4.num_unindexed_rows == 0 and stats4.num_indices == 1
