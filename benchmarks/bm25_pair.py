"""BM25 search against bm25s-numba with few variants interleaved (issue 14).

``bm25.py`` interleaves about twenty variants per pass, so each one starts its 300 queries
with the CPU caches the others left; here only the search as each surface runs it and the
baseline alternate, each with the query-token caches kept and not kept (bm25s keeps none).
CPU time per query of this process, median of the passes: the mean query of a pass and
the pass's median query (p50, the target's figure).

    python benchmarks/bm25_pair.py --collection nfcorpus_approx.sqlite3 --corpus nfcorpus_approx
    python benchmarks/bm25_pair.py --collection debian-docs.sqlite3   # synthetic queries
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _common as c  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collection", required=True, help="a collection .sqlite3")
    ap.add_argument("--corpus", help="irdata corpus whose queries to use (else synthetic queries)")
    ap.add_argument("--passes", type=int, default=7)
    args = ap.parse_args(argv)

    from benchmarks.bm25 import _bm25s_engine, synthetic_queries
    from groundkit_datasette.retrieval import bm25
    from groundkit_datasette.retrieval import search as S
    from groundkit_datasette.retrieval.collection import Collection
    from groundkit_datasette.retrieval.models import SearchRequest
    from groundkit_datasette.surfaces import serialize

    path = Path(args.collection)
    if args.corpus:
        from groundkit_datasette.evaluation.evaluate import load_dataset

        queries = list(load_dataset(c.irdata(args.corpus)).queries.values())
    else:
        queries = [t for _, t in synthetic_queries(path, 200)]
    col = Collection.from_path(path)
    ids, texts, _sources = c.chunk_texts(path)
    baseline, _ = _bm25s_engine(texts, ids, "numba")

    def request(q):
        return SearchRequest(query=q, mode="bm25", top_k=10)

    kept = {
        "Collection.search (Python API)": lambda q: col.search(query=q, mode="bm25", top_k=10),
        "JSON API: request validated, body": lambda q: serialize.body(S.search_plain(col, request(q))),
        "MCP: request validated, payload": lambda q: serialize.payload(S.search_plain(col, request(q))),
    }

    def not_kept(fn):
        def run(q):
            bm25.clear_query_caches()
            return fn(q)
        return run

    variants = dict(kept)
    variants.update({k + ", tokens not kept": not_kept(fn) for k, fn in kept.items()})
    variants["bm25s-numba retrieve (tokenizes every query)"] = lambda q: baseline(q, 10)
    for fn in variants.values():
        for q in queries:
            fn(q)
    cpu = {k: [] for k in variants}
    p50 = {k: [] for k in variants}  # the median query of each pass (the target's p50)
    labels = list(variants)
    for n in range(args.passes):
        for label in labels[n % len(labels):] + labels[:n % len(labels)]:
            fn = variants[label]
            used = []
            t = time.process_time()
            for q in queries:
                u = time.process_time()
                fn(q)
                used.append(time.process_time() - u)
            cpu[label].append((time.process_time() - t) / len(queries) * 1000)
            p50[label].append(sorted(used)[len(used) // 2] * 1000)
            if label.endswith("tokens not kept"):
                for q in queries:  # untimed: the kept variants find the queries' tokens kept
                    bm25.query_terms(q)
    med = {k: sorted(v)[len(v) // 2] for k, v in cpu.items()}
    mid = {k: sorted(v)[len(v) // 2] for k, v in p50.items()}
    label = "bm25s-numba retrieve (tokenizes every query)"
    base, base_p50 = med[label], mid[label]
    print(f"# {path.name}: {col.chunk_total():,} chunks, {len(queries)} queries; {c.machine()}; "
          f"{c.versions('bm25s', 'numba', 'PyStemmer')}; "
          f"CPU ms per query, median of {args.passes} passes: the mean query of a pass, and its "
          "median query (p50, what issue 14's target names; the two engines' spreads differ)")
    rows = [[k, v, base, v / base, mid[k], base_p50, mid[k] / base_p50,
             "met" if mid[k] / base_p50 <= 1.0 else "MISSED"] for k, v in med.items()]
    print(c.table(["what", "mean ms", "bm25s mean", "ratio", "p50 ms", "bm25s p50", "p50 ratio",
                   "p50 <= 1.0"], rows))


if __name__ == "__main__":
    main()
