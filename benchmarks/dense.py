"""Dense search: ours (LanceDB through a real collection) against exact numpy search.

Collections of synthetic chunks are built through the normal ingest path with a
synthetic embedder plugin (clustered random 384-d vectors), so no model runs and
query embedding is excluded, as the target is stated. For each size: p50/p95
of the public search call (``vector=`` given), of the raw LanceDB ranking, and
of exact numpy search (matrix-vector product + argpartition) over the same
vectors; recall@10 of ours against exact; whether an ANN index was used.

    python benchmarks/dense.py --sizes 10000,100000,200000 [--queries 200]
    python benchmarks/dense.py --sizes 1000000        # if time and memory allow
"""

from __future__ import annotations

import os
import sys

# Run as a script, this directory would lead sys.path and benchmarks/http.py would shadow the
# standard library's http package: put the repository root there instead.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks import _common as c  # noqa: E402
from benchmarks import _synthetic as syn  # noqa: E402


def ann_state(col) -> str:
    table = col.vectors()
    try:
        indices = [f"{i.index_type} on {','.join(i.columns)}" for i in table.list_indices()]
    except Exception:
        indices = []
    manifest = col.manifest.get("ann_index")
    return f"manifest ann_index={manifest!r}; lance indices: {indices or 'none'}"


def run_size(work: Path, size: int, nq: int, repeats: int) -> list:
    index, name, report, build_s = syn.build_collection(work, size)
    return run_collection(index, name, nq, repeats, f"{build_s:.1f} s ({report.chunks_per_second:.0f} chunks/s)")


def run_collection(index: Path, name: str, nq: int, repeats: int, built: str) -> list:
    import numpy as np

    from groundkit_datasette.retrieval.collection import Collection
    from groundkit_datasette.retrieval.rankers import dense_ranked as _dense_ranked

    syn.register()
    col = Collection.open(name, index_dir=index)
    table = col.vectors()
    t = time.perf_counter()
    data = table.to_arrow().select(["chunk_id", "vector"])
    ids = data.column("chunk_id").to_pylist()
    matrix = np.stack(data.column("vector").to_numpy(zero_copy_only=False)).astype(np.float32)
    load_s = time.perf_counter() - t
    queries = syn.query_vectors(nq)

    def exact(q, k=10):
        scores = matrix @ q
        top = np.argpartition(-scores, k)[:k]
        return top[np.argsort(-scores[top])]

    def raw(q):
        return _dense_ranked(col, q, 10, None)

    def public(q):
        return col.search(query="vector query", mode="dense", top_k=10, vector=q.tolist())

    public(queries[0])
    p_public = c.latency_stats(c.timed_passes(public, queries, repeats))
    p_raw = c.latency_stats(c.timed_passes(raw, queries, repeats))
    p_exact = c.latency_stats(c.timed_passes(exact, queries, repeats))
    recalls = []
    for q in queries:
        truth = {ids[i] for i in exact(q)}
        got = {cid for cid, _ in raw(q)}
        recalls.append(len(truth & got) / 10)
    recall = sum(recalls) / len(recalls)
    state = ann_state(col)
    col.close()
    return [name, len(ids), built, p_public, p_raw, p_exact, recall, state, load_s]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,200000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", help="directory for the synthetic collections (reused between runs)")
    ap.add_argument("--collection", action="append", default=[],
                    help="also an existing collection .sqlite3 built with --embedder synthetic")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="gk-bench-dense-"))
    print(f"# Dense benchmark ({c.machine()}, {time.strftime('%Y-%m-%d')}); {args.queries} queries, "
          f"{args.repeats} passes; query embedding excluded")
    results = [run_size(work, int(s), args.queries, args.repeats) for s in args.sizes.split(",") if s]
    for extra in args.collection:
        p = Path(extra)
        results.append(run_collection(p.parent, p.name.removesuffix(".sqlite3"), args.queries, args.repeats,
                                      "earlier"))
    rows, notes = [], []
    for name, n, built, pub, raw, ex, recall, state, load_s in results:
        rows.append([name, f"{n:,}", pub[0], pub[1], raw[0], ex[0], ex[1], c.ratio(pub[0], ex[0]), recall,
                     "met" if pub[0] <= 10 and recall >= 0.95 else "MISSED"])
        notes.append(f"{name}: {n:,} vectors; built {built}; numpy matrix loaded in {load_s:.1f} s; {state}")
    print(c.table(["collection", "vectors", "ours p50", "ours p95", "raw lance p50", "numpy p50", "numpy p95",
                   "ours/numpy p50", "recall@10", "p50<=10ms & recall>=0.95"], rows))
    print("\n".join(notes))


if __name__ == "__main__":
    main()
