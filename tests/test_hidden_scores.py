"""Issue 33.7: what a reader sees of a search (scores, ranks, counts, every field but timings)
is bit for bit the same whether or not documents it may not read exist, and whatever they
contain. Pairs of real collections (real ingests, access lists from a sidecar, a directory
file and front matter) differ only in their hidden documents; each reader's answers from the
two are compared with == (floats included), through the Python API and the JSON API, in every
mode (BM25, dense and hybrid over a deterministic test embedder, and each with a reranker).
"""

import json
import sqlite3

import numpy as np
import pytest
from datasette.app import Datasette

from groundkit_datasette import registry as gk_registry
from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.hookspecs import hookimpl
from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.retrieval.permissions import Reader, ScopedCollection

from .embedder_support import ClusteredEmbedder, embedder_plugin

NAME = "hs"  # every collection has the same name: the answers name it
DIMS = 384  # the width of the default model: the matrix-vector kernels it gets
CENTRES = np.random.default_rng(33).normal(size=(6, DIMS)).astype(np.float32)
VecPlugin = embedder_plugin("hs-vec", ClusteredEmbedder("hs-vec-384", CENTRES, 0.9))

WORDS = ("harbour ferry tide aurora beacon gull lantern quay pilot kelp dune cobble anchor "
         "mast signal drift reef").split()
QUERY_WORDS = {"harbour", "ferry", "tide", "aurora", "beacon", "gull", "lantern"}
# Words no query asks for: a hidden document "without the query words" has these instead.
FILLER = "cinder talc umber sorrel basalt loam quartz".split()


class Overlap:
    """A reranker that scores by the query words a text holds (deterministic, offline)."""

    name = "hs-overlap"
    model_name = "hs-overlap-1"

    def score(self, query, texts):
        words = set(query.lower().split())
        return [float(len(words & set(t.lower().split()))) + (len(t) % 97) / 1000 for t in texts]


class RerankPlugin:
    @staticmethod
    @hookimpl
    def register_rerankers(register):
        register("hs-overlap", Overlap)


@pytest.fixture(scope="module", autouse=True)
def plugins():
    gk_registry.pm.register(VecPlugin, name="hs-vec-test")
    gk_registry.pm.register(RerankPlugin, name="hs-overlap-test")
    yield
    gk_registry.pm.unregister(name="hs-vec-test")
    gk_registry.pm.unregister(name="hs-overlap-test")


def _text(rng, n_words, vocabulary=WORDS):
    words = rng.choice(vocabulary + ["notes", "about", "the", "coast"], size=n_words).tolist()
    lines = [" ".join(words[i:i + 12]) for i in range(0, len(words), 12)]
    return "\n\n".join(lines) + "\n"


def _public(root):
    rng = np.random.default_rng(1)
    for i in range(18):
        (root / f"p{i:02d}.txt").write_text(f"Public note {i}.\n\n" + _text(rng, int(rng.integers(8, 120))))
    (root / "p_dup_a.txt").write_text("harbour ferry tide\n")  # equal texts: tied scores
    (root / "p_dup_b.txt").write_text("harbour ferry tide\n")


def _team(root):
    rng = np.random.default_rng(2)
    (root / "team").mkdir()
    (root / "team" / ".groundkit-acl.json").write_text(json.dumps({"groups": ["team"]}))
    for i in range(5):
        (root / "team" / f"t{i}.txt").write_text(f"Team memo {i}.\n\n" + _text(rng, int(rng.integers(10, 90))))
    (root / "team" / "fm.md").write_text(  # front matter readable by the team as well
        "---\ngroundkit_acl:\n  groups: [team]\n---\n# Team plan\n\n" + _text(rng, 40))


def _secret_one(root, with_words: bool):
    """One hidden document (sidecar list), the same length either way."""
    rng = np.random.default_rng(3)
    text = _text(rng, 60, vocabulary=FILLER)
    if with_words:
        filler = iter(rng.choice(sorted(QUERY_WORDS), size=60).tolist())
        text = " ".join(next(filler) if w in FILLER and i % 2 else w
                        for i, w in enumerate(text.split(" ")))
    (root / "p05_secret.txt").write_text(text)
    (root / "p05_secret.txt.acl.json").write_text(json.dumps({"groups": ["secret"]}))


