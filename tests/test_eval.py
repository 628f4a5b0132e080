import gzip
import json
import random
import sqlite3

import pytest
import pytrec_eval
from click.testing import CliRunner

from groundkit_datasette.cli import cli
from groundkit_datasette.retrieval.collection import Collection
from groundkit_datasette.errors import InvalidRequest
from .test_ann import clustered  # noqa: F401  (the clustered embedder plugin)
from groundkit_datasette.evaluation.evaluate import (
    documents_from_chunks,
    evaluate,
    load_dataset,
    percentile,
    query_metrics,
    safe_file_name,
)


def _hand_made_run():
    """Graded qrels (with judged non-relevant documents) and a run deep enough for Recall@100."""
    rng = random.Random(7)
    qrels = {
        "q1": {"d1": 2, "d2": 1, "d9": 3, "d4": 0},
        "q2": {"a": 1},
        "q3": {"x1": 1, "x2": 2, "x3": 3, "x4": 1, "x5": 2, "x6": 1, "x7": 1, "x8": 3, "x9": 1,
               "x10": 2, "x11": 1, "x12": 4, "x150": 2},
        "q4": {"nothing": 1},  # never retrieved: every metric is 0
        "q5": {"late": 3, "d4": 0},
    }
    runs = {
        "q1": ["d1", "d3", "d2", "d4", "d5"],
        "q2": ["b", "c", "a"],
        "q3": [f"x{i}" for i in rng.sample(range(1, 200), 150)],
        "q4": ["y1", "y2"],
        "q5": [f"z{i}" for i in range(11)] + ["late"],  # relevant only at rank 12
    }
    return qrels, runs


def _scored(ranking):
    # Strictly decreasing scores: trec_eval orders by score, so the order is unambiguous.
    return {doc: float(len(ranking) - i) for i, doc in enumerate(ranking)}


def test_metrics_match_trec_eval():
    qrels, runs = _hand_made_run()
    full = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut_10", "recall_10", "recall_100"}).evaluate(
        {q: _scored(r) for q, r in runs.items()}
    )
    # trec_eval's recip_rank has no cut-off: MRR@10 is recip_rank over the top 10 only.
    top10 = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(
        {q: _scored(r[:10]) for q, r in runs.items()}
    )
    for q, ranking in runs.items():
        ours = query_metrics(ranking, qrels[q])
        assert ours["ndcg_at_10"] == pytest.approx(full[q]["ndcg_cut_10"], abs=1e-9), q
        assert ours["recall_at_10"] == pytest.approx(full[q]["recall_10"], abs=1e-9), q
        assert ours["recall_at_100"] == pytest.approx(full[q]["recall_100"], abs=1e-9), q
        assert ours["mrr_at_10"] == pytest.approx(top10[q]["recip_rank"], abs=1e-9), q
    # The hand-made run exercises the interesting cases, not only zeros and ones.
    assert 0 < query_metrics(runs["q3"], qrels["q3"])["recall_at_100"] < 1
    assert query_metrics(runs["q5"], qrels["q5"])["mrr_at_10"] == 0.0


def test_chunk_ranking_aggregates_to_documents_by_best_chunk():
    doc_of = {"c1": "A", "c2": "B", "c3": "A", "c4": "C", "c5": "B"}
    ranked = [("c1", 9.0), ("c3", 8.0), ("c2", 7.0), ("c5", 6.0), ("c9", 5.5), ("c4", 5.0)]
    assert documents_from_chunks(ranked, doc_of) == ["A", "B", "C"]


def test_percentile_interpolates_like_numpy():
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(values, 0.5) == 3.0
    assert percentile(values, 0.95) == pytest.approx(4.8)


def test_safe_file_names_stay_inside_and_unique():
    names = {safe_file_name(i) for i in ["MED-10", "../etc/passwd", "a/b", "a_b", "/abs", ".hidden", "\0x"]}
    assert len(names) == 7
    for n in names:
        assert "/" not in n and "\0" not in n and not n.startswith(".") and n.endswith(".txt")
    assert safe_file_name("MED-10") == "MED-10.txt"


