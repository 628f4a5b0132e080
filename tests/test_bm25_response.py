"""The fast BM25 response path (hit rows kept per open collection, models built without
validation, one ``stat`` per document, ``matched_terms`` by ``searchsorted``) answers exactly
what the validated path answers, on real collections: fresh and stale sources, a reader
whose access lists hide documents, PDF page hits, grouped and later pages."""

import json
import os

import numpy as np
import pytest

from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.retrieval import bm25
from groundkit_datasette.retrieval import search as gk_search
from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.retrieval.models import Hit, SearchResponse
from groundkit_datasette.retrieval.permissions import Reader, ScopedCollection

from .bird_support import build_birds


@pytest.fixture
def built(tmp_path):
    return build_birds(tmp_path, {"secret.md": (
        "---\ngroundkit_acl:\n  users: [alice]\n---\n# Merger\n\n"
        "kestrel kestrel kestrel kestrel falcon merger plans\n")})


def _validated(monkeypatch):
    """Make run_search validate every response model (the path a plugin's mode takes)."""
    original = gk_search.build_response
    monkeypatch.setattr(gk_search, "build_response",
                        lambda fields, *, trusted: original(fields, trusted=False))
    return lambda: monkeypatch.setattr(gk_search, "build_response", original)


def _same(fast: SearchResponse, checked: SearchResponse):
    assert fast.hits, "the scenario must return hits"
    drop = {"timings_ms"}
    assert fast.model_dump(exclude=drop) == checked.model_dump(exclude=drop)
    assert fast.model_dump(exclude=drop, exclude_unset=True) == checked.model_dump(
        exclude=drop, exclude_unset=True)
    a, b = json.loads(fast.model_dump_json()), json.loads(checked.model_dump_json())
    a.pop("timings_ms"), b.pop("timings_ms")
    assert a == b
    # Field order too: the JSON a client reads is the same text.
    assert [list(h) for h in a["hits"]] == [list(h) for h in b["hits"]]
    for f, c in zip(fast.hits, checked.hits):
        assert type(f) is Hit and f == c and f.model_fields_set == c.model_fields_set
        assert {k: type(v) for k, v in f.components.items()} == \
               {k: type(v) for k, v in c.components.items()}


SCENARIOS = [
    dict(query="kestrel falcon", mode="bm25", top_k=5),
    dict(query="kestrel kestrel meadow", mode="bm25", top_k=10, group_by_document=True),
    dict(query="falcon migration", mode="bm25", top_k=3, offset=3),
    dict(query="marker3 speed", mode="bm25", top_k=10, min_score=0.1),
    dict(query="falcon", mode="bm25", top_k=10, source="notes/"),
]


@pytest.mark.parametrize("fields", SCENARIOS, ids=[s["query"] for s in SCENARIOS])
def test_the_fast_response_equals_the_validated_one(built, monkeypatch, fields):
    corpus, index_dir = built
    with Collection.open("birds", index_dir=index_dir, base_dir=corpus) as col:
        fast = col.search(**fields)
        again = col.search(**fields)  # rows now from memory
        restore = _validated(monkeypatch)
        checked = col.search(**fields)
        restore()
    _same(fast, checked)
    _same(again, checked)


def test_stale_and_missing_sources_answer_as_the_validated_path(built, monkeypatch):
    """An edit shows on the very next search of the same open collection (the stat is per
    search; only the base directory's real path is kept), and a deleted file says True."""
    corpus, index_dir = built
    with Collection.open("birds", index_dir=index_dir, base_dir=corpus) as col:
        before = col.search(query="kestrel falcon", mode="bm25", top_k=10)
        assert {h.source_changed for h in before.hits} == {False}
        notes = sorted({h.source for h in before.hits if h.source.startswith("notes/")})
        edited, deleted = corpus / notes[0], corpus / notes[1]
        edited.write_text(edited.read_text() + "More.\n")
        deleted.unlink()
        after = col.search(query="kestrel falcon", mode="bm25", top_k=10)
        flags = {h.source: h.source_changed for h in after.hits}
        assert flags[notes[0]] is True and flags[notes[1]] is True
        assert {v for k, v in flags.items() if k not in notes[:2]} == {False}
        restore = _validated(monkeypatch)
        checked = col.search(query="kestrel falcon", mode="bm25", top_k=10)
        restore()
    _same(after, checked)


