"""BM25 postings are built in bounded memory and kept current term by term (issue 14,
adr/0030-postings-and-index-upkeep.md): the stored rows must not change because of either."""

import json
import random
import shutil
import sqlite3

import numpy as np
import pytest

from benchmarks._legacy_postings import rebuild_postings as _reference_rebuild
from groundkit_datasette.indexing import postings, terms
from groundkit_datasette.indexing.ingest import Indexer
from groundkit_datasette.retrieval import bm25
from groundkit_datasette.retrieval.collection import Collection

WORDS = [f"w{i}" for i in range(400)] + ["river", "glacier", "harbour", "ferry", "aurora"]


def _text(rng: random.Random, paragraphs: int) -> str:
    # Zipf-like word choice, paragraphs long enough that a file is cut into several chunks.
    weights = [1 / (r + 1) for r in range(len(WORDS))]
    return "\n\n".join(" ".join(rng.choices(WORDS, weights, k=rng.randint(20, 160)))
                       for _ in range(paragraphs)) + "\n"


def _corpus(directory, n=40, seed=3):
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (directory / f"doc{i:03d}.txt").write_text(_text(rng, rng.randint(1, 8)))
    return directory


def _postings(path):
    conn = sqlite3.connect(path)
    try:
        return (conn.execute("SELECT term_id, chunk_ids, weights FROM bm25_postings ORDER BY term_id").fetchall(),
                conn.execute("SELECT term, term_id, doc_freq FROM bm25_vocab ORDER BY term_id").fetchall())
    finally:
        conn.close()


def _rebuilt_copy(path, tmp_path, rebuild, **kw):
    """The postings of ``path`` rebuilt from its chunk term rows by ``rebuild`` (on a copy)."""
    copy = tmp_path / f"copy-{rebuild.__name__}.sqlite3"
    shutil.copyfile(path, copy)
    conn = sqlite3.connect(copy)
    with conn:
        rebuild(conn, **kw)
    conn.close()
    return _postings(copy)


def _ingest(corpus, index, **kw):
    indexer = Indexer("kw", index_dir=index, base_dir=corpus, embedder="none", **kw)
    return indexer, indexer.ingest([corpus])


def _recorded_stats(path):
    conn = sqlite3.connect(path)
    try:
        return json.loads(conn.execute("SELECT value FROM groundkit_manifest WHERE key = 'bm25_stats'").fetchone()[0])
    finally:
        conn.close()


def test_streamed_rebuild_stores_exactly_what_the_in_memory_one_did(tmp_path, monkeypatch):
    """Built in several term-id ranges, the postings rows are byte for byte the old ones."""
    corpus = _corpus(tmp_path / "corpus")
    monkeypatch.setattr(postings, "PAIRS_PER_PASS", 500)  # many passes on a small collection
    _ingest(corpus, tmp_path / "index")
    path = tmp_path / "index" / "kw.sqlite3"
    reference = _rebuilt_copy(path, tmp_path, _reference_rebuild)
    assert len(reference[0]) > 300
    assert _postings(path) == reference
    assert _rebuilt_copy(path, tmp_path, postings.rebuild_postings) == reference


def test_streamed_rebuild_matches_when_a_document_s_chunks_are_not_adjacent(tmp_path):
    """Rows edited by hand can leave a document's chunks apart; document frequency still counts it once."""
    corpus = _corpus(tmp_path / "corpus", n=12)
    _ingest(corpus, tmp_path / "index")
    path = tmp_path / "index" / "kw.sqlite3"
    conn = sqlite3.connect(path)
    with conn:  # move the first document's first chunk row to the end
        top = conn.execute("SELECT max(id) FROM chunks").fetchone()[0]
        first = conn.execute("SELECT min(id) FROM chunks").fetchone()[0]
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute("UPDATE chunks SET id = ? WHERE id = ?", (top + 1, first))
        conn.execute("UPDATE bm25_chunk_terms SET id = ? WHERE id = ?", (top + 1, first))
    conn.close()
    assert _rebuilt_copy(path, tmp_path, postings.rebuild_postings) == _rebuilt_copy(path, tmp_path, _reference_rebuild)