CORPUS = [
    {"_id": "solar", "title": "Solar panels", "text": "Photovoltaic cells turn sunlight into electricity."},
    {"_id": "wind", "title": "Wind farms", "text": "Turbines convert moving air into rotation and power."},
    {"_id": "hydro", "title": "", "text": "Dams release water through turbines to make electricity."},
    {"_id": "bees", "title": "Honey bees", "text": "Bees pollinate flowers and make honey in hives."},
    {"_id": "odd/id", "title": "Bread", "text": "Yeast makes bread dough rise before baking."},
]
QUERIES = [
    {"_id": "1", "text": "sunlight electricity cells"},
    {"_id": "2", "text": "turbines"},
    {"_id": "3", "text": "how do bees make honey"},
    {"_id": "4", "text": "unjudged query"},
]
QRELS = [("1", "solar", 2), ("1", "hydro", 1), ("2", "wind", 1), ("2", "hydro", 2), ("3", "bees", 1),
         ("3", "odd/id", 0)]


def _write_dataset(root, corpus=CORPUS):
    (root / "qrels").mkdir(parents=True)
    with gzip.open(root / "corpus.jsonl.gz", "wt", encoding="utf-8") as f:
        for doc in corpus:
            f.write(json.dumps(doc) + "\n")
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUERIES))
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in QRELS)
    )
    return root


def test_load_dataset_reads_beir_layout(tmp_path):
    ds = load_dataset(_write_dataset(tmp_path / "tiny"))
    assert ds.judged_queries == ["1", "2", "3"]  # 4 has no qrels
    assert ds.qrels["3"] == {"bees": 1, "odd/id": 0}
    assert [d["_id"] for d in ds.corpus()] == [d["_id"] for d in CORPUS]


def test_eval_builds_a_real_collection_reuses_it_and_stores_runs(tmp_path):
    data = _write_dataset(tmp_path / "tiny")
    index = tmp_path / "index"
    report = evaluate(data, index_dir=index, embedder="none")
    assert report.collection == "tiny" and not report.reused
    assert [r.mode for r in report.results] == ["bm25"]
    bm25 = report.results[0]
    assert bm25.queries == 3 and bm25.top10_mismatches == 0
    # Every judged query finds its best document first on this corpus.
    assert bm25.mrr_at_10 == 1.0 and bm25.recall_at_100 == 1.0

    sources = index / "tiny-sources"
    # A titled document is Markdown with its title as the heading; an untitled one plain text.
    assert (sources / "solar.md").read_text() == "# Solar panels\n\nPhotovoltaic cells turn sunlight into electricity."
    assert (sources / "hydro.txt").read_text() == CORPUS[2]["text"]
    mtimes = {p.name: p.stat().st_mtime_ns for p in sources.iterdir()}

    # Eval collections are real collections: their citations verify.
    with Collection.open("tiny", index_dir=index) as col:
        hit = col.search(query="honey bees", mode="bm25").hits[0]
        assert hit.source == "bees.md"
        assert col.fetch_chunk(hit.chunk_id).verification.status == "verified"
        generation = col.generation

    again = evaluate(data, index_dir=index)
    assert again.reused and again.generation == generation
    assert {p.name: p.stat().st_mtime_ns for p in sources.iterdir()} == mtimes
    assert again.results[0].ndcg_at_10 == bm25.ndcg_at_10

    db = sqlite3.connect(index / "groundkit-eval.sqlite3")
    runs = db.execute("SELECT run_id, dataset, collection, generation, mode, ndcg_at_10 FROM runs").fetchall()
    assert [r[1:5] for r in runs] == [("tiny", "tiny", generation, "bm25")] * 2
    per_query = db.execute("SELECT query_id, ndcg_at_10, top_documents FROM query_results WHERE run_id = ?",
                           (runs[0][0],)).fetchall()
    assert sorted(q[0] for q in per_query) == ["1", "2", "3"]
    assert json.loads(dict((q[0], q[2]) for q in per_query)["3"])[0] == "bees"
    # The runs file is not mistaken for a collection.
    assert [n for n in CliRunner().invoke(cli, ["collections", "--index-dir", str(index)]).output.split()] == ["tiny"]


