"""Helpers shared by the benchmark scripts: data sets, timing statistics, tables, memory."""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IRDATA = ROOT.parent / "shared" / "irdata"
CORPORA = ("cranfield", "nfcorpus_approx")
sys.path.insert(0, str(ROOT))
# LanceDB warns on stderr for every search that omits _distance from its columns: noise here.
os.environ.setdefault("LANCE_LOG", "error")


def irdata(name: str) -> Path:
    path = Path(os.environ.get("GROUNDKIT_IRDATA", IRDATA)) / name
    if not path.is_dir():
        sys.exit(f"data set not found: {path} (set GROUNDKIT_IRDATA to the irdata directory)")
    return path


def percentile(values, q: float) -> float:
    from groundkit_datasette.evaluation.evaluate import percentile as p

    return p(list(values), q)


def latency_stats(passes: list[list[float]]) -> tuple[float, float]:
    """(p50, p95) in ms: computed per pass over the queries, then the median over passes."""
    p50 = statistics.median(percentile(p, 0.5) for p in passes)
    p95 = statistics.median(percentile(p, 0.95) for p in passes)
    return p50, p95


def timed_passes(fn, queries, repeats: int) -> list[list[float]]:
    """Run ``fn(q)`` for every query, ``repeats`` times; per-call wall times in ms."""
    out = []
    for _ in range(repeats):
        times = []
        for q in queries:
            t = time.perf_counter()
            fn(q)
            times.append((time.perf_counter() - t) * 1000)
        out.append(times)
    return out


def rss_mb() -> float:
    """Current resident set size (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def ratio(ours, baseline) -> str:
    if ours is None or baseline in (None, 0):
        return "-"
    return f"{ours / baseline:.2f}"


def fmt(value, digits=3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(h) for h in headers]] + [[fmt(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def machine() -> str:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{platform.python_implementation()} {platform.python_version()}, {cpus} CPUs, load {load:.1f}"


def versions(*dists: str) -> str:
    """Installed versions of the baselines' distributions, for a run's header: `make bench`
    installs their newest releases, so two runs may compare against different code."""
    from importlib import metadata

    out = []
    for name in dists:
        try:
            out.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(f"{name} not installed")
    return ", ".join(out)


def run_worker(script: Path, args: list[str], timeout: float = 3600) -> dict:
    """Run ``script --worker ...`` in a fresh interpreter (clean memory figures); its last stdout line is JSON."""
    proc = subprocess.run(
        [sys.executable, str(script), "--worker", *args],
        capture_output=True, text=True, timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def chunk_texts(collection_path: Path) -> tuple[list[int], list[str], list[str]]:
    """(chunk row ids, texts as BM25 indexes them, document sources) of a collection."""
    import sqlite3

    from groundkit_datasette.indexing.ingest import embedding_text

    conn = sqlite3.connect(f"file:{collection_path}?immutable=1", uri=True)
    rows = conn.execute(
        "SELECT c.id, c.heading, c.content, d.source FROM chunks c JOIN documents d USING (document_id) ORDER BY c.id"
    ).fetchall()
    conn.close()
    return [r[0] for r in rows], [embedding_text(r[1], r[2]) for r in rows], [r[3] for r in rows]
