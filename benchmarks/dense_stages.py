"""Where a public dense or hybrid call's time goes, stage by stage (process CPU time).

Wraps the stages of ``Collection.search`` (request validation, the dense and BM25 rankers,
fusion, hit rows, lexical match, response) with CPU-time counters and runs the same queries
as ``benchmarks/dense.py`` (query vector given, synthetic queries) over a collection built with
the synthetic embedder: the breakdown behind docs/performance.md, "Graph index".

    OPENBLAS_NUM_THREADS=1 python benchmarks/dense_stages.py /var/tmp/gk-dense/syn2/debian-docs.sqlite3
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import collections
import time
from pathlib import Path

from benchmarks import _common as c  # noqa: E402
from benchmarks import _synthetic as syn  # noqa: E402
from benchmarks import dense  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("collection", help="a collection .sqlite3 built with the synthetic embedder")
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    syn.register()
    from groundkit_datasette.retrieval import models, modes, rankers
    from groundkit_datasette.retrieval import search as S
    from groundkit_datasette.retrieval.collection import Collection

    acc = collections.defaultdict(float)

    def wrap(mod, name, label):
        f = getattr(mod, name)

        def timed(*a, **k):
            t = time.process_time()
            try:
                return f(*a, **k)
            finally:
                acc[label] += time.process_time() - t

        setattr(mod, name, timed)

    wrap(rankers, "dense_ranked", "dense ranker")
    wrap(rankers, "bm25_ranked", "BM25 ranker")
    wrap(rankers, "dense_complete", "dense_complete")
    wrap(rankers, "query_vector", "query vector check and normalising")
    wrap(S, "_hits", "hit rows and hits (_hits)")
    wrap(S, "_add_matches", "lexical_match (_add_matches)")
    wrap(S, "build_response", "build_response")
    wrap(modes, "fuse", "fuse")
    path = Path(args.collection)
    col = Collection.open(path.name.removesuffix(".sqlite3"), index_dir=path.parent)
    queries = syn.query_vectors(args.queries)
    texts = dense.query_texts(col, args.queries)
    search = col.vector_search()
    search.load()
    print(f"# Stages of a public call ({c.machine()}); {col.vector_count():,} vectors; "
          f"path: {type(search).__name__}{' with graph' if getattr(search, 'graph', None) is not None else ''}; "
          "process CPU ms per call")

    def request(mode, text, q):
        return models.SearchRequest(query=text if mode == "hybrid" else "vector query", mode=mode, top_k=10,
                                    vector=q.tolist())

    for mode in ("dense", "hybrid"):
        for text, q in zip(texts, queries):
            col.search(request(mode, text, q))
        acc.clear()
        total = validation = 0.0
        for _ in range(args.repeats):
            for text, q in zip(texts, queries):
                t0 = time.process_time()
                r = request(mode, text, q)
                t1 = time.process_time()
                col.search(r)
                t2 = time.process_time()
                validation += t1 - t0
                total += t2 - t0
        n = args.repeats * len(queries)
        rows = [["request validation (SearchRequest)", validation / n * 1000]]
        rows += [[k, v / n * 1000] for k, v in sorted(acc.items(), key=lambda kv: -kv[1])]
        rows.append(["the rest (run_search, RankContext)", (total - validation - sum(acc.values())) / n * 1000])
        rows.append(["total", total / n * 1000])
        print(f"\n## {mode}")
        print(c.table(["stage", "CPU ms per call"], rows))
    col.close()


if __name__ == "__main__":
    main()