def test_eval_picks_up_a_changed_corpus(tmp_path):
    data = _write_dataset(tmp_path / "tiny")
    index = tmp_path / "index"
    first = evaluate(data, index_dir=index, embedder="none")
    changed = [d for d in CORPUS if d["_id"] != "wind"] + [{"_id": "tide", "title": "", "text": "Tides turn turbines."}]
    _write_dataset(tmp_path / "tiny2", changed)
    second = evaluate(tmp_path / "tiny2", collection="tiny", index_dir=index)
    assert not second.reused and second.generation == first.generation + 1
    names = sorted(p.name for p in (index / "tiny-sources").iterdir())
    assert "wind.md" not in names and "tide.txt" in names


def test_eval_cli_json_with_every_mode(tmp_path):
    data = _write_dataset(tmp_path / "tiny")
    index = tmp_path / "index"
    result = CliRunner().invoke(
        cli, ["eval", str(data), "--index-dir", str(index), "--runs-db", str(tmp_path / "runs.db"), "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [r["mode"] for r in report["results"]] == ["bm25", "dense", "hybrid"]
    for r in report["results"]:
        assert 0 < r["ndcg_at_10"] <= 1 and r["latency_p50_ms"] > 0
        assert r["top10_mismatches"] == 0
    rows = sqlite3.connect(tmp_path / "runs.db").execute("SELECT count(*) FROM query_results").fetchone()
    assert rows == (9,)


def test_eval_refuses_bad_options(tmp_path):
    data = _write_dataset(tmp_path / "tiny")
    with pytest.raises(InvalidRequest):
        evaluate(data, index_dir=tmp_path / "i", modes=["bm25", "sparse"])
    with pytest.raises(InvalidRequest):
        evaluate(data, index_dir=tmp_path / "i", embedder="none", modes=["dense"])
    result = CliRunner().invoke(cli, ["eval", str(data), "--index-dir", str(tmp_path / "i"), "--rerank"])
    assert result.exit_code != 0 and "reranker" in result.output


def test_a_documents_title_reaches_every_chunk(tmp_path):
    """A corpus title is the document's title for ingest: each chunk is found by it."""
    body = "\n\n".join(f"Paragraph {i} about aerofoil pressure measurements in the tunnel. " * 6 for i in range(8))
    data = _write_dataset(tmp_path / "long", [{"_id": "w1", "title": "Supersonic wing flutter", "text": body},
                                              *CORPUS])
    index = tmp_path / "index"
    evaluate(data, index_dir=index, embedder="none")
    with Collection.open("long", index_dir=index) as col:
        chunks = col.query("SELECT c.chunk_id FROM chunks c JOIN documents d USING (document_id) "
                           "WHERE d.source = 'w1.md'")
        assert len(chunks) >= 3
        hits = col.search(query="flutter", mode="bm25", top_k=20).hits
        assert {h.chunk_id for h in hits} == {c[0] for c in chunks}


def test_eval_takes_several_data_sets_in_one_command_and_records_settings(tmp_path):
    """``groundkit eval data/*``: every data set is scored, printed and stored in one batch."""
    from groundkit_datasette.retrieval import bm25

    first = _write_dataset(tmp_path / "data" / "tiny")
    second = _write_dataset(tmp_path / "data" / "other", CORPUS[:4])
    (tmp_path / "data" / "README.md").write_text("What the data sets are.\n")
    index, runs = tmp_path / "index", tmp_path / "runs.db"
    # As a shell expands data/*: the README is passed over.
    result = CliRunner().invoke(cli, ["eval", str(first), str(second), str(tmp_path / "data" / "README.md"),
                                      "--index-dir", str(index), "--embedder", "none", "--runs-db", str(runs)])
    assert result.exit_code == 0, result.output
    assert "skipping README.md: not a directory" in result.stderr
    summary = result.stdout.split("data set", 1)[1].splitlines()
    assert [line.split()[:2] for line in summary[1:3]] == [["tiny", "bm25"], ["other", "bm25"]]
    rows = sqlite3.connect(runs).execute("SELECT dataset, settings, batch FROM runs ORDER BY run_id").fetchall()
    assert [r[0] for r in rows] == ["tiny", "other"]
    assert rows[0][2] and rows[0][2] == rows[1][2]
    for _dataset, settings, _batch in rows:
        recorded = json.loads(settings)
        assert recorded["bm25"] == bm25.settings()
        assert recorded["chunker"] == {"chunk_size": 1000, "chunk_overlap": 100, "header": "title > headings"}
        assert recorded["embedder"] == "none" and recorded["depth"] == 100
        assert recorded["fusion"] == {"method": "rrf", "k": 60, "depth": 100}
    # The JSON form holds every report.
    again = CliRunner().invoke(cli, ["eval", str(first), str(second), "--index-dir", str(index),
                                     "--runs-db", str(runs), "--json"])
    assert [r["dataset"] for r in json.loads(again.stdout)["reports"]] == ["tiny", "other"]
    # One --collection cannot name two collections.
    refused = CliRunner().invoke(cli, ["eval", str(first), str(second), "--collection", "x",
                                       "--index-dir", str(index)])
    assert refused.exit_code == 2 and "one data set" in refused.output


def test_eval_carries_on_past_a_broken_data_set(tmp_path):
    good = _write_dataset(tmp_path / "data" / "tiny")
    broken = tmp_path / "data" / "broken"
    broken.mkdir()
    result = CliRunner().invoke(cli, ["eval", str(broken), str(good), "--index-dir", str(tmp_path / "i"),
                                      "--embedder", "none"])
    assert result.exit_code == 1
    assert "tiny" in result.stdout and "broken" in result.stdout and "corpus.jsonl" in result.stdout
    assert "Traceback" not in result.output


def test_an_older_runs_file_gains_the_settings_columns(tmp_path):
    data, index = _write_dataset(tmp_path / "tiny"), tmp_path / "index"
    evaluate(data, index_dir=index, embedder="none")
    db = sqlite3.connect(index / "groundkit-eval.sqlite3")
    with db:
        db.execute("ALTER TABLE runs DROP COLUMN settings")
        db.execute("ALTER TABLE runs DROP COLUMN batch")
    db.close()
    evaluate(data, index_dir=index)
    rows = sqlite3.connect(index / "groundkit-eval.sqlite3").execute("SELECT settings FROM runs").fetchall()
    assert rows[0] == (None,) and json.loads(rows[1][0])["depth"] == 100


def test_eval_ranks_an_ann_collection_as_deep_as_the_product(tmp_path, clustered, monkeypatch):
    """Eval used to cut dense lists on ANN collections to ef / refine (75 chunks), a limit the
    product no longer has: its hybrid fused 100 BM25 chunks with 75 dense ones, so eval's hybrid
    figure was not the product's (nfcorpus_approx: 0.3524 instead of 0.3538)."""
    from groundkit_datasette.indexing import vector_search
    from groundkit_datasette.indexing.ingest import ingest
    from groundkit_datasette.retrieval import rankers
    from groundkit_datasette.evaluation.evaluate import _ranked_chunks
    from groundkit_datasette.retrieval.models import SearchRequest
    from groundkit_datasette.retrieval.modes import fuse

    monkeypatch.setattr(vector_search, "EXACT_MAX_ROWS", 1000)  # through the ANN index, not numpy
    corpus = tmp_path / "c"
    corpus.mkdir()
    for f in range(30):
        (corpus / f"f{f}.txt").write_text("\n\n".join(f"record {f}-{i} of batch {f}" for i in range(120)))
    index_dir = tmp_path / "index"
    ingest([corpus], collection="big", index_dir=index_dir, embedder="clustered", chunk_size=50,
           chunk_overlap=0, ann_threshold=2000)
    with Collection.open("big", index_dir=index_dir) as col:
        assert col.status().ann_index
        query = "record batch 7"
        vector = rankers.query_vector(col, SearchRequest(query=query, mode="dense"))
        assert len(_ranked_chunks(col, query, "dense", 100, vector)) == 300
        product = fuse(rankers.bm25_ranked(col, query, 100, None),
                       rankers.dense_ranked(col, vector, 100, None))
        assert _ranked_chunks(col, query, "hybrid", 100, vector) == product