def _secret_many(root):
    """Many hidden documents of varied lengths, most holding query words, between the public
    ones in path order (so the readable chunks' row ids move), three ways of listing them."""
    rng = np.random.default_rng(4)
    for i in range(30):
        n = int(rng.choice([3, 15, 60, 240, 500]))
        text = _text(rng, n, vocabulary=WORDS + FILLER)
        kind = i % 3
        if kind == 0:
            (root / f"p{i % 18:02d}_s{i}.txt").write_text(text)
            (root / f"p{i % 18:02d}_s{i}.txt.acl.json").write_text(json.dumps({"users": ["zed"]}))
        elif kind == 1:
            (root / f"p{i % 18:02d}_s{i}.md").write_text(
                f"---\ngroundkit_acl:\n  groups: [secret]\n---\n# Hidden {i}\n\n{text}")
        else:
            d = root / "vault" / f"v{i}"
            d.mkdir(parents=True)
            (root / "vault" / ".groundkit-acl.json").write_text(json.dumps({"groups": ["secret"]}))
            (d / "note.txt").write_text(text)


VARIANTS = {
    "pub": (),
    "team": (_team,),
    "word": (_team, lambda r: _secret_one(r, True)),
    "noword": (_team, lambda r: _secret_one(r, False)),
    "many": (_team, _secret_many),
}


def _build(base, variant, edit=False):
    corpus = base / variant / "corpus"
    corpus.mkdir(parents=True)
    _public(corpus)
    for add in VARIANTS[variant]:
        add(corpus)
    index_dir = base / variant / "index"
    options = dict(collection=NAME, index_dir=index_dir, embedder="hs-vec", chunk_size=60,
                   chunk_overlap=0)
    ingest([corpus], **options)
    if edit:  # an incremental run: the stored weights keep the statistics they were made with
        (corpus / "p03.txt").write_text((corpus / "p03.txt").read_text() + "harbour gull quay\n")
        ingest([corpus], **options)
    return corpus, index_dir


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("hidden-scores")
    out = {v: _build(base, v) for v in VARIANTS}
    out["team-edited"] = _build(base / "edited", "team", edit=True)
    out["many-edited"] = _build(base / "edited", "many", edit=True)
    return out


ANONYMOUS = Reader(None, frozenset())
TEAM = Reader("sam", frozenset({"team"}))
ACTORS = {ANONYMOUS: None, TEAM: {"id": "sam", "groups": ["team"]}}

# (reader, the collection with hidden documents, the one without them or with other ones)
PAIRS = [
    (ANONYMOUS, "word", "noword"),  # one hidden document holds the query words or not
    (TEAM, "word", "noword"),
    (ANONYMOUS, "many", "pub"),  # many hidden documents against none (nothing protected)
    (ANONYMOUS, "team", "pub"),
    (TEAM, "many", "team"),  # against none hidden from this reader (some have lists)
    (TEAM, "many-edited", "team-edited"),  # after an incremental ingest
    (ANONYMOUS, "many-edited", "team-edited"),
]

QUERIES = ["harbour", "ferry ferry tide", "aurora beacon", "harbour ferry tide",
           "the harbour ferry tide aurora beacon gull lantern quay", "Gull", "cinder talc",
           "lantern kelp reef drift signal mast anchor cobble dune pilot quay"]

REQUESTS = [dict(top_k=5), dict(top_k=3, offset=3), dict(top_k=4, source="p1"),
            dict(top_k=6, group_by_document=True), dict(top_k=5, min_score=0.3),
            dict(top_k=5, rerank=True)]


def _requests():
    for mode in ("bm25", "dense", "hybrid"):
        for query in QUERIES:
            for extra in REQUESTS:
                yield dict(query=query, mode=mode, **extra)


def _without_timings(answer: dict) -> dict:
    return {k: v for k, v in answer.items() if k not in ("timings_ms", "request_id")}


# Whether a collection has access lists is visible to every reader (its Datasette table and
# SQL pages are closed, and ingest's file lists are withheld: None, not a list): the one
# difference between a collection without any and one with documents hidden from the reader.
PROTECTION_SIGNAL = ("skipped_files", "failed_files")


def _status(answer: dict) -> dict:
    answer = dict(answer)
    answer.pop("request_id", None)
    last = answer.get("last_ingest")
    if last:
        answer["last_ingest"] = {k: v for k, v in last.items()
                                 if k != "ingested_at" and k not in PROTECTION_SIGNAL}
    return answer


