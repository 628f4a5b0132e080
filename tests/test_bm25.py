import json
import sqlite3
from array import array
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from groundkit_datasette.retrieval import bm25
from groundkit_datasette.indexing import schema

WORDS = st.sampled_from(
    ["the", "Running", "runs", "ran", "and", "café", "naïve", "ÉTÉ", "x1", "42", "don't", "rivers",
     "river", "Fluß", "İstanbul", "ﬁle", "über", "s", "a"]
)
TEXT = st.one_of(
    st.lists(WORDS, max_size=40).map(" ".join),
    st.text(max_size=300),
)


def decode(table: bm25.TermTable, term_ids: bytes, freqs: bytes) -> Counter:
    names = {tid: term for term, tid in table.ids.items()}
    return Counter({names[t]: f for t, f in zip(array("i", term_ids), array("i", freqs))})


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(TEXT, min_size=1, max_size=5))
def test_ingest_encoding_counts_what_the_query_tokenizer_sees(texts):
    # Ingest memoises words across chunks; a query is tokenized afresh. They must agree.
    conn = sqlite3.connect(":memory:")
    schema.create_schema(conn)
    table = bm25.TermTable(conn)
    for text in texts:
        length, term_ids, freqs = table.encode(text)
        tokens = bm25.tokenize(text)
        assert length == len(tokens)
        assert decode(table, term_ids, freqs) == Counter(tokens)
        assert list(array("i", term_ids)) == sorted(array("i", term_ids))


CJK_OR_ASCII = st.one_of(TEXT, st.text(st.characters(max_codepoint=127), max_size=200), st.sampled_from(["東京タワー と Tokyo tower", "서울 Seoul", "RIVER_bank 3.5",
                                                 "", "the and a", "Ünïcode mixed WITH ascii"]))


@settings(max_examples=200, deadline=None)
@given(batches=st.lists(st.lists(CJK_OR_ASCII, max_size=6), min_size=1, max_size=4))
def test_a_batch_encodes_as_its_texts_one_by_one(batches):
    """``encode_many`` (ingest's batch path: ASCII words as bytes, counted with numpy) gives
    each text's values and assigns the same term ids in the same order as ``encode``."""
    tables = []
    for _ in range(2):
        conn = sqlite3.connect(":memory:")
        schema.create_schema(conn)
        tables.append(bm25.TermTable(conn))
    one, many = tables
    for texts in batches:
        assert many.encode_many(texts) == [one.encode(text) for text in texts]
    assert many.new_terms == one.new_terms


def test_a_batch_after_the_word_memo_starts_over_still_encodes_alike(monkeypatch):
    monkeypatch.setattr(bm25.TermTable, "WORD_MEMO_LIMIT", 3)
    conn = sqlite3.connect(":memory:")
    schema.create_schema(conn)
    table = bm25.TermTable(conn)
    texts = ["rivers flow to the sea", "東京 rivers", "seas and rivers meet"]
    first = table.encode_many(texts)
    again = table.encode_many(texts)  # the memo is past its limit: cleared, CJK set included
    assert first == again == [table.encode(t) for t in texts]


def test_term_ids_are_stable_within_a_run_and_new_terms_are_recorded():
    conn = sqlite3.connect(":memory:")
    schema.create_schema(conn)
    table = bm25.TermTable(conn)
    _, first, _ = table.encode("rivers flow")
    _, again, _ = table.encode("river flows")  # same stems, same ids
    assert first == again
    table.flush()
    assert dict(conn.execute("SELECT term, term_id FROM bm25_vocab")) == table.ids
    assert set(table.ids) == {"river", "flow"}


def _bm25_collection(tmp_path, files: dict[str, str], name="kw"):
    """A real BM25-only collection built by ingest from ``files``."""
    from groundkit_datasette.retrieval.collection import Collection
    from groundkit_datasette.indexing.ingest import ingest

    corpus = tmp_path / f"{name}-corpus"
    corpus.mkdir()
    for path, text in files.items():
        (corpus / path).write_text(text)
    ingest([corpus], collection=name, index_dir=tmp_path / "index", embedder="none")
    return Collection.open(name, index_dir=tmp_path / "index")