def test_pdf_hits_carry_their_pages_on_the_fast_path(built, monkeypatch):
    corpus, index_dir = built
    with Collection.open("birds", index_dir=index_dir, base_dir=corpus) as col:
        fast = col.search(query="stoops speed compared", mode="bm25", top_k=3)
        restore = _validated(monkeypatch)
        checked = col.search(query="stoops speed compared", mode="bm25", top_k=3)
        restore()
    pdf = [h for h in fast.hits if h.source == "field.pdf"]
    assert pdf and pdf[0].page_start == 2 and pdf[0].page_end == 2
    _same(fast, checked)


def test_a_reader_never_gets_rows_another_search_cached(built, monkeypatch):
    """Rows read for a reader who may see everything stay in memory; a reader whose access
    list hides a document still never gets it, and gets what the validated path gives."""
    corpus, index_dir = built
    with Collection.open("birds", index_dir=index_dir, base_dir=corpus) as col:
        everything = col.search(query="kestrel merger", mode="bm25", top_k=10)
        assert "secret.md" in {h.source for h in everything.hits}
        anonymous = ScopedCollection(col, Reader(None, frozenset()))
        fast = anonymous.search(query="kestrel merger", mode="bm25", top_k=10)
        assert "secret.md" not in {h.source for h in fast.hits}
        alice = ScopedCollection(col, Reader("alice", frozenset()))
        assert "secret.md" in {h.source for h in alice.search(query="merger", mode="bm25").hits}
        restore = _validated(monkeypatch)
        checked = ScopedCollection(col, Reader(None, frozenset())).search(
            query="kestrel merger", mode="bm25", top_k=10)
        restore()
    _same(fast, checked)


def test_without_a_base_directory_hits_say_null_on_both_paths(built, monkeypatch):
    _corpus, index_dir = built
    with Collection.from_path(index_dir / "birds.sqlite3") as col:
        col.base_dir = None
        fast = col.search(query="kestrel", mode="bm25")
        restore = _validated(monkeypatch)
        checked = col.search(query="kestrel", mode="bm25")
        restore()
    assert {h.source_changed for h in fast.hits} == {None}
    _same(fast, checked)


def test_matched_terms_by_searchsorted_equals_membership_in_the_postings(built):
    """Every row id (and ids before the first and past the last posting) against a plain
    set-membership reference read from the file."""
    _corpus, index_dir = built
    query = "Kestrel FALCON falcon meadow marker2 the zzunknown speed"
    with Collection.open("birds", index_dir=index_dir) as col:
        top = col.query("SELECT max(id) FROM chunks")[0][0]
        rows = list(range(0, top + 3))
        got = col.matched_terms(query, rows)
        words = dict(bm25.query_words(query))
        holders = {}
        for word, term in words.items():
            found = col.query("SELECT p.chunk_ids FROM bm25_vocab v JOIN bm25_postings p "
                              "ON p.term_id = v.term_id WHERE v.term = ?", (term,))
            holders[word] = set(np.frombuffer(found[0][0], dtype=np.int32).tolist()) if found else set()
        want = [[w for w in words if r in holders[w]] for r in rows]
    assert got == want
    assert any(got) and any(len(m) > 1 for m in got)


def test_a_new_generation_is_read_from_its_own_rows(built):
    """Kept rows belong to one open collection (one published version): after a re-ingest,
    the collection opened on the new version serves the new text."""
    corpus, index_dir = built
    with Collection.open("birds", index_dir=index_dir, base_dir=corpus) as col:
        old = col.search(query="marker4", mode="bm25").hits[0]
    path = corpus / old.source
    path.write_text(path.read_text().replace("marker4", "marker4 osprey"))
    os.utime(path)
    ingest([corpus], collection="birds", index_dir=index_dir, embedder="none")
    with Collection.open("birds", index_dir=index_dir, base_dir=corpus) as col:
        new = col.search(query="marker4", mode="bm25").hits[0]
    assert "osprey" in new.content and "osprey" not in old.content
    assert new.matched_terms == ["marker4"] and new.source_changed is False


def test_the_modes_trusted_by_name_are_exactly_the_built_in_ones():
    """The request model and run_search skip the plugin hook for a built-in mode's name:
    only because no plugin can replace a built-in (modes.registered_modes registers them
    first). The names they trust must be exactly those."""
    from groundkit_datasette.retrieval import models, modes

    assert models._BUILTIN_MODE_NAMES == {m.name for m in modes.BUILTIN_MODES}
    assert gk_search._BUILTIN_BY_NAME == {m.name: m for m in modes.BUILTIN_MODES}
    assert all(modes.registered_modes()[m.name] is m for m in modes.BUILTIN_MODES)
