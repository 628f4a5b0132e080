"""HTTP surfaces: JSON search and MCP ``tools/call`` over streamable HTTP, against the library call
and against Datasette's own ``GET /<db>/chunks.json?_search=`` table search.

A real ``datasette serve`` (uvicorn) runs on 127.0.0.1 in its own process with the
groundkit plugin; httpx async clients send the same queries with 1, 8 and 32
concurrent clients for a bounded number of requests. The library baseline is
``Collection.search`` in this process (threads for concurrency). Reported per
surface and level: p50/p95 latency, throughput, errors.

Issue 14's target (what HTTP adds to the library call, 1 client) is judged on a keep-alive
stdlib ``http.client`` measured in blocks with the library call and a no-work server, so
the machine's drift moves all of them (``interleaved``). The same requests are also timed
in this process through ``Datasette(...).client``: the server's own cost, with the MCP call
answered in the request's task and through the SDK's transport (``in_process``).

    python benchmarks/http_overhead.py [--requests 400] [--levels 1,8,32] [--mode bm25]
"""

from __future__ import annotations

import os
import sys

# Run as a script, this directory would lead sys.path: put the repository root there instead,
# so ``benchmarks`` imports as a package (as ``python -m benchmarks.http_overhead`` does).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

from benchmarks import _common as c  # noqa: E402

MCP_HEADERS = {
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": "2025-06-18",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(index_dir: Path, work: Path):
    port = free_port()
    meta = work / "http-metadata.json"
    meta.write_text(json.dumps({"plugins": {"groundkit": {"index_dir": str(index_dir)}}}))
    datasette = Path(sys.executable).with_name("datasette")
    log = open(work / "datasette.log", "w")
    proc = subprocess.Popen(
        [str(datasette), "serve", "-h", "127.0.0.1", "-p", str(port), "-m", str(meta),
         "--setting", "max_returned_rows", "100"],
        stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, LANCE_LOG="error"),
    )
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"datasette exited; see {work / 'datasette.log'}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/-/versions.json", timeout=1).status_code == 200:
                return proc, f"http://127.0.0.1:{port}"
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.terminate()
    raise RuntimeError("datasette did not start")


def requests_for(name: str, mode: str):
    """(label, fn(query) -> (method, path, body bytes, headers)): one request per search, for
    both clients."""
    counter = iter(range(1, 10**9))

    def json_search(q):
        return ("POST", f"/{name}/-/groundkit/search.json",
                json.dumps({"query": q, "mode": mode, "top_k": 10}).encode(), {"content-type": "application/json"})

    def mcp_call(q):
        body = {"jsonrpc": "2.0", "id": next(counter), "method": "tools/call",
                "params": {"name": "search", "arguments": {"collection": name, "query": q, "mode": mode, "top_k": 10}}}
        return "POST", "/-/groundkit/mcp", json.dumps(body).encode(), MCP_HEADERS

    return [("JSON search.json", json_search), ("MCP tools/call", mcp_call)]


def surfaces(name: str, mode: str):
    """(label, async fn(client, query) -> ok) for each HTTP surface, through httpx."""
    (_, json_request), (_, mcp_request) = requests_for(name, mode)

    async def send(client, request):
        method, path, body, headers = request
        return await client.request(method, path, content=body, headers=headers)

    async def json_search(client, q):
        r = await send(client, json_request(q))
        return r.status_code == 200 and "hits" in r.json()

    async def mcp_call(client, q):
        r = await send(client, mcp_request(q))
        if r.status_code != 200:
            return False
        text = r.text
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            text = "".join(line[5:] for line in text.splitlines() if line.startswith("data:"))
        result = json.loads(text).get("result") or {}
        return not result.get("isError") and "hits" in (result.get("structuredContent") or {})

    async def datasette_fts(client, q):
        r = await client.get(f"/{name}/chunks.json", params={"_search": q, "_size": 10, "_shape": "objects"})
        return r.status_code == 200

    return [("JSON search.json", json_search), ("MCP tools/call", mcp_call), ("Datasette ?_search=", datasette_fts)]


