"""Two versions of the server side by side over real HTTP (adr/0058): JSON search and MCP
``tools/call`` p50 from one keep-alive ``http.client`` per server and surface, and MCP
``tools/call`` from the mcp SDK's own client (legacy and auto modes), in blocks.

Each variant is a ``datasette serve`` (uvicorn) process importing groundkit from its own
source tree (``git archive <commit> | tar -x -C DIR`` makes one), optionally with a patch
applied before it serves. Every variant is measured in the same rounds, so the machine's
drift moves all of them:

    python benchmarks/mcp_paths.py --index-dir I --collection C \\
        --variant "before=/tmp/before" --variant "before, SDK transport=/tmp/before:sdk" \\
        --variant "after=."

Patches (for trees that still have the names they set): ``sdk`` (``sdk-http`` after the split)
sets ``DIRECT_CALLS = False``; ``thread`` makes adr/0044's ``InlineCalls.brief`` always False
(every search in a thread, as adr/0058 then made it).
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from benchmarks import _common as c  # noqa: E402
from benchmarks.http_overhead import _connection, _timed, free_port, requests_for  # noqa: E402

PATCHES = {
    "": "",
    "sdk": "from groundkit_datasette.surfaces import mcp_server; mcp_server.DIRECT_CALLS = False",
    "sdk-http": "from groundkit_datasette.surfaces import mcp_http; mcp_http.DIRECT_CALLS = False",
    "thread": ("from groundkit_datasette.surfaces import inline_calls; "
               "inline_calls.InlineCalls.brief = lambda self, key: False"),
}

_SERVE = """
import sys
sys.path.insert(0, {tree!r})
{patch}
import groundkit_datasette
print("groundkit from", groundkit_datasette.__file__, file=sys.stderr, flush=True)
from datasette.cli import cli
sys.argv = ["datasette", "serve", "-h", "127.0.0.1", "-p", {port!r}, "-m", {meta!r},
            "--setting", "max_returned_rows", "100"]
cli()
"""


def start(tree: str, patch: str, index_dir: Path, work: Path, label: str):
    import httpx

    port = free_port()
    meta = work / "metadata.json"
    meta.write_text(json.dumps({"plugins": {"groundkit": {"index_dir": str(index_dir)}}}))
    code = _SERVE.format(tree=os.path.abspath(tree), patch="\n".join(PATCHES[p] for p in patch.split(":")), port=str(port), meta=str(meta))
    log = open(work / f"{label.replace(' ', '_').replace(',', '')}.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT,
                            cwd=os.path.abspath(tree), env=dict(os.environ, LANCE_LOG="error"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{label}: server exited; see {log.name}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/-/versions.json", timeout=1).status_code == 200:
                return proc, f"http://127.0.0.1:{port}"
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.terminate()
    raise RuntimeError(f"{label}: server did not start")


def _sdk_client(base: str, collection: str, mode: str, sdk_mode: str):
    """The mcp SDK's own client (what a Python MCP user runs), one session kept open:
    ``legacy`` speaks a handshake version (2025-11-25), ``auto`` speaks 2026-07-28."""
    from mcp.client import Client

    client = Client(base + "/-/groundkit/mcp", mode=sdk_mode, read_timeout_seconds=60)

    async def call(q):
        t = time.perf_counter()
        result = await client.call_tool("search", {"collection": collection, "query": q, "mode": mode,
                                                   "top_k": 10})
        return (time.perf_counter() - t) * 1000, not result.is_error and "hits" in (result.structured_content or {})

    return client, call


async def _measure(procs, args, queries):
    """Every (variant, surface) in turn, ``args.block`` requests at a time."""
    from contextlib import AsyncExitStack
    from random import Random

    shuffle = Random(35).shuffle

    senders = []
    async with AsyncExitStack() as stack:
        for label, _proc, base in procs:
            for surface, request in requests_for(args.collection, args.mode):
                conn = _connection(base)

                async def send(q, conn=conn, request=request):
                    return _timed(conn, request(q), b"hits")

                async def reopen(conn=conn, request=request):
                    # Not timed: opens the connection again if the server closed it while
                    # idle (uvicorn keeps one 5 s).
                    conn.close()
                    _timed(conn, request(queries[0]), b"hits")

                senders.append(((label, surface + " (http.client)"), send, reopen))
            for sdk_mode in ("legacy", "auto"):
                client, call = _sdk_client(base, args.collection, args.mode, sdk_mode)
                await stack.enter_async_context(client)

                async def nothing():
                    return None

                senders.append(((label, f"MCP tools/call (mcp SDK client, {sdk_mode})"), call, nothing))
        out = {key: [] for key, *_ in senders}
        errors = dict.fromkeys(out, 0)
        for start_at in [-len(queries), *range(0, args.requests, args.block)]:  # first a warm-up
            rounds = (range(start_at, 0) if start_at < 0
                      else range(start_at, min(start_at + args.block, args.requests)))
            order = list(senders)
            shuffle(order)  # no variant always follows the same neighbour
            for key, send, reopen in order:
                await reopen()
                for i in rounds:
                    ms, ok = await send(queries[i % len(queries)])
                    if start_at >= 0:
                        out[key].append(ms)
                        errors[key] += not ok
    return out, errors


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index-dir", required=True)
    ap.add_argument("--collection", required=True)
    ap.add_argument("--queries-from", default="nfcorpus_approx")
    ap.add_argument("--variant", action="append", required=True, help="label=tree[:patch[:patch]]")
    ap.add_argument("--requests", type=int, default=600, help="per variant and surface")
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--mode", default="bm25")
    args = ap.parse_args(argv)
    from groundkit_datasette.evaluation.evaluate import load_dataset

    ds = load_dataset(c.irdata(args.queries_from))
    queries = [ds.queries[q] for q in ds.judged_queries]
    work = Path(tempfile.mkdtemp(prefix="gk-bench-mcp-"))
    variants = []
    for spec in args.variant:
        label, _, rest = spec.partition("=")
        tree, _, patch = rest.partition(":")
        variants.append((label, tree, patch))
    procs = []
    try:
        for label, tree, patch in variants:
            proc, base = start(tree, patch, Path(args.index_dir), work, label)
            procs.append((label, proc, base))
        out, errors = asyncio.run(_measure(procs, args, queries))
    finally:
        for _label, proc, _base in procs:
            proc.terminate()
            proc.wait(30)
    print(f"# {c.machine()}, {time.strftime('%Y-%m-%d %H:%M')}; collection {args.collection}, mode {args.mode}, "
          f"{args.requests} requests per cell, 1 client, blocks of {args.block}")
    first = variants[0][0]
    rows = []
    for (label, surface), lat in out.items():
        p50 = c.percentile(lat, 0.5)
        rows.append([label, surface, p50, c.percentile(lat, 0.95), errors[(label, surface)],
                     c.ratio(p50, c.percentile(out[(first, surface)], 0.5))])
    print(c.table(["variant", "surface", "p50 ms", "p95 ms", "errors", f"p50 / {first}"], rows))


if __name__ == "__main__":
    main()