def _differences(a, b, path=""):
    """Where two answers differ (floats compared with ==, not approximately)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}: keys {sorted(set(a) ^ set(b))}"] if set(a) != set(b) else []
        for k in a.keys() & b.keys():
            out += _differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    if type(a) is not type(b) or a != b:
        return [f"{path}: {a!r} != {b!r}"]
    return []


def test_the_pairs_differ_only_in_hidden_documents(built):
    """The fixture is what the comparisons need: the hidden documents are there (and do hold
    the query words where they should), and the edited pair really kept stale weights."""
    for variant, hidden_docs in (("word", 1), ("noword", 1), ("many", 30), ("team", 0)):
        with Collection.open(NAME, index_dir=built[variant][1]) as col:
            acl = dict(col.query("SELECT source, acl FROM documents"))
            secret = [s for s, a in acl.items() if a and ("secret" in a or "zed" in a)]
            assert len(secret) == hidden_docs, (variant, secret)
    with Collection.open(NAME, index_dir=built["word"][1]) as col:
        assert "aurora" in col.query("SELECT content FROM chunks c JOIN documents d USING "
                                     "(document_id) WHERE d.source = 'p05_secret.txt'")[0][0]
    for variant in VARIANTS:
        with Collection.open(NAME, index_dir=built[variant][1]) as col:
            last = col.status().last_ingest
            assert (last.skipped_files is None) is (variant != "pub"), variant
    with Collection.open(NAME, index_dir=built["team-edited"][1]) as col:
        stored = json.loads(col.manifest["bm25_stats"])
        lengths = [r[0] for r in col.query("SELECT length FROM bm25_chunk_terms")]
        assert stored["avgdl"] != sum(lengths) / len(lengths)  # kept: not re-weighted


@pytest.mark.parametrize("reader,hidden,plain", PAIRS,
                         ids=[f"{'anonymous' if r.user is None else 'team'}-{a}-vs-{b}"
                              for r, a, b in PAIRS])
def test_python_api_answers_do_not_depend_on_hidden_documents(built, reader, hidden, plain):
    checked = 0
    with Collection.open(NAME, index_dir=built[hidden][1], reranker=Overlap()) as a, \
            Collection.open(NAME, index_dir=built[plain][1], reranker=Overlap()) as b:
        view_a, view_b = ScopedCollection(a, reader), ScopedCollection(b, reader)
        assert _differences(_status(view_a.status().model_dump(mode="json")),
                            _status(view_b.status().model_dump(mode="json"))) == []
        for request in _requests():
            got_a = _without_timings(view_a.search(**request).model_dump(mode="json"))
            got_b = _without_timings(view_b.search(**request).model_dump(mode="json"))
            assert _differences(got_a, got_b) == [], request
            checked += len(got_a["hits"])
    assert checked > 500


def _readable_vectors(col, reader) -> list[list[float]]:
    """The vectors of every chunk ``reader`` may read, in chunk id order."""
    data = col.vectors().to_arrow().select(["chunk_id", "document_id", "vector"]).to_pydict()
    hidden = set(ScopedCollection(col, reader).access().hidden_documents
                 if ScopedCollection(col, reader).access() else ())
    return [v for _c, d, v in sorted(zip(data["chunk_id"], data["document_id"], data["vector"]))
            if d not in hidden]


@pytest.mark.parametrize("reader,hidden,plain", PAIRS[:5],
                         ids=[f"{'anonymous' if r.user is None else 'team'}-{a}-vs-{b}"
                              for r, a, b in PAIRS[:5]])
def test_dense_scores_of_every_readable_chunk_do_not_depend_on_hidden_documents(
        built, reader, hidden, plain):
    """Each readable chunk's own vector as the query: its score (and its neighbours') wherever
    its row sits in the matrix: hidden rows before or after it move it."""
    with Collection.open(NAME, index_dir=built[hidden][1]) as a, \
            Collection.open(NAME, index_dir=built[plain][1]) as b:
        vectors = _readable_vectors(b, reader)
        assert len(vectors) > 60
        view_a, view_b = ScopedCollection(a, reader), ScopedCollection(b, reader)
        for mode in ("dense", "hybrid"):
            for v in vectors:
                request = dict(query="harbour gull", mode=mode, top_k=4, vector=v)
                got_a = _without_timings(view_a.search(**request).model_dump(mode="json"))
                got_b = _without_timings(view_b.search(**request).model_dump(mode="json"))
                assert _differences(got_a, got_b) == [], (mode, v[:3])


def make_ds(corpus, index_dir):
    return Datasette(files=[], immutables=[str(index_dir / f"{NAME}.sqlite3")], secret="hs-test",
                     metadata={"plugins": {"groundkit": {"base_dir": str(corpus),
                                                         "reranker": "hs-overlap"}}})


async def _json(ds, reader, path, body=None):
    actor = ACTORS[reader]
    cookies = {"ds_actor": ds.sign({"a": actor}, "actor")} if actor else {}
    if body is None:
        r = await ds.client.get(path, cookies=cookies)
    else:
        r = await ds.client.post(path, content=json.dumps(body), cookies=cookies,
                                 headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("reader,hidden,plain", PAIRS[:5],
                         ids=[f"{'anonymous' if r.user is None else 'team'}-{a}-vs-{b}"
                              for r, a, b in PAIRS[:5]])
async def test_json_api_answers_do_not_depend_on_hidden_documents(built, reader, hidden, plain):
    ds_a, ds_b = make_ds(*built[hidden]), make_ds(*built[plain])
    status = f"/{NAME}/-/groundkit/status.json"
    assert _differences(_status(await _json(ds_a, reader, status)),
                        _status(await _json(ds_b, reader, status))) == []
    checked = 0
    for request in _requests():
        path = f"/{NAME}/-/groundkit/search.json"
        got_a = _without_timings(await _json(ds_a, reader, path, request))
        got_b = _without_timings(await _json(ds_b, reader, path, request))
        assert _differences(got_a, got_b) == [], request
        checked += len(got_a["hits"])
    assert checked > 500


def test_a_reader_who_sees_everything_gets_the_stored_figures(built):
    """The other side: nothing hidden from the reader of an unprotected collection, so the
    stored weights answer (the common case keeps its fast path and its numbers)."""
    with Collection.open(NAME, index_dir=built["pub"][1]) as col:
        plain = col.search(query="harbour ferry tide", mode="bm25", top_k=10)
        scoped = ScopedCollection(col, ANONYMOUS).search(query="harbour ferry tide", mode="bm25",
                                                         top_k=10)
        assert [(h.chunk_id, h.score) for h in plain.hits] == \
            [(h.chunk_id, h.score) for h in scoped.hits]
        conn = sqlite3.connect(built["pub"][1] / f"{NAME}.sqlite3")
        try:
            term = conn.execute("SELECT term_id FROM bm25_vocab WHERE term = 'harbour'").fetchone()[0]
            ids, weights = conn.execute("SELECT chunk_ids, weights FROM bm25_postings WHERE term_id = ?",
                                        (term,)).fetchone()
        finally:
            conn.close()
        stored = dict(zip(np.frombuffer(ids, np.int32).tolist(),
                          np.frombuffer(weights, np.float32).tolist()))
        one = col.search(query="harbour", mode="bm25", top_k=3)
        rows = dict(col.query("SELECT chunk_id, id FROM chunks"))
        assert [h.score for h in one.hits] == [stored[rows[h.chunk_id]] for h in one.hits]


def _partial_vectors(tmp_path, name: str, hidden_docs: int):
    """A collection with ``hidden_docs`` hidden documents whose public ferries document lost
    its vectors (a partial table, published by hand as tests/test_cli.py does)."""
    from groundkit_datasette.indexing.vectors import open_table

    docs = tmp_path / name / "docs"
    (docs / "hr").mkdir(parents=True)
    (docs / "hr" / ".groundkit-acl.json").write_text(json.dumps({"groups": ["hr"]}))
    for i in range(hidden_docs):
        (docs / "hr" / f"memo{i}.txt").write_text(f"Salary bands, memo {i}.\n")
    (docs / "public.txt").write_text("The canteen opens at noon.\n")
    (docs / "ferries.txt").write_text("Ferries leave the harbour every hour.\n")
    index = tmp_path / name / "index"
    ingest([docs], collection=NAME, index_dir=index, embedder="hs-vec")
    path = index / f"{NAME}.sqlite3"
    table = open_table(index / f"{NAME}.lance")
    conn = sqlite3.connect(path)
    with conn:
        (ferries,) = conn.execute("SELECT document_id FROM documents WHERE source = 'ferries.txt'").fetchone()
        table.delete(f"document_id = '{ferries}'")
        conn.execute("UPDATE groundkit_manifest SET value = ? WHERE key = 'lance_version'",
                     (str(table.version),))
    conn.close()
    return index


def test_the_vector_coverage_reason_counts_only_readable_chunks(tmp_path):
    """index_status's dense_unavailable_reason names counts: the reader's, like its other
    counts, so one or five hidden documents read the same."""
    one, five = _partial_vectors(tmp_path, "one", 1), _partial_vectors(tmp_path, "five", 5)
    with Collection.open(NAME, index_dir=one) as a, Collection.open(NAME, index_dir=five) as b:
        assert "vectors cover 6 of 7 chunks" in b.status().dense_unavailable_reason
        seen_a = ScopedCollection(a, ANONYMOUS).status().model_dump(mode="json")
        seen_b = ScopedCollection(b, ANONYMOUS).status().model_dump(mode="json")
        assert (seen_b["vectors"], seen_b["chunks"], seen_b["dense_available"]) == (1, 2, False)
        assert "vectors cover 1 of 2 chunks" in seen_b["dense_unavailable_reason"]
        assert _differences(_status(seen_a), _status(seen_b)) == []
