"""A one-file edit costs what changed (issue 14, adr/0034-one-file-edit-cost.md): the run
starts from a spare copy of the published file instead of copying it, reads only the documents
and vector ids it touches, and keeps the BM25 token total in the manifest. None of that may
change what is stored, nor what a reader of an older version sees."""

import hashlib
from array import array
import os
import shutil
import sqlite3

from groundkit_datasette.indexing import schema
from groundkit_datasette.indexing import vectors as vectors_module
from groundkit_datasette.indexing.ingest import Indexer

from tests.test_ann import clustered  # noqa: F401  (the fixture)


def _write(corpus, count=12, tag="a"):
    corpus.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (corpus / "sub" if i % 2 else corpus).mkdir(exist_ok=True)
        target = (corpus / "sub" if i % 2 else corpus) / f"doc{i:02d}.txt"
        target.write_text("\n\n".join(f"paragraph {j} of document {i} {tag}: river glacier w{i * j % 17}"
                                      for j in range(6)) + "\n")


def _indexer(corpus, index_dir, **kw):
    return Indexer("ed", index_dir=index_dir, base_dir=corpus, embedder="clustered", chunk_size=60,
                   chunk_overlap=0, **kw)


def _spares(index_dir):
    return sorted(p.name for p in index_dir.iterdir() if ".sqlite3.spare-" in p.name)


def _stored(index_dir):
    """What a collection stores, without what differs between runs by design (row ids,
    generations, timestamps, the run's report)."""
    conn = schema.connect_readonly(index_dir / "ed.sqlite3")
    try:
        docs = conn.execute("SELECT source, document_id, file_hash, content_hash, chunk_count, acl "
                            "FROM documents ORDER BY source").fetchall()
        # Term ids are numbered in the order a collection met its terms: compare the terms.
        vocab = dict(conn.execute("SELECT term_id, term FROM bm25_vocab"))
        chunks = [(*row[:-3], row[-3], sorted(zip((vocab[t] for t in array("i", row[-2])), array("i", row[-1]))))
                  for row in conn.execute(
                      "SELECT c.chunk_id, c.document_id, c.chunk_index, c.start_offset, c.end_offset, "
                      "c.heading, c.content, t.length, t.term_ids, t.term_freqs FROM chunks c "
                      "JOIN bm25_chunk_terms t ON t.id = c.id ORDER BY c.chunk_id")]
        terms = conn.execute("SELECT v.term, v.doc_freq FROM bm25_vocab v ORDER BY v.term").fetchall()
        length = conn.execute("SELECT value FROM groundkit_manifest WHERE key = 'bm25_length'").fetchone()
        total = conn.execute("SELECT sum(length) FROM bm25_chunk_terms").fetchone()[0]
        version = int(conn.execute("SELECT value FROM groundkit_manifest WHERE key = 'lance_version'").fetchone()[0])
    finally:
        conn.close()
    table = vectors_module.open_table(index_dir / "ed.lance", version)
    data = table.to_arrow().select(["chunk_id", "document_id"])
    vectors = sorted(zip(data.column("chunk_id").to_pylist(), data.column("document_id").to_pylist()))
    return {"documents": docs, "chunks": chunks, "terms": terms, "length": (length[0], total),
            "vectors": vectors}


def _edit(corpus):
    (corpus / "doc00.txt").write_text("An edited document about a harbour and a ferry.\n\nglacier\n")
    (corpus / "sub" / "doc03.txt").unlink()
    (corpus / "sub" / "new.txt").write_text("A new document: aurora over the river.\n")


def test_an_incremental_edit_stores_what_a_fresh_ingest_stores(tmp_path, clustered):
    """Documents, chunks, term rows, df, vectors and the recorded token total are those of a
    fresh ingest of the same files, although the run read only what it touched."""
    corpus = tmp_path / "c"
    _write(corpus)
    _indexer(corpus, tmp_path / "index").ingest([corpus])
    _edit(corpus)
    report = _indexer(corpus, tmp_path / "index").ingest([corpus / "doc00.txt", corpus / "sub"])
    assert (report.added, report.updated, report.removed) == (1, 1, 1)
    _indexer(corpus, tmp_path / "fresh").ingest([corpus])
    ours, fresh = _stored(tmp_path / "index"), _stored(tmp_path / "fresh")
    assert ours == fresh
    assert int(ours["length"][0]) == ours["length"][1]  # the manifest's total is the true one


def test_vector_ids_read_per_document_or_all_at_once_give_the_same_table(tmp_path, clustered, monkeypatch):
    """Past LAZY_ID_QUERIES reads the writer reads every id: the table comes out the same."""
    results = []
    for limit in (vectors_module.VectorWriter.LAZY_ID_QUERIES, 0):
        monkeypatch.setattr(vectors_module.VectorWriter, "LAZY_ID_QUERIES", limit)
        corpus, index_dir = tmp_path / f"c{limit}", tmp_path / f"index{limit}"
        _write(corpus)
        _indexer(corpus, index_dir).ingest([corpus])
        _edit(corpus)
        _indexer(corpus, index_dir).ingest([corpus])
        results.append(_stored(index_dir)["vectors"])
    assert results[0] == results[1]