def test_rebuild_decodes_at_most_the_budget_of_pairs_at_once(tmp_path, monkeypatch):
    """Peak memory follows PAIRS_PER_PASS, not the corpus: no weight array exceeds it."""
    corpus = _corpus(tmp_path / "corpus")
    _ingest(corpus, tmp_path / "index")
    path = tmp_path / "index" / "kw.sqlite3"
    total = sum(len(r[1]) // 4 for r in _postings(path)[0] if r[0] >= 0)
    sizes = []
    original = postings.term_weights

    def recording(idf, freqs, *args, **kw):
        sizes.append(np.size(freqs))
        return original(idf, freqs, *args, **kw)

    monkeypatch.setattr(postings, "term_weights", recording)
    monkeypatch.setattr(postings, "PAIRS_PER_PASS", 1000)
    conn = sqlite3.connect(path)
    with conn:
        postings.rebuild_postings(conn)
    conn.close()
    assert total > 5000 and len(sizes) > 5
    # A range holds at most the budget, or one term alone.
    largest_term = max(len(r[1]) // 4 for r in _postings(path)[0] if r[0] >= 0)
    assert max(sizes) <= max(1000, largest_term)


def _edit(corpus, rng):
    """One file edited, one added, one removed: all within the statistics bound."""
    (corpus / "doc005.txt").write_text(_text(rng, 3) + "glacier aurora harbour\n")
    (corpus / "new.txt").write_text("A ferry crossed the harbour; the glacier shone.\n")
    (corpus / "doc007.txt").unlink()


@pytest.mark.parametrize("load_all_terms", [terms.TermTable.LOAD_ALL_TERMS, 0])
def test_an_incremental_run_updates_only_the_touched_terms_and_equals_a_full_rebuild(
        tmp_path, monkeypatch, load_all_terms):
    """Same statistics, same rows: the term-by-term update is a full rebuild's result, and the
    terms it never touched keep their rows. With ``LOAD_ALL_TERMS`` 0 the stored terms are
    looked up as met (as in a large collection) and must get the same ids."""
    monkeypatch.setattr(postings, "STATS_DRIFT", 0.5)  # a small corpus: keep one edit within the bound
    monkeypatch.setattr(terms.TermTable, "LOAD_ALL_TERMS", load_all_terms)
    corpus = _corpus(tmp_path / "corpus", n=60)
    _ingest(corpus, tmp_path / "index")
    path = tmp_path / "index" / "kw.sqlite3"
    before = dict((t, (i, w)) for t, i, w in _postings(path)[0])
    stats = _recorded_stats(path)
    _edit(corpus, random.Random(9))
    indexer, report = _ingest(corpus, tmp_path / "index")
    assert (report.added, report.updated, report.removed) == (1, 1, 1)
    assert indexer.postings_rebuilt is False
    assert _recorded_stats(path) == stats  # weighted with the statistics of the last rebuild
    after = _postings(path)
    assert after == _rebuilt_copy(path, tmp_path, postings.rebuild_postings, stats=stats)
    unchanged = sum(1 for t, i, w in after[0] if before.get(t) == (i, w))
    assert 0 < unchanged < len(after[0])
    # Search answers equal those of the rebuilt file, scores included.
    copy = tmp_path / "copy-rebuild_postings.sqlite3"
    for query in ("glacier aurora", "w1 w2 w3 harbour", "ferry", "w399 river"):
        with Collection.open("kw", index_dir=tmp_path / "index") as col:
            ours = col.bm25_scores(query)
        full = bm25.score(sqlite3.connect(copy), query)
        assert ours[0].tolist() == full[0].tolist() and ours[1].tobytes() == full[1].tobytes()
    # A second run updates what the first one wrote, still equal to a rebuild.
    (corpus / "doc011.txt").write_text("aurora " * 30 + "\n")
    (corpus / "doc012.txt").unlink()
    indexer, report = _ingest(corpus, tmp_path / "index")
    assert (report.updated, report.removed, indexer.postings_rebuilt) == (1, 1, False)
    assert _postings(path) == _rebuilt_copy(path, tmp_path, postings.rebuild_postings, stats=stats)


def test_drifted_statistics_rebuild_every_posting_and_equal_a_fresh_ingest(tmp_path):
    """Past the bound the collection is re-weighted whole, with its own statistics."""
    corpus = _corpus(tmp_path / "corpus", n=20)
    _ingest(corpus, tmp_path / "index")
    path = tmp_path / "index" / "kw.sqlite3"
    rng = random.Random(5)
    for i in range(5):  # a quarter more documents: far past 1 %
        (corpus / f"more{i}.txt").write_text(_text(rng, 4))
    indexer, report = _ingest(corpus, tmp_path / "index")
    assert report.added == 5 and indexer.postings_rebuilt is True
    _ingest(corpus, tmp_path / "fresh")
    assert _postings(path) == _postings(tmp_path / "fresh" / "kw.sqlite3")


def test_a_run_that_changes_no_chunk_leaves_the_postings_alone(tmp_path):
    """An access-list-only change publishes, and the postings rows stay as they were."""
    corpus = _corpus(tmp_path / "corpus", n=10)
    _ingest(corpus, tmp_path / "index")
    path = tmp_path / "index" / "kw.sqlite3"
    before = _postings(path)
    (corpus / "doc003.txt.acl.json").write_text(json.dumps({"groups": ["ops"]}))
    indexer, report = _ingest(corpus, tmp_path / "index")
    assert report.published and indexer.postings_rebuilt is False
    assert _postings(path) == before