def _scores(col, query):
    ids, scores = col.bm25_scores(query)
    sources = dict(col.query("SELECT c.id, d.source FROM chunks c JOIN documents d USING (document_id)"))
    return {sources[int(i)]: float(s) for i, s in zip(ids, scores)}


def test_a_word_the_query_repeats_counts_as_often_as_it_is_repeated(tmp_path):
    """Long natural-language queries carry their topic in repeated words (Lucene, bm25s)."""
    files = {"aurora.txt": "The aurora shone over the hills.\n",
             "fjord.txt": "The fjord froze over the winter.\n"}
    files.update({f"pad{i}.txt": f"Harbour notes number {i} about ferries.\n" for i in range(4)})
    with _bm25_collection(tmp_path, files) as col:
        once = _scores(col, "aurora fjord")
        assert once["aurora.txt"] == pytest.approx(once["fjord.txt"], rel=1e-6)  # same statistics
        twice = _scores(col, "aurora fjord fjord")
        assert twice["fjord.txt"] == pytest.approx(2 * once["fjord.txt"], rel=1e-6)
        assert twice["aurora.txt"] == pytest.approx(once["aurora.txt"], rel=1e-6)
        # The single-term path weighs repeats too.
        assert _scores(col, "fjord fjord fjord")["fjord.txt"] == pytest.approx(3 * once["fjord.txt"], rel=1e-6)


def _long_document(word_in_every_chunk: bool) -> str:
    """Five paragraphs of equal token count, each well over a chunk apart."""
    paragraphs = []
    for i in range(5):
        word = "glacier" if word_in_every_chunk or i == 0 else "boulder"
        paragraphs.append(f"Survey {word} " + " ".join(f"moraine{i}x{j}" for j in range(110)) + ".")
    return "\n\n".join(paragraphs) + "\n"


def test_idf_counts_documents_not_the_chunks_a_long_document_is_cut_into(tmp_path):
    """A term a long document repeats in each of its chunks is not thereby more common."""
    pads = {f"pad{i}.txt": f"Harbour notes number {i} about ferries.\n" for i in range(6)}
    scores = []
    for name, every in (("every", True), ("once", False)):
        files = {"long.txt": _long_document(every), "short.txt": "A glacier calved into the bay.\n", **pads}
        with _bm25_collection(tmp_path, files, name) as col:
            assert col.query("SELECT chunk_count FROM documents WHERE source = 'long.txt'")[0][0] >= 5
            scores.append(_scores(col, "glacier")["short.txt"])
    # Same chunk lengths and the same two documents holding the term: the same IDF.
    assert scores[0] == pytest.approx(scores[1], rel=1e-6)


def test_a_readers_idf_counts_hidden_documents_not_their_chunks(tmp_path):
    """Per-reader IDF (adr/0007) recounts in the unit the stored weights use: documents."""
    import json

    from groundkit_datasette.retrieval.permissions import Reader, ScopedCollection
    from groundkit_datasette.retrieval.models import SearchRequest

    def public_score(name, every):
        files = {"public.txt": "A glacier calved into the bay.\n",
                 **{f"pad{i}.txt": f"Harbour notes number {i} about ferries.\n" for i in range(6)}}
        corpus = tmp_path / f"{name}-corpus"
        (corpus / "hr").mkdir(parents=True)
        (corpus / "hr" / ".groundkit-acl.json").write_text(json.dumps({"groups": ["hr"]}))
        (corpus / "hr" / "memo.txt").write_text(_long_document(every))
        for path, text in files.items():
            (corpus / path).write_text(text)
        from groundkit_datasette.retrieval.collection import Collection
        from groundkit_datasette.indexing.ingest import ingest

        ingest([corpus], collection=name, index_dir=tmp_path / "index", embedder="none")
        with Collection.open(name, index_dir=tmp_path / "index") as col:
            view = ScopedCollection(col, Reader(None, frozenset()))
            hits = view.search(SearchRequest(query="glacier", mode="bm25", top_k=5)).hits
            assert {h.source for h in hits} == {"public.txt"}
            unscoped = _scores(col, "glacier")["public.txt"]
            return hits[0].score, unscoped

    # The hidden memo mentions the term in all its chunks, or in its first only: the same
    # document frequency, so the same IDF, for the operator and for an anonymous reader.
    (every, every_all), (once, once_all) = public_score("every", True), public_score("once", False)
    assert every_all == pytest.approx(once_all, rel=1e-6)
    assert every == pytest.approx(once, rel=1e-6)
    # And the reader's figure is not the operator's: the memo is subtracted.
    assert every > every_all * 1.01


