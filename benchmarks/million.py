"""The limits of one machine: a collection of a million chunks against one of 100,000 (issue 18).

Synthetic on purpose (a real corpus would take days to embed here): the text is Zipf-distributed
words from a random 20,000-word vocabulary, about 100 words per chunk, and the vectors come from
the `synthetic` embedder (384 dimensions, clustered; benchmarks/_synthetic.py), registered
through the same hook a user's plugin uses. Everything else is the real code: ingest, the SQLite
collection, the BM25 postings, LanceDB and its ANN index, `Collection.search`.

For each size, each in a fresh interpreter (clean memory figures):
- ingest: wall time and peak RSS of a first ingest of the whole corpus;
- size on disk: `<name>.sqlite3` and `<name>.lance/`;
- cold open: process start to the first answered BM25 query (median of 3, page cache warm);
- BM25 and dense p50 over 50 queries each (median of 3 passes), and that process's peak RSS.
The 100,000-chunk collection is the baseline of the same run: the ratio shows how each figure
grows with ten times the chunks.

    nice -n 5 python benchmarks/million.py [--sizes 100000,1000000] [--work /var/tmp/gk-scale/million]
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]  # benchmarks/http_overhead.py
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from benchmarks import _common as c  # noqa: E402

HERE = Path(__file__).resolve()


def disk_mb(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 2**20
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def worker_ingest(work: Path, size: int, embedder: str) -> dict:
    import shutil

    from benchmarks import _synthetic

    # A first ingest each time; the synthetic sources are reused (they are deterministic).
    for p in (work / "index").glob(f"syn{size}-{embedder}.*"):
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    index, name, report, seconds = _synthetic.build_collection(work, size, embedder=embedder)
    return {"name": name, "index": str(index), "seconds": seconds, "chunks": report.chunks_written,
            "peak_rss_mb": c.peak_rss_mb()}


def worker_query(index: str, name: str, queries: int, modes: list[str]) -> dict:
    from benchmarks import _synthetic

    _synthetic.register()
    from groundkit_datasette.retrieval.collection import Collection

    col = Collection.open(name, index_dir=index)
    rng = random.Random(5)
    vocab = _synthetic._vocabulary(20000, random.Random(42))
    # Query words drawn like the corpus's (Zipf): the common ones have long posting lists.
    weights = [1.0 / (r + 1) for r in range(len(vocab))]
    texts = [" ".join(rng.choices(vocab, weights, k=3)) for _ in range(queries)]
    out = {}
    for mode in modes:
        col.search(query=texts[0], mode=mode, top_k=10)  # first query: opens the index
        passes = c.timed_passes(lambda q: col.search(query=q, mode=mode, top_k=10), texts, 3)
        out[f"{mode}_p50_ms"], out[f"{mode}_p95_ms"] = c.latency_stats(passes)
    out["peak_rss_mb"] = c.peak_rss_mb()
    return out


_COLD = """
import sys, time, json
t0 = time.perf_counter()
sys.path.insert(0, {root!r})
from benchmarks import _synthetic
_synthetic.register()
from groundkit_datasette.retrieval.collection import Collection
col = Collection.open({name!r}, index_dir={index!r})
r = col.search(query="section words", mode="bm25", top_k=10)
print(json.dumps({{"seconds": time.perf_counter() - t0, "hits": len(r.hits)}}), flush=True)
"""


def cold_open(index: str, name: str, repeats: int = 3) -> float:
    code = _COLD.format(root=str(HERE.parent.parent), name=name, index=index)
    runs = []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                              env=dict(os.environ, LANCE_LOG="error"))
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        runs.append(time.perf_counter() - t)
    return statistics.median(runs[1:])  # the first run warms the page cache


def main() -> None:
    if "--worker" in sys.argv:
        args = sys.argv[sys.argv.index("--worker") + 1:]
        if args[0] == "ingest":
            embedder = args[3] if len(args) > 3 else "synthetic"
            print(json.dumps(worker_ingest(Path(args[1]), int(args[2]), embedder)))
        else:
            modes = args[4].split(",") if len(args) > 4 else ["bm25", "dense"]
            print(json.dumps(worker_query(args[1], args[2], int(args[3]), modes)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--work", default="/var/tmp/gk-scale/million")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--embedder", default="synthetic",
                        help="'none' for BM25 only (no vectors, no dense figures)")
    opts = parser.parse_args()
    print(c.machine())
    work = Path(opts.work)
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    for size in (int(s) for s in opts.sizes.split(",")):
        ing = c.run_worker(HERE, ["ingest", str(work), str(size), opts.embedder], timeout=6 * 3600)
        index = Path(ing["index"])
        row = {
            "chunks": ing["chunks"],
            "ingest_s": ing["seconds"],
            "ingest_chunks_per_s": ing["chunks"] / ing["seconds"],
            "ingest_peak_rss_mb": ing["peak_rss_mb"],
            "sqlite_mb": disk_mb(index / f"{ing['name']}.sqlite3"),
            "lance_mb": disk_mb(index / f"{ing['name']}.lance") if opts.embedder != "none" else 0.0,
            "cold_open_s": cold_open(str(index), ing["name"]),
        }
        modes = ["bm25"] if opts.embedder == "none" else ["bm25", "dense"]
        q = c.run_worker(HERE, ["query", str(index), ing["name"], str(opts.queries), ",".join(modes)],
                         timeout=3600)
        row.update({k: v for k, v in q.items() if k != "peak_rss_mb"}, query_peak_rss_mb=q["peak_rss_mb"])
        results[size] = row
        print(json.dumps({size: row}), flush=True)
    table_of(results)


def table_of(results: dict) -> None:
    sizes = sorted(results, key=int)
    keys = list(results[sizes[0]])
    headers = ["figure"] + [f"{s:,} chunks" for s in sizes]
    if len(sizes) == 2:
        headers.append("ratio")
    rows = []
    for k in keys:
        r = [k] + [results[s][k] for s in sizes]
        if len(sizes) == 2:
            r.append(c.ratio(results[sizes[1]][k], results[sizes[0]][k]))
        rows.append(r)
    print(c.table(headers, rows))


if __name__ == "__main__":
    main()