# A loopback HTTP server that does no work: what the load generator costs by itself.
_FLOOR_SERVER = r"""
import asyncio, sys
async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if length:
                await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


def start_floor_server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _FLOOR_SERVER, str(port)], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    return proc, f"http://127.0.0.1:{port}"


def _connection(base_url: str):
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(base_url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=60)


def _timed(conn, request, check: bytes) -> tuple[float, bool]:
    """One request: (ms, ok). A dropped keep-alive connection counts as an error and is
    opened again (http.client reconnects on the next request), not the end of the run."""
    import http.client

    method, path, body, headers = request
    t = time.perf_counter()
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
    except (http.client.HTTPException, ConnectionError) as exc:
        print(f"request failed ({type(exc).__name__}); reconnecting", file=sys.stderr)
        conn.close()
        return (time.perf_counter() - t) * 1000, False
    return (time.perf_counter() - t) * 1000, resp.status == 200 and check in data


def interleaved(col, mode: str, base_url: str, floor_url: str, queries: list[str], total: int,
                block: int = 50):
    """1 client, keep-alive ``http.client``, in blocks: ``block`` library calls, then ``block``
    requests of each HTTP surface, then ``block`` to the no-work server, round after round
    until ``total`` of each. Every figure comes from the same minutes, so the machine's
    drift (1-2 ms between runs here) moves them all; within a block a server stays warm,
    as it does for a client's stream of requests (one request each, alternating, measured
    the wake-up of three processes instead: the floor rose from 0.25 to 1.0 ms).

    httpx's async client costs about 2 ms a request of its own on a slow CPU; this client
    costs about 0.2 ms (the floor), so the figures are close to what the server adds.
    Returns ``{label: latencies}`` (the library's under "library") and the errors per label."""
    empty = ("POST", "/", b"{}", {"content-type": "application/json"})
    senders = [(label, _connection(base_url), request, b"hits") for label, request in requests_for(col.name, mode)]
    senders.append(("floor", _connection(floor_url), lambda q: empty, b"{}"))
    out = {"library": [], **{label: [] for label, *_ in senders}}
    errors = dict.fromkeys(out, 0)
    warm = -len(queries)  # first every distinct query once, here and in the server (token caches)
    for start in [warm, *range(0, total, block)]:
        rounds = range(start, 0) if start < 0 else range(start, min(start + block, total))
        took = []
        for i in rounds:
            t = time.perf_counter()
            col.search(query=queries[i % len(queries)], mode=mode, top_k=10)
            took.append(("library", (time.perf_counter() - t) * 1000, True))
        for label, conn, request, check in senders:
            took += [(label, *_timed(conn, request(queries[i % len(queries)]), check)) for i in rounds]
        if start >= 0:
            for label, ms, ok in took:
                out[label].append(ms)
                errors[label] += not ok
    for _label, conn, *_ in senders:
        conn.close()
    return out, errors


async def load(base_url: str, fn, queries: list[str], clients: int, total: int, time_limit: float):
    """``clients`` concurrent clients share ``total`` requests; stops at ``time_limit`` seconds."""
    import httpx

    latencies, errors = [], 0
    next_i = iter(range(total))
    deadline = time.monotonic() + time_limit
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:
        async def worker():
            nonlocal errors
            for i in next_i:
                if time.monotonic() > deadline:
                    return
                t = time.perf_counter()
                try:
                    ok = await fn(client, queries[i % len(queries)])
                except Exception:
                    ok = False
                latencies.append((time.perf_counter() - t) * 1000)
                errors += not ok

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - t0
    return latencies, errors, elapsed


def library(col, mode: str, queries: list[str], clients: int, total: int, time_limit: float):
    latencies, errors = [], 0
    lock = threading.Lock()
    deadline = time.monotonic() + time_limit

    def one(i):
        nonlocal errors
        if time.monotonic() > deadline:
            return
        t = time.perf_counter()
        try:
            col.search(query=queries[i % len(queries)], mode=mode, top_k=10)
            ok = True
        except Exception:
            ok = False
        with lock:
            latencies.append((time.perf_counter() - t) * 1000)
            errors += not ok

    t0 = time.perf_counter()
    if clients == 1:  # in the caller's thread: a pool's hand-off is not part of the library call
        for i in range(total):
            one(i)
    else:
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(one, range(total)))
    return latencies, errors, time.perf_counter() - t0


