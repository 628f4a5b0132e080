import sqlite3
from array import array
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from groundkit_datasette import bm25, schema

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
    from groundkit_datasette.collection import Collection
    from groundkit_datasette.ingest import ingest

    corpus = tmp_path / f"{name}-corpus"
    corpus.mkdir()
    for path, text in files.items():
        (corpus / path).write_text(text)
    ingest([corpus], collection=name, index_dir=tmp_path / "index", embedder="none")
    return Collection.open(name, index_dir=tmp_path / "index")


def _scores(col, query):
    ids, scores = bm25.score(col._conn, query)
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