def test_a_collection_scored_with_other_settings_is_rescored_by_the_next_ingest(tmp_path):
    """A file written before document IDF still searches, and re-ingest brings it up to date."""
    from groundkit_datasette.indexing.ingest import ingest

    files = {"a.txt": "The aurora shone over the hills.\n", "b.txt": "The fjord froze.\n"}
    with _bm25_collection(tmp_path, files, "old") as col:
        expected = _scores(col, "aurora fjord")
    path = tmp_path / "index" / "old.sqlite3"
    conn = sqlite3.connect(path)
    with conn:  # what an earlier version wrote: no document map, no IDF unit in the record
        conn.execute("DELETE FROM bm25_postings WHERE term_id = ?", (bm25.DOCUMENT_MAP_ID,))
        conn.execute("UPDATE groundkit_manifest SET value = '{\"k1\": 1.5, \"b\": 0.75}' WHERE key = 'bm25'")
    conn.close()
    assert bm25.document_map(sqlite3.connect(path)) is None
    report = ingest([tmp_path / "old-corpus"], collection="old", index_dir=tmp_path / "index", embedder="none")
    assert report.unchanged == 2 and report.published
    conn = sqlite3.connect(path)
    assert json.loads(conn.execute("SELECT value FROM groundkit_manifest WHERE key = 'bm25'").fetchone()[0]) \
        == bm25.settings()
    assert bm25.document_map(conn) is not None
    from groundkit_datasette.retrieval.collection import Collection

    with Collection.open("old", index_dir=tmp_path / "index") as col:
        assert _scores(col, "aurora fjord") == pytest.approx(expected)


def test_stored_weights_are_bm25_over_chunks_with_document_idf(tmp_path):
    """Recomputes every posting from the chunk term rows by the formula, independently."""
    import math

    files = {"long.txt": _long_document(True), "short.txt": "A glacier calved; the glacier moved.\n",
             **{f"pad{i}.txt": f"Harbour notes number {i} about ferries and a glacier.\n" for i in range(3)}}
    with _bm25_collection(tmp_path, files, "formula") as col:
        chunk_rows = col.query("SELECT t.id, t.length, t.term_ids, t.term_freqs, c.document_id "
                               "FROM bm25_chunk_terms t JOIN chunks c ON c.id = t.id")
        avgdl = sum(r[1] for r in chunk_rows) / len(chunk_rows)
        documents = {r[4] for r in chunk_rows}
        holders = {}
        for row_id, _length, ids, _freqs, doc in chunk_rows:
            for t in array("i", ids):
                holders.setdefault(t, set()).add(doc)
        postings = {t: dict(zip(array("i", ids), array("f", w)))
                    for t, ids, w in col.query("SELECT term_id, chunk_ids, weights FROM bm25_postings "
                                               "WHERE term_id >= 0")}
        checked = 0
        for row_id, length, ids, freqs, _doc in chunk_rows:
            for t, f in zip(array("i", ids), array("i", freqs)):
                df = len(holders[t])
                idf = math.log(1 + (len(documents) - df + 0.5) / (df + 0.5))
                want = idf * f * (bm25.K1 + 1) / (f + bm25.K1 * (1 - bm25.B + bm25.B * length / avgdl))
                assert postings[t][row_id] == pytest.approx(want, rel=1e-5)
                checked += 1
        assert checked > 100


def test_tokenizer_rules_for_hyphens_apostrophes_numbers_and_single_characters():
    """Kept as measured in adr/0018-bm25-over-chunks.md: hyphens and apostrophes split words, numbers
    and one-character words are terms (vitamin D), our stop words go."""
    from groundkit_datasette.indexing import tokenizer

    stem = tokenizer.STEMMER.stemWords
    assert bm25.tokenize("Free-flight tests of Vitamin D, 42 don't fail") == stem(
        ["free", "flight", "tests", "vitamin", "d", "42", "fail"])
    assert bm25.tokenize("The and of") == []
