"""The figures a user sees, for two checkouts of groundkit in one run: a refactor's before and after.

    python benchmarks/before_after.py --before /tmp/before --after .

Each measurement runs in a fresh interpreter whose ``sys.path`` starts with the checkout it
measures, and the two checkouts alternate round by round, so the machine's drift moves both
(this machine is noisy: medians of per-round figures, and the after/before ratio). Measured:

- ingest rate (chunks/s): a BM25-only ingest of cacm, and an ingest of med with the default
  embedder, each into an empty directory;
- query latency p50 (ms) over cisi's 112 queries on one collection (default embedder): the
  Python API (bm25, hybrid), the JSON API and MCP ``tools/call`` through Datasette's own
  in-process client (bm25, hybrid);
- cold start (s): a fresh ``groundkit search`` process, bm25 and hybrid, wall time to exit.

A figure is "met" when after/before is at most 1.10 (lower is better for every figure but the
ingest rates, where the ratio is inverted so that the rule reads the same).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IRDATA = Path(os.environ.get("GROUNDKIT_IRDATA", ROOT.parent / "shared" / "irdata"))

# Runs inside the measured checkout: only names both sides of a refactor still have.
_PRELUDE = r"""
import json, os, sys, time, statistics
sys.path.insert(0, sys.argv[1])
os.environ.setdefault("LANCE_LOG", "error")
try:
    from groundkit_datasette.evaluation.evaluate import load_dataset, write_sources
except ImportError:
    from groundkit_datasette.retrieval.evaluate import load_dataset, write_sources
try:
    from groundkit_datasette.indexing.ingest import Indexer
except ImportError:
    from groundkit_datasette.collection.ingest import Indexer
"""

_INGEST = _PRELUDE + r"""
dataset, index_dir, embedder = sys.argv[2], sys.argv[3], sys.argv[4]
sources = os.path.join(index_dir, "sources")
write_sources(load_dataset(dataset).corpus(), __import__("pathlib").Path(sources))
t = time.perf_counter()
report = Indexer("bench", index_dir=index_dir, embedder=embedder).ingest([sources])
elapsed = time.perf_counter() - t
print(json.dumps({"chunks_per_s": report.as_dict()["chunks_written"] / elapsed}))
"""

_QUERIES = _PRELUDE + r"""
import asyncio
from datasette.app import Datasette
from groundkit_datasette.retrieval.collection import Collection

dataset, index_dir = sys.argv[2], sys.argv[3]
queries = list(load_dataset(dataset).queries.values())
col = Collection.open("bench", index_dir=index_dir)
out = {}

def p50(fn):
    for q in queries[:10]:
        fn(q)
    times = []
    for q in queries:
        t = time.perf_counter()
        fn(q)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)

for mode in ("bm25", "hybrid"):
    out[f"Python API {mode} p50 ms"] = p50(lambda q: col.search(query=q, mode=mode, top_k=10))

ds = Datasette(metadata={"plugins": {"groundkit": {"index_dir": index_dir}}})
MCP = {"content-type": "application/json", "accept": "application/json, text/event-stream",
       "mcp-protocol-version": "2025-06-18"}

async def run():
    await ds.invoke_startup()
    for mode in ("bm25", "hybrid"):
        async def json_call(q):
            r = await ds.client.post("/bench/-/groundkit/search.json",
                                     content=json.dumps({"query": q, "mode": mode, "top_k": 10}),
                                     headers={"content-type": "application/json"})
            assert r.status_code == 200, r.text[:200]
        async def mcp_call(q):
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search",
                    "arguments": {"collection": "bench", "query": q, "mode": mode, "top_k": 10}}}
            r = await ds.client.post("/-/groundkit/mcp", content=json.dumps(body), headers=MCP)
            assert r.status_code == 200 and '"hits"' in r.text, r.text[:200]
        for label, fn in (("JSON API", json_call), ("MCP tools/call", mcp_call)):
            for q in queries[:10]:
                await fn(q)
            times = []
            for q in queries:
                t = time.perf_counter()
                await fn(q)
                times.append((time.perf_counter() - t) * 1000)
            out[f"{label} {mode} p50 ms"] = statistics.median(times)

asyncio.run(run())
print(json.dumps(out))
"""

_CLI = r"""
import sys
sys.path.insert(0, sys.argv[1])
from groundkit_datasette import cli
sys.argv = ["groundkit"] + sys.argv[2:]
getattr(cli, "main", cli.cli)()  # the console script's entry where the checkout has one
"""


def child(tree: Path, code: str, *args: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code, str(tree), *args], capture_output=True,
                            text=True, cwd=tempfile.gettempdir(), env=dict(os.environ, LANCE_LOG="error"))
    if result.returncode != 0:
        raise SystemExit(f"{tree}: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def cold_start(tree: Path, path: Path, mode: str) -> float:
    t = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", _CLI, str(tree), "search", str(path), "cosmic rays",
                             "--mode", mode, "--top-k", "5"], capture_output=True, text=True,
                            cwd=tempfile.gettempdir(), env=dict(os.environ, LANCE_LOG="error"))
    elapsed = time.perf_counter() - t
    if result.returncode != 0:
        raise SystemExit(f"{tree}: {result.stderr[-2000:]}")
    return elapsed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=ROOT)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cold", type=int, default=7, help="fresh processes per mode and side")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--cold-only", action="store_true", help="only the cold-start figures")
    args = parser.parse_args(argv)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    work = args.work or Path(tempfile.mkdtemp(prefix="groundkit-before-after-"))
    figures: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}

    def add(side, name, value):
        figures[side].setdefault(name, []).append(value)

    # The query collection, built once (by the before side: both read the same format).
    queries_dir = work / "queries"
    if not (queries_dir / "bench.sqlite3").exists():
        queries_dir.mkdir(parents=True, exist_ok=True)
        child(trees["before"], _INGEST, str(IRDATA / "cisi"), str(queries_dir), "minilm")
    for r in range(0 if args.cold_only else args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for side in order:
            for dataset, embedder, label in (("cacm", "none", "ingest cacm BM25-only chunks/s"),
                                             ("med", "minilm", "ingest med default embedder chunks/s")):
                target = work / f"ingest-{side}-{r}-{dataset}"
                shutil.rmtree(target, ignore_errors=True)
                target.mkdir(parents=True)
                add(side, label, child(trees[side], _INGEST, str(IRDATA / dataset), str(target),
                                       embedder)["chunks_per_s"])
                shutil.rmtree(target, ignore_errors=True)
            for name, value in child(trees[side], _QUERIES, str(IRDATA / "cisi"), str(queries_dir)).items():
                add(side, name, value)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    for i in range(args.cold):
        for side in (("before", "after") if i % 2 == 0 else ("after", "before")):
            for mode in ("bm25", "hybrid"):
                add(side, f"cold start {mode} s", cold_start(trees[side], queries_dir / "bench.sqlite3", mode))

    print(f"before: {trees['before']}\nafter:  {trees['after']}\n")
    print(f"| figure | before (median) | after (median) | after/before | within 10% |")
    print("| --- | --- | --- | --- | --- |")
    for name in figures["before"]:
        before = statistics.median(figures["before"][name])
        after = statistics.median(figures["after"][name])
        worse = before / after if "chunks/s" in name else after / before
        print(f"| {name} | {before:.3f} | {after:.3f} | {after / before:.2f} | "
              f"{'met' if worse <= 1.10 else 'MISSED'} |")


if __name__ == "__main__":
    main()