def in_process(index: Path, name: str, mode: str, queries: list[str], total: int, passes: int = 3):
    """The server's own cost without loopback or process wake-ups: ``Datasette(...).client``
    (ASGI, in this process) for the JSON search and the MCP call, the call answered in the
    request's task (adr/0043) and through the SDK's stateless transport, passes interleaved.
    Returns rows of (label, p50 ms: median of the passes' p50s, ratio to the JSON search)."""
    import logging

    from datasette.app import Datasette

    from groundkit_datasette.surfaces import mcp_http

    for logger in ("httpx", "groundkit", "groundkit.access", "mcp"):  # a line a request would be timed too
        logging.getLogger(logger).setLevel(logging.WARNING)
    ds = Datasette(files=[], metadata={"plugins": {"groundkit": {"index_dir": str(index)}}})
    (_, json_request), (_, mcp_request) = requests_for(name, mode)
    cases = [("JSON search.json", json_request, True), ("MCP tools/call, in the request's task", mcp_request, True),
             ("MCP tools/call, the SDK's transport", mcp_request, False)]

    async def run():
        await ds.invoke_startup()
        p50s = {label: [] for label, *_ in cases}
        for k, n in enumerate((len(queries),) + (total,) * passes):  # the first pass warms up
            for label, request, direct in cases:
                mcp_http.DIRECT_CALLS = direct
                lat = []
                for i in range(n):
                    method, path, body, headers = request(queries[i % len(queries)])
                    t = time.perf_counter()
                    r = await ds.client.post(path, content=body, headers=headers)
                    lat.append((time.perf_counter() - t) * 1000)
                    assert r.status_code == 200 and b"hits" in r.content, r.text[:200]
                if k > 0:
                    p50s[label].append(c.percentile(lat, 0.5))
        mcp_http.DIRECT_CALLS = True
        return {label: statistics.median(v) for label, v in p50s.items()}

    medians = asyncio.run(run())
    json_p50 = medians["JSON search.json"]
    return [[label, p50, c.ratio(p50, json_p50)] for label, p50 in medians.items()]


def serialisation(col, mode: str, queries: list[str], passes: int = 5) -> list[list]:
    """The JSON API's body now (``surfaces/serialize.py`` over the search's plain values,
    orjson: adr/0038) against the two ways before it, over the same searches: pydantic's
    compiled serializer over the models (adr/0036) and ``json.dumps`` of
    ``model_dump(mode="json")`` (Datasette's ``Response.json``); all parse to the same value."""
    from groundkit_datasette.retrieval.models import SearchRequest
    from groundkit_datasette.retrieval.search import search_plain
    from groundkit_datasette.surfaces import serialize

    requests = [SearchRequest(query=q, mode=mode) for q in queries]
    plain = [search_plain(col, r) for r in requests]
    models = [p.model() for p in plain]
    ways = {"serialize.body (plain values, orjson)": (serialize.body, plain),
            "serialize.body of the models (model_dump_json)": (serialize.body, models),
            "json.dumps(model_dump(mode='json')) (before)":
                (lambda r: json.dumps(r.model_dump(mode="json")).encode(), models)}
    for p, m in list(zip(plain, models))[:20]:
        assert json.loads(serialize.body(p)) == json.loads(serialize.body(m)) == \
            json.loads(json.dumps(m.model_dump(mode="json")))
    cpu = {k: [] for k in ways}
    for n in range(passes):
        for label in (list(ways) if n % 2 == 0 else list(ways)[::-1]):
            fn, responses = ways[label]
            for r in responses:
                t = time.process_time()
                fn(r)
                cpu[label].append((time.process_time() - t) * 1000)
    p50 = {k: c.percentile(v, 0.5) for k, v in cpu.items()}
    before = p50[list(ways)[-1]]
    return [[k, v, c.ratio(v, before)] for k, v in p50.items()]


