"""Ray against Dask distributed for ingest's map stage (issue 18, adr/0029-distributed-ingest.md).

Starts each engine as a real local cluster (a head/scheduler and two workers, separate
processes), then measures what matters for shipping ingest batches:
- start-up: from launching the processes to a client that sees both workers;
- memory: the summed resident set of every process the cluster started;
- per-task overhead: round trip of a task carrying a batch of 64 chunks of text (~64 KB) that
  does almost nothing, against calling the same function locally;
- a worker killed while it runs a task: is the task retried elsewhere, and how long it takes.

Needs both engines in the venv (`pip install ray distributed`); benchmark-only.
Usage: nice -n 5 python -m benchmarks.cluster_engines   (as a module: benchmarks/http_overhead.py would shadow http)
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import machine  # noqa: E402

import psutil  # noqa: E402

BATCH = ["word " * 200] * 64  # 64 chunks of ~1000 characters
TASKS = 200
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def work(texts):
    return sum(len(t) for t in texts)


def slow(seconds):
    time.sleep(seconds)
    return os.getpid()


def tree_rss_mb(pids) -> float:
    total = 0
    seen = set()
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs = [p] + p.children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for q in procs:
            if q.pid in seen:
                continue
            seen.add(q.pid)
            try:
                total += q.memory_info().rss
            except psutil.NoSuchProcess:
                pass
    return total / 2**20


def overhead(call) -> tuple[float, float]:
    t = time.perf_counter()
    for _ in range(TASKS):
        work(BATCH)
    local = (time.perf_counter() - t) / TASKS * 1000
    samples = []
    for _ in range(TASKS):
        t = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t) * 1000)
    return statistics.median(samples), local


def measure_dask() -> dict:
    from distributed import Client

    port = free_port()
    tmp = tempfile.mkdtemp(prefix="gk-dask-")
    t0 = time.perf_counter()
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--dashboard-address", ":0", "--no-show"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)]
    for _ in range(2):
        procs.append(subprocess.Popen([str(BIN / "dask"), "worker", f"tcp://127.0.0.1:{port}", "--nworkers", "1",
                                       "--nthreads", "1", "--no-nanny", "--host", "127.0.0.1",
                                       "--dashboard-address", ":0", "--local-directory", tmp],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp))
    client = Client(f"tcp://127.0.0.1:{port}", timeout=60)
    client.wait_for_workers(2, timeout=60)
    startup = time.perf_counter() - t0
    client.submit(work, BATCH, pure=False).result()
    memory = tree_rss_mb([p.pid for p in procs]) + tree_rss_mb([os.getpid()]) * 0  # cluster only
    per_task, local = overhead(lambda: client.submit(work, BATCH, pure=False).result())
    # Kill the worker running a 3 s task; the scheduler reschedules it on the other.
    fut = client.submit(slow, 3.0, pure=False)
    while not client.processing() or not any(client.processing().values()):
        time.sleep(0.05)
    busy = next(addr for addr, keys in client.processing().items() if keys)
    pid = client.run(os.getpid, workers=[busy])[busy]
    t = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    try:
        retried_pid = fut.result(timeout=60)
        retry = f"retried on pid {retried_pid} after {time.perf_counter() - t:.1f} s"
    except Exception as exc:
        retry = f"not retried: {type(exc).__name__}"
    client.close()
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(10)
    return {"engine": "dask distributed", "startup_s": startup, "memory_mb": memory,
            "task_ms": per_task, "local_ms": local, "killed_worker": retry}


def measure_ray() -> dict:
    import ray

    port = free_port()
    tmp = tempfile.mkdtemp(prefix="gk-ray-")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    t0 = time.perf_counter()
    # Two worker processes: a head with 2 CPUs starts one worker per CPU on demand.
    subprocess.run([str(BIN / "ray"), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                    "--num-cpus", "2", "--include-dashboard", "false", "--temp-dir", tmp,
                    "--disable-usage-stats"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    ray.init(address=f"127.0.0.1:{port}", logging_level="ERROR", log_to_driver=False)
    remote_work = ray.remote(work)
    remote_slow = ray.remote(max_retries=3)(slow)
    ray.get([remote_work.remote(BATCH) for _ in range(2)])
    startup = time.perf_counter() - t0
    # Every process of the session: gcs, raylet, workers, dashboard agent...
    pids = [p.pid for p in psutil.process_iter(["cmdline"])
            if tmp in " ".join(p.info["cmdline"] or []) or "ray::" in " ".join(p.info["cmdline"] or [])]
    memory = tree_rss_mb(pids)
    per_task, local = overhead(lambda: ray.get(remote_work.remote(BATCH)))
    ref = remote_slow.remote(3.0)
    time.sleep(1.0)
    victims = [p for p in psutil.process_iter(["cmdline"]) if "ray::slow" in " ".join(p.info["cmdline"] or [])]
    t = time.perf_counter()
    for v in victims:
        v.kill()
    try:
        retried_pid = ray.get(ref, timeout=60)
        retry = f"retried on pid {retried_pid} after {time.perf_counter() - t:.1f} s"
    except Exception as exc:
        retry = f"not retried: {type(exc).__name__}"
    ray.shutdown()
    subprocess.run([str(BIN / "ray"), "stop", "--force"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env=env)
    return {"engine": "ray", "startup_s": startup, "memory_mb": memory,
            "task_ms": per_task, "local_ms": local, "killed_worker": retry}


def main() -> None:
    print(machine())
    rows = [measure_dask(), measure_ray()]
    print("| engine | start-up (s) | cluster RSS (MB) | task of 64 chunks, round trip (ms, p50) | same call locally (ms) | killed worker |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['engine']} | {r['startup_s']:.1f} | {r['memory_mb']:.0f} | {r['task_ms']:.2f} | "
              f"{r['local_ms']:.3f} | {r['killed_worker']} |")


if __name__ == "__main__":
    main()