def test_a_lost_vector_table_is_still_refilled(tmp_path, clustered):
    """The search for chunks without a vector is skipped only when the published table holds
    one row per chunk: with the table gone, every chunk is embedded again."""
    corpus = tmp_path / "c"
    _write(corpus)
    _indexer(corpus, tmp_path / "index").ingest([corpus])
    shutil.rmtree(tmp_path / "index" / "ed.lance")
    (corpus / "doc00.txt").write_text("one edited file\n")
    report = _indexer(corpus, tmp_path / "index").ingest([corpus / "doc00.txt"])
    assert report.vectors_restored > 0
    stored = _stored(tmp_path / "index")
    assert sorted(c[0] for c in stored["chunks"]) == [v[0] for v in stored["vectors"]]


def _sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_the_spare_copy_is_used_and_a_reader_of_an_old_version_keeps_it_whole(tmp_path, clustered):
    """After a publish the next run's copy is ready; the run that takes it never writes the
    file a reader still holds, and each published version reads consistently."""
    corpus, index_dir = tmp_path / "c", tmp_path / "index"
    _write(corpus)
    _indexer(corpus, index_dir).ingest([corpus])
    live = index_dir / "ed.sqlite3"
    [spare] = _spares(index_dir)
    assert _sha(index_dir / spare) == _sha(live)  # a copy of what was published
    assert os.stat(index_dir / spare).st_ino != os.stat(live).st_ino
    held_fd = os.open(live, os.O_RDONLY)  # a reader of generation 1
    held = sqlite3.connect(f"file:/proc/self/fd/{held_fd}?mode=ro&immutable=1", uri=True)
    before = held.execute("SELECT source, content_hash FROM documents ORDER BY source").fetchall()
    held_bytes = hashlib.sha256(os.pread(held_fd, os.fstat(held_fd).st_size, 0)).hexdigest()
    for n in range(3):  # each run after the first starts from the spare the one before kept
        (corpus / "doc00.txt").write_text(f"edit {n}: a harbour and a ferry\n")
        indexer = _indexer(corpus, index_dir)
        report = indexer.ingest([corpus / "doc00.txt"])
        assert report.published and indexer.workspace.took_spare
        assert len(_spares(index_dir)) == 1
        conn = schema.connect_readonly(live)
        assert conn.execute("SELECT count(*) FROM chunks").fetchone()[0] == conn.execute(
            "SELECT sum(chunk_count) FROM documents").fetchone()[0]
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        conn.close()
    # The old version, as the reader holds it: not a byte changed, and it reads as before.
    assert hashlib.sha256(os.pread(held_fd, os.fstat(held_fd).st_size, 0)).hexdigest() == held_bytes
    assert held.execute("SELECT source, content_hash FROM documents ORDER BY source").fetchall() == before
    held.close()
    os.close(held_fd)
    assert not [p for p in index_dir.iterdir() if ".ingest-" in p.name]


def test_a_spare_of_another_version_is_not_used(tmp_path, clustered):
    """A live file changed by other means (here: an older version copied back) makes the spare
    stale: the run copies the live file, and the result follows the live file."""
    corpus, index_dir = tmp_path / "c", tmp_path / "index"
    _write(corpus)
    _indexer(corpus, index_dir).ingest([corpus])
    live = index_dir / "ed.sqlite3"
    shutil.copyfile(live, tmp_path / "backup.sqlite3")
    (corpus / "doc00.txt").write_text("second version\n")
    _indexer(corpus, index_dir).ingest([corpus / "doc00.txt"])
    stale = _spares(index_dir)
    shutil.copyfile(tmp_path / "backup.sqlite3", tmp_path / "restore.tmp")
    os.replace(tmp_path / "restore.tmp", live)  # generation 1 is back; vectors stay as published
    conn = sqlite3.connect(live)
    conn.execute("UPDATE groundkit_manifest SET value = ? WHERE key = 'generation'", ("5",))
    conn.commit()
    conn.close()
    (corpus / "sub" / "doc01.txt").write_text("third version\n")
    indexer = _indexer(corpus, index_dir)
    indexer.ingest([corpus / "sub" / "doc01.txt"])
    assert not indexer.workspace.took_spare
    assert _spares(index_dir) != stale and len(_spares(index_dir)) == 1
    conn = schema.connect_readonly(live)
    titles = dict(conn.execute("SELECT d.source, c.content FROM documents d JOIN chunks c USING (document_id) "
                               "WHERE c.chunk_index = 0"))
    generation = conn.execute("SELECT value FROM groundkit_manifest WHERE key = 'generation'").fetchone()[0]
    conn.close()
    assert generation == "6"  # built on the restored file, not on the spare
    assert titles["sub/doc01.txt"] == "third version"
    assert titles["doc00.txt"].startswith("paragraph 0 of document 0")


def test_a_spare_from_before_a_reboot_is_removed_unused(tmp_path, clustered):
    """A spare named for another boot may be torn (a crash before its sync): it is dropped."""
    corpus, index_dir = tmp_path / "c", tmp_path / "index"
    _write(corpus)
    _indexer(corpus, index_dir).ingest([corpus])
    [spare] = _spares(index_dir)
    head, boot_and_rest = spare.split(".sqlite3.spare-")
    other = index_dir / f"{head}.sqlite3.spare-00000000-0000-0000-0000-000000000000{boot_and_rest[36:]}"
    os.replace(index_dir / spare, other)
    with open(other, "r+b") as f:  # what a crash before writeback could leave
        f.seek(4096)
        f.write(b"\0" * 4096)
    (corpus / "doc00.txt").write_text("after the reboot\n")
    indexer = _indexer(corpus, index_dir)
    indexer.ingest([corpus / "doc00.txt"])
    assert not indexer.workspace.took_spare and not other.exists()
    conn = schema.connect_readonly(index_dir / "ed.sqlite3")
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()
