"""BM25: ours against bm25s (numpy and numba backends), rank_bm25 and raw SQLite FTS5, in one run.

Every engine indexes the same chunk texts (read from our collection), answers the
same queries, and runs in a fresh interpreter so its memory figure is its own.
Latency: per-query wall time at k=10, p50/p95 per pass, median over passes.
nDCG@10: a separate depth-100 pass, chunks aggregated to documents by best rank.

    python benchmarks/bm25.py                         # both irdata corpora
    python benchmarks/bm25.py --collection big.sqlite3 --queries 200   # + a large collection
"""

from __future__ import annotations

import os
import sys

# Run as a script, this directory would lead sys.path and benchmarks/http_overhead.py would shadow the
# standard library's http package: put the repository root there instead.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import json
import random
import re
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks import _common as c  # noqa: E402

ENGINES = ("ours", "bm25s", "bm25s-numba", "rank_bm25", "fts5")
TOP_K = 10
DEPTH = 100


# -- workers (each in its own process) --------------------------------------------------


def _ranking_to_docs(chunk_rows, source_of_row, id_of_source):
    seen, out = set(), []
    for row in chunk_rows:
        doc = id_of_source.get(source_of_row.get(row))
        if doc is not None and doc not in seen:
            seen.add(doc)
            out.append(doc)
    return out


def _quality(search_rows, spec, source_of_row):
    """Mean nDCG@10 over judged queries, or None without qrels."""
    from groundkit_datasette.evaluation.evaluate import ndcg_at

    if not spec.get("qrels"):
        return None
    scores = []
    for qid, text in spec["queries"]:
        docs = _ranking_to_docs(search_rows(text, DEPTH), source_of_row, spec["id_of_source"])
        scores.append(ndcg_at(docs, spec["qrels"][qid], 10))
    return sum(scores) / len(scores)


PAIRED = "bm25s-numba, same process, interleaved"


def _no_matches(collection, query, hits, row_ids, allowed):
    return True


def _bm25s_engine(texts, ids, backend):
    """``(search_rows(q, k), build seconds)`` of a bm25s index over ``texts``."""
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer("english")
    t = time.perf_counter()
    corpus_tokens = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False)
    retriever = bm25s.BM25(k1=1.5, b=0.75, backend=backend)
    retriever.index(corpus_tokens, show_progress=False)
    build_s = time.perf_counter() - t
    del corpus_tokens
    n = len(texts)

    def search_rows(q, k):
        tokens = bm25s.tokenize([q], stopwords="en", stemmer=stemmer, show_progress=False, return_ids=False)
        if not tokens[0]:  # only stop words: the numba backend refuses an empty query
            return []
        docs, _scores = retriever.retrieve(tokens, k=min(k, n), show_progress=False,
                                           backend_selection=backend)
        return [ids[i] for i in docs[0]]

    return search_rows, build_s