def build_default(work: Path) -> tuple[Path, str, list[str]]:
    """A BM25-only nfcorpus_approx collection and its query texts."""
    from groundkit_datasette.evaluation.evaluate import load_dataset, write_sources
    from groundkit_datasette.indexing.ingest import Indexer

    ds = load_dataset(c.irdata("nfcorpus_approx"))
    sources = work / "nfcorpus-sources"
    write_sources(ds.corpus(), sources)
    index = work / "index"
    Indexer("nfcorpus", index_dir=index, base_dir=sources, embedder="none").ingest([sources])
    return index, "nfcorpus", [ds.queries[q] for q in ds.judged_queries]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=400, help="requests per surface and level")
    ap.add_argument("--levels", default="1,8,32")
    ap.add_argument("--mode", default="bm25")
    ap.add_argument("--time-limit", type=float, default=60, help="seconds per surface and level, at most")
    ap.add_argument("--index-dir", help="serve this index directory (with --collection) instead of building one")
    ap.add_argument("--collection")
    ap.add_argument("--queries-from", default="nfcorpus_approx", help="irdata set whose queries are sent")
    ap.add_argument("--work")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="gk-bench-http-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.index_dir:
        from groundkit_datasette.evaluation.evaluate import load_dataset

        index, name = Path(args.index_dir), args.collection
        ds = load_dataset(c.irdata(args.queries_from))
        queries = [ds.queries[q] for q in ds.judged_queries]
    else:
        index, name, queries = build_default(work)
    levels = [int(x) for x in args.levels.split(",")]

    from groundkit_datasette.retrieval.collection import Collection

    print(f"# HTTP benchmark ({c.machine()}, {time.strftime('%Y-%m-%d')}); collection {name}, mode {args.mode}, "
          f"{args.requests} requests per cell, {len(queries)} distinct queries")
    proc, base = start_server(index, work)
    rows = []
    try:
        col = Collection.open(name, index_dir=index)
        col.search(query=queries[0], mode=args.mode)
        lib = {}
        for n in levels:
            lat, err, el = library(col, args.mode, queries, n, args.requests, args.time_limit)
            lib[n] = (c.percentile(lat, 0.5), len(lat) / el)
            rows.append(["library Collection.search", n, c.percentile(lat, 0.5), c.percentile(lat, 0.95),
                         len(lat) / el, err, "1.00", "1.00"])
        body_rows = serialisation(col, args.mode, queries)
        for label, fn in surfaces(name, args.mode):
            asyncio.run(load(base, fn, queries, 1, 5, 30))  # warm-up
            for n in levels:
                lat, err, el = asyncio.run(load(base, fn, queries, n, args.requests, args.time_limit))
                p50, rate = c.percentile(lat, 0.5), len(lat) / el
                rows.append([label, n, p50, c.percentile(lat, 0.95), rate, err,
                             c.ratio(p50, lib[n][0]), c.ratio(rate, lib[n][1])])
            print(f"done: {label}", file=sys.stderr, flush=True)
        floor_proc, floor_base = start_floor_server()
        try:
            together, light_errors = interleaved(col, args.mode, base, floor_base, queries, args.requests)

            async def empty_async(client, q):  # httpx alone, against a server that does nothing
                return (await client.post("/", json={})).status_code == 200

            lat, _, _ = asyncio.run(load(floor_base, empty_async, queries, 1, args.requests, args.time_limit))
            floor = {"http.client": c.percentile(together["floor"], 0.5), "httpx async": c.percentile(lat, 0.5)}
        finally:
            floor_proc.terminate()
            floor_proc.wait(30)
        col.close()
        base_1 = c.percentile(together["library"], 0.5)  # the library in the same blocks
        light = {}
        for label, _ in requests_for(name, args.mode):
            lat = together[label]
            light[label] = c.percentile(lat, 0.5)
            rows.append([f"{label} (http.client, in blocks)", 1, light[label], c.percentile(lat, 0.95),
                         len(lat) / (sum(lat) / 1000), light_errors[label], c.ratio(light[label], base_1), "-"])
        rows.append(["library, in the same blocks", 1, base_1, c.percentile(together["library"], 0.95),
                     len(together["library"]) / (sum(together["library"]) / 1000), 0, "1.00", "-"])
    finally:
        proc.terminate()
        proc.wait(30)
    print(c.table(["surface", "clients", "p50 ms", "p95 ms", "req/s", "errors", "p50 / library", "req/s / library"],
                  rows))
    print(f"client floor, p50 of a request to a loopback server that does no work: http.client "
          f"{floor['http.client']:.3f} ms, httpx async {floor['httpx async']:.3f} ms")
    # issue 14's target: what the HTTP surfaces add to the library call, 1 client
    for label, p50 in light.items():
        over = p50 - base_1
        line = (f"target {label} overhead p50 (1 client, http.client, in blocks) <= 3 ms: {over:.2f} ms "
                f"({'met' if over <= 3.0 else 'MISSED'}; {p50:.2f} against the library's {base_1:.2f} "
                f"in the same blocks)")
        if 1 in lib:
            httpx_p50 = next(r[2] for r in rows if r[0] == label and r[1] == 1)
            line += (f"; with httpx async {httpx_p50 - lib[1][0]:.2f} ms, of which the client's floor "
                     f"is {floor['httpx async']:.2f}")
        print(line)
    print("\nThe same requests in this process (ASGI, `Datasette(...).client`: no loopback, no process "
          f"wake-ups; p50 ms, median of 3 interleaved passes of {args.requests}):")
    print(c.table(["request", "p50 ms", "ratio to JSON"], in_process(index, name, args.mode, queries, args.requests)))
    print("\nThe JSON API's body from the same search responses (CPU ms per response, p50, passes "
          "interleaved in this process):")
    print(c.table(["body", "ms", "ratio to json.dumps(model_dump)"], body_rows))
    print("Datasette ?_search= is FTS5 with Datasette's default escaping (terms ANDed), no citations or "
          "verification: a floor for an HTTP round trip through Datasette, not the same query.")


if __name__ == "__main__":
    main()
