"""Requests per second through nginx with 1 and 2 `groundkit serve` replicas, 32 clients (issue 18).

The set-up is the shipped one (deploy/nginx/groundkit-replicas.conf, Debian's nginx, replicas on
loopback with a static token; tests/replica_support.py starts it). The load is wrk (Debian's
package: `apt-get install wrk`), 32 keep-alive connections on 2 threads, a BM25 search of a
synthetic 20,000-chunk collection (benchmarks/_synthetic.py). max_concurrent_searches is raised
to 64 so a replica queues nothing and refuses nothing at 32 clients (its default, 8, would answer
503 past 8 searches at once: counted here as errors). Same run, alternating rounds: 1 replica
asked directly (no nginx: the balancer's own cost), 1 replica and 2 replicas through nginx.

    nice -n 5 python benchmarks/replicas.py [--seconds 10] [--rounds 3] [--work /var/tmp/gk-scale/replicas]
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]  # benchmarks/http_overhead.py
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

from benchmarks import _common as c  # noqa: E402
from benchmarks import _synthetic  # noqa: E402
from tests.replica_support import TOKEN, Replicas, published_metadata  # noqa: E402

CLIENTS = 32


def wrk(url: str, seconds: int) -> tuple[float, int]:
    """(requests per second, responses that were not 2xx/3xx or failed)."""
    out = subprocess.run(["wrk", "-t", "2", "-c", str(CLIENTS), "-d", f"{seconds}s", "--timeout", "30s",
                          "-H", f"Authorization: Bearer {TOKEN}", url],
                         capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    bad = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses: (\d+)", out))
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if errors:
        bad += sum(int(n) for n in errors.groups())
    return rps, bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=20000)
    parser.add_argument("--work", default="/var/tmp/gk-scale/replicas")
    opts = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed: apt-get install wrk")
    print(c.machine())
    work = Path(opts.work)
    work.mkdir(parents=True, exist_ok=True)
    index, name, _report, _s = _synthetic.build_collection(work, opts.chunks, embedder="none")
    path = f"/{name}/-/groundkit/search.json?query=section+words+about+topic&mode=bm25&top_k=10"
    meta = published_metadata({"max_concurrent_searches": 64})
    results: dict[str, list] = {"1 replica, direct": [], "1 replica via nginx": [], "2 replicas via nginx": []}
    errors = {k: 0 for k in results}
    for _round in range(opts.rounds):
        for count in (1, 2):
            run = work / f"run{count}"
            shutil.rmtree(run, ignore_errors=True)
            run.mkdir()
            replicas = Replicas(run, index, count=count, metadata=meta)
            try:
                wrk(replicas.url + path, 2)  # warm: connections, page cache, first-query opens
                if count == 1:
                    rps, bad = wrk(f"http://127.0.0.1:{replicas.ports[0]}{path}", opts.seconds)
                    results["1 replica, direct"].append(rps)
                    errors["1 replica, direct"] += bad
                key = f"{count} replica{'s' if count > 1 else ''} via nginx"
                rps, bad = wrk(replicas.url + path, opts.seconds)
                results[key].append(rps)
                errors[key] += bad
            finally:
                replicas.close()
        print(f"round {_round + 1}: " + ", ".join(f"{k} {v[-1]:.0f}/s" for k, v in results.items()), flush=True)
    base = statistics.median(results["1 replica via nginx"])
    rows = [[k, statistics.median(v), errors[k], c.ratio(statistics.median(v), base)] for k, v in results.items()]
    print(c.table(["set-up (32 clients, BM25 search)", "requests/s (median)", "errors", "ratio to 1 via nginx"],
                  rows))


if __name__ == "__main__":
    main()