def worker(engine: str, spec_file: str) -> dict:
    spec = json.loads(Path(spec_file).read_text())
    path = Path(spec["collection"])
    # Import first and load the texts: the memory figure is the index's, not the libraries'.
    import numpy  # noqa: F401

    import groundkit_datasette.retrieval.collection  # noqa: F401
    import groundkit_datasette.retrieval.search  # noqa: F401

    if engine.startswith("bm25s"):
        import bm25s  # noqa: F401
    elif engine == "rank_bm25":
        import rank_bm25  # noqa: F401
    texts_ids = texts = sources = None
    if engine != "ours":
        texts_ids, texts, sources = c.chunk_texts(path)
    queries = [t for _, t in spec["queries"]]
    repeats = spec["repeats"]
    out: dict = {"engine": engine}
    base_rss = c.rss_mb()

    if engine == "ours":
        from groundkit_datasette.retrieval import bm25
        from groundkit_datasette.retrieval.collection import Collection
        from groundkit_datasette.retrieval.rankers import bm25_ranked as _bm25_ranked

        t = time.perf_counter()
        col = Collection.from_path(path)
        out["open_s"] = time.perf_counter() - t

        def search(q):
            return col.search(query=q, mode="bm25", top_k=TOP_K)

        def ranked(q):
            return _bm25_ranked(col, q, TOP_K, None)

        def score_only(q):
            return col.bm25_scores(q)

        # The fixed cost of a response: from ranked row ids to serialised JSON, as run_search
        # and the JSON API do it (one lookup by row id, hits as plain dicts never validated
        # again, surfaces/serialize.py's body: the bytes the JSON API sends; adr/0038).
        from groundkit_datasette.retrieval import search as _search
        from groundkit_datasette.surfaces import serialize as _serialize

        from groundkit_datasette.retrieval.rankers import bm25_top_rows

        def rank_only(q):  # the ranking alone, to row ids: what bm25s's retrieve returns
            return bm25_top_rows(col, q, TOP_K + 1, None)

        ranked_ids = {q: rank_only(q) for q in queries}

        def untokenized(fn):
            def run(q):  # the query's tokens not kept from an earlier search (bm25s keeps none)
                bm25.clear_query_caches()
                return fn(q)
            return run

        def fields(q):  # ranked row ids to the response's fields, as a BM25 search builds them
            ids, scores = ranked_ids[q]
            rows = col.hit_rows("id", ids)  # in the order of ids
            page = rows[:TOP_K]
            ranked = list(zip([r.chunk_id for r in page], scores[:TOP_K]))
            parts = {cid: {"bm25": {"rank": i, "score": s}} for i, (cid, s) in enumerate(ranked, 1)}
            hits = _search._hit_dicts(col, ranked, page, parts, 1)
            return dict(
                collection=col.name, mode="bm25", generation=col.generation, top_k=TOP_K, offset=0,
                next_offset=TOP_K if len(ids) > TOP_K else None,
                top_score=scores[0] if scores else None, groups=None, reranked=False,
                rerank_model=None, rerank_depth=None, complete=True, lexical_match=True, note=None,
                timings_ms={"total_ms": 0.0}, hits=hits)

        def built(q):  # the response model (the Python API's answer)
            return _search.build_response(fields(q), trusted=True)

        def response(q):  # the JSON API's body: plain values written by orjson
            return _serialize.body(_search.plain_response(fields(q), True))

        def response_payload(q):  # MCP's structured result: the same plain values
            return _serialize.payload(_search.plain_response(fields(q), True))

        def response_models(q):  # the body from the models (model_dump_json): before adr/0038
            return _serialize.body(built(q))

        def response_before(q):  # the JSON API's body before serialize.py: json.dumps of a dict
            return json.dumps(built(q).model_dump(mode="json")).encode()

        def response_orjson_whole(q):  # orjson over the whole payload, no kept citation text
            import orjson

            return orjson.dumps(fields(q))

        def response_stdlib(q):  # the plain values written by the standard library instead
            return json.dumps(fields(q), ensure_ascii=False, separators=(",", ":")).encode()

        def no_stale_check(rows):
            return [None] * len(rows)

        def unchecked(fn):
            def run(q):
                # The stale check left out (not by clearing the base directory: that would drop
                # the open collection's kept stat answers for every other variant too).
                col.sources_changed = no_stale_check  # on this object only
                try:
                    return fn(q)
                finally:
                    del col.sources_changed
            return run

        response_unchecked = unchecked(response)

        from groundkit_datasette.retrieval.models import SearchRequest

        requests = {q: SearchRequest(query=q, mode="bm25", top_k=TOP_K) for q in queries}

        def search_json(q):  # the bytes the JSON API sends: the surfaces' plain path
            return _serialize.body(_search.search_plain(col, requests[q]))

        def search_mcp(q):  # MCP's structured result from the same path
            return _serialize.payload(_search.search_plain(col, requests[q]))

        def search_no_matches(q):  # issue 15: matched_terms and lexical_match left out
            saved, _search._add_matches = _search._add_matches, _no_matches
            try:
                return search(q)
            finally:
                _search._add_matches = saved

        def uncached(fn):
            def run(q):  # every hit row read from SQLite, as on a first query; the rows
                kept, col._hit_rows = col._hit_rows, {}  # the others read stay kept
                try:
                    return fn(q)
                finally:
                    col._hit_rows = kept
            return run

        search_rows_uncached, response_uncached = uncached(search), uncached(response)

        variants = {
            "search": search, "search + JSON body": search_json, "search, MCP payload": search_mcp,
            "search, matched_terms off": search_no_matches,
            "search, hit rows not cached": search_rows_uncached,
            "score+rank": ranked, "rank to row ids": rank_only, "score": score_only,
            "rank to row ids, tokens not kept": untokenized(rank_only),
            "search, tokens not kept": untokenized(search),
            "response": response, "response, no stale check": response_unchecked,
            "response, MCP payload, no stale check": unchecked(response_payload),
            "response, model (Python API), no stale check": unchecked(built),
            "response, orjson of the whole payload, no stale check": unchecked(response_orjson_whole),
            "response, stdlib json.dumps, no stale check": unchecked(response_stdlib),
            "response, model_dump_json (before adr/0038), no stale check": unchecked(response_models),
            "response, json.dumps(model_dump) (JSON API before)": response_before,
            "response, hit rows from SQLite": response_uncached,
        }
        for fn in variants.values():  # one warm-up pass each
            for q in queries:
                fn(q)
        out["mem_mb"] = c.rss_mb() - base_rss  # before a baseline joins this process
        if spec.get("paired"):
            # bm25s-numba in this same process, its passes interleaved with ours: the ratio
            # the target is judged on then compares the two under the same load.
            texts_ids, texts, sources = c.chunk_texts(path)
            baseline, _build_s = _bm25s_engine(texts, texts_ids, "numba")
            variants[PAIRED] = lambda q: baseline(q, TOP_K)
            for q in queries:
                baseline(q, TOP_K)
        # Interleaved passes: each pass runs every variant (and the baseline) over all the
        # queries, in an order rotated from pass to pass, so the machine's load falls on all of
        # them alike. (Alternating per query instead leaves every variant with cold caches:
        # bm25s-numba took 0.75 ms of CPU per query that way against 0.18-0.29 ms.)
        passes = {label: [] for label in variants}
        cpu = {label: [] for label in variants}
        labels = list(variants)
        for n in range(repeats):
            for label in labels[n % len(labels):] + labels[:n % len(labels)]:
                fn, wall, used = variants[label], [], []
                for q in queries:
                    t, u = time.perf_counter(), time.process_time()
                    fn(q)
                    used.append((time.process_time() - u) * 1000)
                    wall.append((time.perf_counter() - t) * 1000)
                passes[label].append(wall)
                cpu[label].append(used)
                if label.endswith("tokens not kept"):
                    # Untimed: give the queries' tokens back to the variants that keep them.
                    # Without this, the first of those to run after a clearing pass (in most
                    # passes "search") tokenized every query while labelled "kept".
                    for q in queries:
                        bm25.query_terms(q)
        out["variants"] = {label: c.latency_stats(p) for label, p in passes.items()}
        # CPU time per query (this process): on a loaded machine, the figure least moved by
        # other processes' work.
        out["cpu"] = {label: c.latency_stats(p) for label, p in cpu.items()}
        out["build_s"] = spec.get("ours_build_s")
        out["mem_note"] = "mem = RSS growth from open + all queries (the index stays on disk)"
        source_of_row = dict(col.query("SELECT c.id, d.source FROM chunks c JOIN documents d USING (document_id)"))
        row_of_chunk = dict(col.query("SELECT chunk_id, id FROM chunks"))
        out["ndcg"] = _quality(
            lambda q, k: [row_of_chunk[cid] for cid, _ in _bm25_ranked(col, q, k * 3, None)],
            spec, source_of_row,
        )
        if spec.get("paired"):
            out["paired_ndcg"] = _quality(lambda q, k: baseline(q, k * 3), spec,
                                          dict(zip(texts_ids, sources)))
        out["p50"], out["p95"] = out["variants"]["search"]
        return out

    source_of_row = dict(zip(texts_ids, sources))
    ids = texts_ids

    if engine.startswith("bm25s"):
        # "bm25s-numba": the JIT-compiled scorer and top-k bm25s offers when numba is installed.
        backend = "numba" if engine == "bm25s-numba" else "numpy"
        search_rows, out["build_s"] = _bm25s_engine(texts, ids, backend)

    elif engine == "rank_bm25":
        import numpy as np
        from rank_bm25 import BM25Okapi

        from groundkit_datasette.retrieval.bm25 import tokenize

        t = time.perf_counter()
        index = BM25Okapi([tokenize(x) for x in texts], k1=1.5, b=0.75)
        out["build_s"] = time.perf_counter() - t
        queries = queries[: spec["rank_bm25_queries"]]
        out["queries_timed"] = len(queries)

        def search_rows(q, k):
            scores = index.get_scores(tokenize(q))
            k = min(k, scores.size)
            top = np.argpartition(-scores, k - 1)[:k]
            return [ids[i] for i in top[np.argsort(-scores[top], kind="stable")]]

    elif engine == "fts5":
        import sqlite3

        from groundkit_datasette.retrieval.bm25 import STOP_WORDS

        db = Path(spec["work"]) / "fts5-baseline.sqlite3"
        db.unlink(missing_ok=True)
        t = time.perf_counter()
        conn = sqlite3.connect(db)
        conn.execute("CREATE VIRTUAL TABLE fts USING fts5(body, tokenize='porter unicode61')")
        with conn:
            conn.executemany("INSERT INTO fts(rowid, body) VALUES (?, ?)", zip(ids, texts))
        out["build_s"] = time.perf_counter() - t
        out["disk_mb"] = db.stat().st_size / 2**20

        def match(q, drop_stop):
            words = [w for w in re.findall(r"\w+", q.lower()) if not (drop_stop and w in STOP_WORDS)]
            return " OR ".join('"' + w + '"' for w in dict.fromkeys(words)) or '""'

        def rows_for(q, k, drop_stop=False):
            return [r[0] for r in conn.execute(
                "SELECT rowid FROM fts WHERE fts MATCH ? ORDER BY rank LIMIT ?", (match(q, drop_stop), k)
            )]

        search_rows = rows_for
        rows_for(queries[0], TOP_K)
        out["variants"] = {
            "OR": c.latency_stats(c.timed_passes(lambda q: rows_for(q, TOP_K), queries, repeats)),
            "OR, stop words removed": c.latency_stats(
                c.timed_passes(lambda q: rows_for(q, TOP_K, True), queries, repeats)
            ),
        }
        out["ndcg_variants"] = {
            "OR": _quality(lambda q, k: rows_for(q, k * 3), spec, source_of_row),
            "OR, stop words removed": _quality(lambda q, k: rows_for(q, k * 3, True), spec, source_of_row),
        }
        out["mem_mb"] = c.rss_mb() - base_rss
        out["p50"], out["p95"] = out["variants"]["OR"]
        out["ndcg"] = out["ndcg_variants"]["OR"]
        return out
    else:
        raise SystemExit(f"unknown engine {engine}")

    out["mem_mb"] = c.rss_mb() - base_rss
    search_rows(queries[0], TOP_K)
    out["p50"], out["p95"] = c.latency_stats(c.timed_passes(lambda q: search_rows(q, TOP_K), queries, repeats))
    out["ndcg"] = _quality(lambda q, k: search_rows(q, k * 3), spec, source_of_row)
    return out


