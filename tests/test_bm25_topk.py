"""The BM25 top-k path (bm25.top_candidates, rankers.bm25_ranked) against a plain reference
scorer, and the response built from it (adr/0025-bm25-topk.md).

The fast path cuts candidates with a lower bound and keeps its accumulator between queries;
these tests hold it to the simple definition: every chunk's score summed in float32 in
sorted term order, ties broken by content hash, on real collections built by ingest.
"""

import json
import random

import numpy as np
import pytest

from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.retrieval import bm25, rankers
from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.retrieval.models import SearchResponse

# A skewed vocabulary: a few words in most chunks (long postings, low weights), many rare.
VOCAB = [f"w{i}" for i in range(60)]
WEIGHTS = [1.0 / (i + 1) ** 0.8 for i in range(len(VOCAB))]


def _corpus(tmp_path, seed: int, files: int = 40):
    rng = random.Random(seed)
    root = tmp_path / f"corpus{seed}"
    for i in range(files):
        folder = root / ("a" if i % 3 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        # Short chunks of few words: equal scores (ties) are common.
        paras = [" ".join(rng.choices(VOCAB, WEIGHTS, k=rng.randint(1, 8))) + f" uniq{i}x{j}"
                 for j in range(rng.randint(1, 3))]
        (folder / f"d{i:03d}.txt").write_text("\n\n".join(paras) + "\n")
    ingest([root], collection=f"k{seed}", index_dir=tmp_path / "index", embedder="none")
    return Collection.open(f"k{seed}", index_dir=tmp_path / "index")


def _reference(col, query: str, depth: int, source_prefix: str | None = None):
    """Every chunk's score the slow way, then (-score, content hash), then the top ``depth``."""
    tokens = bm25.tokenize(query)
    totals: dict[int, np.float32] = {}
    for term in sorted(set(tokens)):
        row = col.query("SELECT p.chunk_ids, p.weights FROM bm25_vocab v JOIN bm25_postings p "
                        "ON p.term_id = v.term_id WHERE v.term = ?", (term,))
        if not row:
            continue
        ids = np.frombuffer(row[0][0], dtype=np.int32)
        weights = np.frombuffer(row[0][1], dtype=np.float32) * np.float32(tokens.count(term))
        for i, w in zip(ids.tolist(), weights):
            totals[i] = np.float32(totals.get(i, np.float32(0)) + w)
    meta = {r[0]: (r[1], r[2], r[3]) for r in col.query(
        "SELECT c.id, c.chunk_id, c.content_hash, d.source FROM chunks c "
        "JOIN documents d USING (document_id)")}
    ranked = sorted(
        ((float(s), meta[i][1], meta[i][0]) for i, s in totals.items()
         if source_prefix is None or meta[i][2].startswith(source_prefix)),
        key=lambda t: (-t[0], t[1]))
    return [(cid, s) for s, _h, cid in ranked[:depth]]


def _queries(seed: int, n: int):
    rng = random.Random(seed + 1000)
    out = []
    for _ in range(n):
        words = rng.choices(VOCAB, WEIGHTS, k=rng.randint(1, 5))
        if rng.random() < 0.2:
            words.append(rng.choice(words))  # a repeated word counts twice
        if rng.random() < 0.2:
            words.append(rng.choice(["the", "and", "zzunknown"]))
        rng.shuffle(words)
        out.append(" ".join(words))
    return out + ["the and", "zzunknown", VOCAB[0], VOCAB[-1]]


@pytest.mark.parametrize("add_once", [False, True], ids=["add-per-term", "add-once"])
@pytest.mark.parametrize("sparse, essential", [(0.0, 0.0), (10.0, 0.0), (0.0, 10.0)],
                         ids=["dense-scan", "touched-slots", "essential-terms"])
@pytest.mark.parametrize("seed", [1, 2])
def test_the_top_k_path_ranks_exactly_as_the_reference_scorer(tmp_path, monkeypatch, seed,
                                                             sparse, essential, add_once):
    """Same chunks, same float32 scores, same tie order, at every depth and on each of the
    accumulator's paths: the scan of every slot, the touched slots, the postings of the
    essential terms only, each with the weights added per term or in one call over them all
    (the same open collection answers every query, so a buffer left dirty by one query would
    show in the next)."""
    monkeypatch.setattr(bm25, "SPARSE_FRACTION", sparse)
    monkeypatch.setattr(bm25, "ESSENTIAL_FRACTION", essential)
    monkeypatch.setattr(bm25, "ADD_ONCE_MIN_TERMS", 2 if add_once else 10**9)
    monkeypatch.setattr(bm25, "SPARSE_MIN_SLOTS", 0)  # these collections are small
    with _corpus(tmp_path, seed) as col:
        assert col.tie_ranks() is not None
        for query in _queries(seed, 60):
            for depth in (1, 2, 5, 11, 50, 500):
                assert rankers.bm25_ranked(col, query, depth, None) == _reference(col, query, depth), \
                    (query, depth)
            hits = col.search(query=query, mode="bm25", top_k=10).hits
            assert [(h.chunk_id, h.score) for h in hits] == _reference(col, query, 10)


def test_the_cut_bound_is_the_float32_product_of_a_repeated_terms_weight():
    """bm25._cut_bound computes a repeated term's bound from Python floats (a float64
    product rounded once): the same value as numpy's float32 product, for weights across
    the range a term has and the counts a query repeats it."""
    rng = np.random.default_rng(7)
    weights = np.concatenate([rng.random(4_000, dtype=np.float32) * np.float32(12),
                              np.float32([1e-7, 0.1, 1 / 3, 2.5, 7.999999, 16777215])])
    other = bm25.Postings(np.array([0], np.int32), np.float32([1e-9]))  # never the largest
    for w in weights.tolist():
        term = bm25.Postings(np.array([3], np.int32), np.float32([w]))
        for n in (2, 3, 7, 50, 255):
            got = bm25._cut_bound([other, term], [1, n], 1)
            assert type(got) is np.float32
            assert got == np.float32(w) * np.float32(n), (w, n)
    assert bm25._cut_bound([other, term], None, 1) == np.float32(w)
    assert bm25._cut_bound([other, term], None, 2) == np.float32(0)  # fewer postings than k


def test_a_filtered_search_keeps_the_reference_order_among_allowed_chunks(tmp_path):
    """The Allowed path (request filters) scores every chunk, drops the rest, then ranks."""
    with _corpus(tmp_path, 3) as col:
        for query in _queries(3, 30):
            hits = col.search(query=query, mode="bm25", top_k=7, source="b/").hits
            assert [(h.chunk_id, h.score) for h in hits] == _reference(col, query, 7, "b/")


def test_a_bm25_search_reads_its_hits_with_one_lookup_by_row_id(tmp_path):
    """Ranked row ids to hits: one SQL query on ``chunks`` (by integer id), not a chunk-id
    lookup followed by a second join on the text ids; rows read once are not read again
    from the same open collection (one published version), and only new rows are queried."""
    with _corpus(tmp_path, 4) as col:
        first = col.search(query="w1 w2", mode="bm25", top_k=5)  # postings, tie order cached
        statements = []
        col._conn.set_trace_callback(statements.append)
        try:
            again = col.search(query="w1 w2", mode="bm25", top_k=5)
            cached = [s for s in statements if "FROM chunks" in s]
            statements.clear()
            page = col.search(query="w1 w2", mode="bm25", top_k=5, offset=5)
        finally:
            col._conn.set_trace_callback(None)
        assert first.hits and again.model_dump(exclude={"timings_ms"}) == first.model_dump(
            exclude={"timings_ms"})
        assert cached == []
        assert page.hits
        on_chunks = [s for s in statements if "FROM chunks" in s]
        assert len(on_chunks) == 1, on_chunks
        assert "c.id IN" in on_chunks[0]
        # The rows already held (the first search read the top 6) are not asked for again:
        # the second page's ranking reads 11.
        asked = on_chunks[0].split("IN (", 1)[1].split(")", 1)[0].split(",")
        assert len(asked) == 5, on_chunks


def test_a_search_response_equals_the_one_validated_from_its_json(tmp_path):
    """The response model round-trips through its JSON (adr/0054: every response model is
    validated by pydantic; none is built by hand)."""
    with _corpus(tmp_path, 5) as col:
        response = col.search(query="w0 w3 w7", mode="bm25", top_k=10, group_by_document=True)
        assert response.hits and response.groups
        again = SearchResponse.model_validate(json.loads(response.model_dump_json()))
        assert again == response
        assert again.model_dump_json() == response.model_dump_json()
        assert response.model_dump(mode="json") == again.model_dump(mode="json")
        assert response.model_copy(update={"top_k": 3}).top_k == 3
