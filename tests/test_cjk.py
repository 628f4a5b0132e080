"""CJK search: Chinese and Japanese documents found by a two-character word, through groundkit's
BM25 search and through Datasette's ``?_search=`` (real ingest, real Datasette app)."""

import sqlite3

import pytest
from datasette.app import Datasette

from groundkit_datasette.indexing import terms, tokenizer
from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.indexing.ingest import ingest

CHINESE = """# 可再生能源

太阳能电池板把阳光转化为电能。风力发电机在海上运行更加稳定。
"""
JAPANESE = """# 東京の天気

今日の東京は晴れです。明日は雨が降るでしょう。
"""
KOREAN = "한국어 문서는 띄어쓰기가 있지만 조사가 붙어 있습니다.\n"
ENGLISH = "Batteries store surplus energy for the night.\n"


@pytest.fixture
def built(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "zh.md").write_text(CHINESE, encoding="utf-8")
    (corpus / "ja.md").write_text(JAPANESE, encoding="utf-8")
    (corpus / "ko.txt").write_text(KOREAN, encoding="utf-8")
    (corpus / "en.txt").write_text(ENGLISH, encoding="utf-8")
    index_dir = tmp_path / "index"
    ingest([corpus], collection="cjk", index_dir=index_dir, embedder="none")
    return corpus, index_dir


def test_runs_of_han_kana_and_hangul_become_overlapping_bigrams():
    assert tokenizer.tokenize("東京都") == ["東京", "京都"]
    assert tokenizer.tokenize("今日は晴れ") == ["今日", "日は", "は晴", "晴れ"]
    assert tokenizer.tokenize("한국어") == ["한국", "국어"]
    assert tokenizer.tokenize("字") == ["字"]
    # Latin words next to CJK keep their own rules (stop words, stemming).
    assert tokenizer.tokenize("the rivers of 東京") == ["river", "東京"]


def test_ingest_encodes_cjk_as_the_query_tokenizer_does():
    conn = sqlite3.connect(":memory:")
    from groundkit_datasette.indexing import schema

    schema.create_schema(conn)
    table = terms.TermTable(conn)
    text = CHINESE + JAPANESE + KOREAN + ENGLISH
    length, term_ids, _freqs = table.encode(text)
    assert length == len(tokenizer.tokenize(text))
    names = {tid: term for term, tid in table.ids.items()}
    from array import array

    assert {names[t] for t in array("i", term_ids)} == set(tokenizer.tokenize(text))


@pytest.mark.parametrize("word, source", [("东京", None), ("東京", "ja.md"), ("电能", "zh.md"),
                                          ("天気", "ja.md"), ("发电", "zh.md"), ("한국", "ko.txt")])
def test_groundkit_search_finds_a_document_by_a_two_character_word(built, word, source):
    corpus, index_dir = built
    with Collection.open("cjk", index_dir=index_dir, base_dir=corpus) as col:
        hits = col.search(query=word, mode="bm25").hits
    if source is None:  # simplified 东 is another character than 東: nothing matches
        assert hits == []
    else:
        assert [h.source for h in hits] == [source]


async def test_datasette_search_finds_cjk_text_in_the_chunks_cjk_table(built):
    corpus, index_dir = built
    ds = Datasette([str(index_dir / "cjk.sqlite3")], immutables=[],
                   metadata={"plugins": {"groundkit": {"index_dir": str(index_dir),
                                                       "base_dir": str(corpus)}}})
    sources = {}
    for word in ("東京", "电能", "한국"):
        r = await ds.client.get(f"/cjk/chunks_cjk.json?_search={word}&_shape=array")
        assert r.status_code == 200, r.text
        ids = [row["chunk_id"] for row in r.json()]
        assert len(ids) == 1
        chunk = (await ds.client.get(f"/cjk/chunks.json?chunk_id={ids[0]}&_shape=array")).json()[0]
        sources[word] = chunk
    assert "東京" in sources["東京"]["content"] and "电能" in sources["电能"]["content"]
    # The English document has no CJK row; the long-token FTS table cannot find the word.
    r = await ds.client.get("/cjk/chunks.json?_search=東京&_shape=array")
    assert r.status_code == 200 and r.json() == []


def test_cjk_rows_follow_their_chunks_on_reingest(built):
    corpus, index_dir = built
    (corpus / "ja.md").write_text("# 大阪\n\n大阪は雨です。\n", encoding="utf-8")
    ingest([corpus], collection="cjk", index_dir=index_dir, embedder="none")
    conn = sqlite3.connect(index_dir / "cjk.sqlite3")
    try:
        match = "SELECT count(*) FROM chunks_cjk_fts WHERE chunks_cjk_fts MATCH ?"
        assert conn.execute(match, ("東京",)).fetchone()[0] == 0
        assert conn.execute(match, ("大阪",)).fetchone()[0] == 1
        conn.execute("INSERT INTO chunks_cjk_fts(chunks_cjk_fts, rank) VALUES ('integrity-check', 1)")
        orphans = conn.execute(
            "SELECT count(*) FROM chunks_cjk WHERE id NOT IN (SELECT id FROM chunks)").fetchone()[0]
        assert orphans == 0
    finally:
        conn.close()


def test_an_older_collection_with_whole_run_terms_is_retokenized(built):
    """A collection written before the bigram tokenizer (no manifest ``tokenizer``, CJK terms
    stored whole) is tokenized again by the next ingest, though no file changed."""
    corpus, index_dir = built
    path = index_dir / "cjk.sqlite3"
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DELETE FROM groundkit_manifest WHERE key = 'tokenizer'")
        conn.execute("INSERT INTO bm25_vocab(term, term_id) VALUES ('今日の東京は晴れです', 999999)")
    conn.close()
    report = ingest([corpus], collection="cjk", index_dir=index_dir, embedder="none")
    assert report.updated == 4
    with Collection.open("cjk", index_dir=index_dir, base_dir=corpus) as col:
        assert col.manifest["tokenizer"] == tokenizer.TOKENIZER
        assert [h.source for h in col.search(query="東京", mode="bm25").hits] == ["ja.md"]