# -- the parent ------------------------------------------------------------------------


def build_ours(dataset_dir: Path, work: Path, repeats: int):
    """BM25-only collection of the data set; median build time over ``repeats`` fresh builds."""
    from groundkit_datasette.evaluation.evaluate import load_dataset, write_sources
    from groundkit_datasette.indexing.ingest import Indexer

    ds = load_dataset(dataset_dir)
    sources = work / f"{ds.name}-sources"
    sync = write_sources(ds.corpus(), sources)
    times = []
    for i in range(repeats):
        index = work / f"index-{ds.name}"
        shutil.rmtree(index, ignore_errors=True)
        t = time.perf_counter()
        report = Indexer(ds.name, index_dir=index, base_dir=sources, embedder="none").ingest([sources])
        times.append(time.perf_counter() - t)
    times.sort()
    return ds, sync.id_of_source, index / f"{ds.name}.sqlite3", times[len(times) // 2], report.chunks_written


def synthetic_queries(collection: Path, n: int, seed: int = 1) -> list[tuple[str, str]]:
    """Queries for a collection without judgements: 2-6 words drawn from random chunks."""
    import sqlite3

    conn = sqlite3.connect(f"file:{collection}?immutable=1", uri=True)
    top = conn.execute("SELECT max(id) FROM chunks").fetchone()[0]
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        row = conn.execute("SELECT content FROM chunks WHERE id >= ? LIMIT 1", (rng.randint(1, top),)).fetchone()
        words = [w for w in re.findall(r"[A-Za-z]{3,}", row[0])] if row else []
        if len(words) >= 2:
            out.append((str(len(out)), " ".join(rng.sample(words, min(len(words), rng.randint(2, 6))))))
    conn.close()
    return out


def report_corpus(label, chunks, nq, results, ours_build_s) -> tuple[str, dict]:
    ours = results["ours"]
    v = ours["variants"]
    rows = []
    for name, (p50, p95) in v.items():
        if name.startswith("response"):
            continue
        if name == PAIRED:
            rows.append([PAIRED, None, None, p50, p95, ours.get("paired_ndcg")])
            continue
        rows.append([f"ours ({name})", ours_build_s if name == "search" else None,
                     ours["mem_mb"] if name == "search" else None, p50, p95,
                     ours["ndcg"] if name == "search" else None])
    for engine in ("bm25s", "bm25s-numba", "rank_bm25"):
        if engine in results:
            r = results[engine]
            rows.append([engine + (f" ({r['queries_timed']} queries)" if "queries_timed" in r else ""),
                         r["build_s"], r["mem_mb"], r["p50"], r["p95"], r["ndcg"]])
    if "fts5" in results:
        r = results["fts5"]
        for name, (p50, p95) in r["variants"].items():
            rows.append([f"fts5 {name}", r["build_s"] if name == "OR" else None,
                         r["mem_mb"] if name == "OR" else None, p50, p95, r["ndcg_variants"][name]])
    ours_p50 = v["search"][0]
    for row in rows:
        row.append(c.ratio(ours_p50, row[3]))
    text = [f"\n## {label}: {chunks} chunks, {nq} queries",
            c.table(["engine", "build s", "mem MB", "p50 ms", "p95 ms", "nDCG@10", "ours/this p50"], rows)]
    summary = {"chunks": chunks, "queries": nq, "rows": rows}
    summary["ours_p50"] = ours_p50
    # The target (issue 14): ours <= 1.0x bm25s with its fastest backend (numba), tokenizing
    # included on both sides, at equal nDCG@10 where judged. Judged on the interleaved run in
    # ours' own process when there is one (--paired), else on the separate worker.
    if PAIRED in v:
        base_p50, base_p95, base_ndcg, how = v[PAIRED][0], v[PAIRED][1], ours.get("paired_ndcg"), \
            "same process, passes interleaved"
    elif "bm25s-numba" in results:
        b = results["bm25s-numba"]
        base_p50, base_p95, base_ndcg, how = b["p50"], b["p95"], b["ndcg"], "separate processes"
    else:
        base_p50 = None
    if base_p50:
        r_search = ours_p50 / base_p50
        r_json = v["search + JSON body"][0] / base_p50
        r_raw = v["rank to row ids"][0] / base_p50
        ok = "met" if r_search <= 1.0 else "MISSED"
        text.append(f"target ours/bm25s-numba p50 <= 1.0 ({how}): Collection.search {r_search:.2f} "
                    f"({ok}); with the JSON body {r_json:.2f} "
                    f"({'met' if r_json <= 1.0 else 'MISSED'}); the ranking alone (to row ids) "
                    f"{r_raw:.2f}; p95 ratio {v['search'][1] / base_p95:.2f}")
        if ours["ndcg"] is not None and base_ndcg is not None:
            text.append(f"nDCG@10 ours {ours['ndcg']:.4f} vs bm25s-numba {base_ndcg:.4f} "
                        f"({'no worse' if ours['ndcg'] >= base_ndcg - 1e-9 else 'WORSE'})")
        summary.update(ratio_numba=r_search, ratio_numba_json=r_json, ratio_numba_raw=r_raw,
                       target_met=r_search <= 1.0)
    else:
        text.append("target ours/bm25s-numba p50 <= 1.0: not judged (bm25s-numba not run)")
    if "bm25s" in results:
        summary.update(ratio_numpy=ours_p50 / results["bm25s"]["p50"])
        text.append(f"ours/bm25s (numpy backend, the constructor default) p50: {summary['ratio_numpy']:.2f} "
                    "(for reference only)")
    cpu = ours.get("cpu")
    if cpu and PAIRED in cpu:
        b = cpu[PAIRED][0]
        text.append(f"CPU time per query p50 (same process): Collection.search {cpu['search'][0]:.3f} ms, "
                    f"with the JSON body {cpu['search + JSON body'][0]:.3f} ms, bm25s-numba "
                    f"{b:.3f} ms: ratios {cpu['search'][0] / b:.2f} "
                    f"({'met' if cpu['search'][0] <= b else 'MISSED'}) and "
                    f"{cpu['search + JSON body'][0] / b:.2f}; ranking alone "
                    f"{cpu['rank to row ids'][0] / b:.2f}; matched_terms off "
                    f"{cpu['search, matched_terms off'][0]:.3f} ms; response (no stale check) "
                    f"{cpu['response, no stale check'][0]:.3f} ms")
        # Side by side, CPU time from the same run: each row against bm25s-numba's retrieve.
        side = []
        for label, target in (("search", 1.0), ("search + JSON body", 1.0),
                              ("search, MCP payload", 1.0),
                              ("search, hit rows not cached", 1.0),
                              ("search, tokens not kept", 1.0), ("rank to row ids", None),
                              ("rank to row ids, tokens not kept", None),
                              ("search, matched_terms off", None)):
            r = cpu[label][0] / b
            side.append([f"ours: {label}", cpu[label][0], b, r,
                         "" if target is None else ("met" if r <= target else "MISSED")])
        for label in ("response, no stale check", "response, MCP payload, no stale check",
                      "response, model (Python API), no stale check",
                      "response, orjson of the whole payload, no stale check",
                      "response, stdlib json.dumps, no stale check",
                      "response, model_dump_json (before adr/0038), no stale check",
                      "response", "response, hit rows from SQLite",
                      "response, json.dumps(model_dump) (JSON API before)"):
            side.append([f"ours: {label}", cpu[label][0], None, None,
                         ("met" if cpu[label][0] <= 0.030 else "MISSED")
                         if label in ("response, no stale check",
                                      "response, MCP payload, no stale check") else ""])
        text.append("CPU ms per query, p50 (same process; response rows: target 0.030 ms)\n" + c.table(
            ["what", "ours", "bm25s-numba", "ratio", "target"], side))
        summary.update(cpu={k: val[0] for k, val in cpu.items()},
                       cpu_ratio=cpu["search"][0] / b,
                       cpu_ratio_json=cpu["search + JSON body"][0] / b)
    off = v["search, matched_terms off"][0]
    text.append(f"issue 15: search with matched_terms / lexical_match {ours_p50:.3f} ms vs without "
                f"{off:.3f} ms: {ours_p50 / off - 1:+.0%} ({'within' if ours_p50 <= off * 1.10 else 'OVER'} 10%)")
    cold = v["search, hit rows not cached"][0]
    text.append(f"search with every hit row read from SQLite (no row cache): {cold:.3f} ms"
                + (f" ({cold / base_p50:.2f}x bm25s-numba)" if base_p50 else ""))
    resp, bare = v["response"][0], v["response, no stale check"][0]
    sql = v["response, hit rows from SQLite"][0]
    text.append(f"target response fixed cost (ranked row ids -> JSON, {TOP_K} hits) p50 <= 0.030 ms: "
                f"{bare:.3f} ms ({'met' if bare <= 0.030 else 'MISSED'}); with the stale-hit stat per "
                f"document {resp:.3f} ms; with the stat and the rows read from SQLite {sql:.3f} ms")
    summary.update(response_ms=bare, response_stale_ms=resp, response_sql_ms=sql,
                   matched_terms_overhead=ours_p50 / off - 1)
    text.append(f"ours: collection opened in {ours['open_s'] * 1000:.1f} ms; {ours['mem_note']}")
    return "\n".join(text), summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", default=",".join(c.CORPORA), help="irdata corpora (comma-separated; '' for none)")
    ap.add_argument("--collection", action="append", default=[], help="an existing collection .sqlite3 to add")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--repeats", type=int, default=3, help="query passes (median over passes)")
    ap.add_argument("--build-repeats", type=int, default=3)
    ap.add_argument("--queries", type=int, default=200, help="synthetic queries for --collection")
    ap.add_argument("--rank-bm25-queries", type=int, default=100, help="rank_bm25 is slow: time this many")
    ap.add_argument("--work", help="work directory (default: a temporary one)")
    ap.add_argument("--paired", action="store_true",
                    help="also run bm25s-numba inside ours' process, passes interleaved (the "
                         "target is then judged on that ratio)")
    ap.add_argument("--json", dest="json_out", help="also write the figures to this JSON file")
    ap.add_argument("--worker", nargs=2, metavar=("ENGINE", "SPEC"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return

    engines = [e for e in args.engines.split(",") if e]
    work = Path(args.work or tempfile.mkdtemp(prefix="gk-bench-bm25-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"# BM25 benchmark ({c.machine()}, {time.strftime('%Y-%m-%d')}; "
          f"{c.versions('bm25s', 'numba', 'PyStemmer', 'rank_bm25')})")
    targets = []
    for name in [n for n in args.corpora.split(",") if n]:
        ds, id_of_source, path, build_s, chunks = build_ours(c.irdata(name), work, args.build_repeats)
        queries = [(q, ds.queries[q]) for q in ds.judged_queries]
        qrels = {q: ds.qrels[q] for q, _ in queries}
        targets.append((name, path, queries, qrels, id_of_source, build_s))
    for extra in args.collection:
        p = Path(extra).resolve()
        targets.append((p.stem, p, synthetic_queries(p, args.queries), None, {}, None))

    summaries = {}
    for label, path, queries, qrels, id_of_source, build_s in targets:
        spec = work / f"spec-{label}.json"
        spec.write_text(json.dumps({
            "collection": str(path), "queries": queries, "qrels": qrels, "id_of_source": id_of_source,
            "repeats": args.repeats, "rank_bm25_queries": args.rank_bm25_queries, "work": str(work),
            "ours_build_s": build_s, "paired": args.paired,
        }))
        results = {e: c.run_worker(Path(__file__), [e, str(spec)]) for e in engines}
        import sqlite3

        chunks = sqlite3.connect(f"file:{path}?immutable=1", uri=True).execute("SELECT count(*) FROM chunks").fetchone()[0]
        text, summary = report_corpus(label, chunks, len(queries), results, build_s)
        print(text, flush=True)
        summaries[label] = summary | {"results": results}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summaries, indent=2, default=str))


if __name__ == "__main__":
    main()
