"""Cold start: process start to first answered query, per mode, at increasing collection sizes.

Each measurement starts a fresh interpreter that imports groundkit, opens the
collection and answers one query; the clock runs from just before the process
is spawned until the answer line arrives (interpreter teardown excluded). The
page cache is warm (every figure is a median over repeats). Baselines in the
same run: a bare ``python -c`` start, bm25s loading its saved index
(memory-mapped) and answering, numpy loading the saved vectors (memory-mapped)
and answering. Collections are the synthetic ones of ``dense.py`` (a
registered synthetic embedder embeds queries, so the model load is reported
separately: the default MiniLM's first ``embed_query`` in a fresh process).

The target (issue 14) is stated with the REAL default embedder: for each
collection a copy of its SQLite file whose manifest names the default MiniLM
(the LanceDB directory is linked, not copied) is also opened, so the child
loads the int8 ONNX model and embeds the query text exactly as a user's first
``groundkit search`` would; the vectors' values do not change what opening and
searching them costs. bm25 and hybrid on these copies are judged against 0.5 s.

    python benchmarks/coldstart.py --sizes 10000,50000,200000 [--repeats 5]
    python benchmarks/coldstart.py --sizes '' --collection /var/tmp/gk-debian-syn/debian-docs.sqlite3
"""

from __future__ import annotations

import os
import sys

# Run as a script, this directory would lead sys.path and benchmarks/http_overhead.py would shadow the
# standard library's http package: put the repository root there instead.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
from benchmarks import _common as c  # noqa: E402

QUERY = "zipf words about the section and its topic"

_CHILD_OURS = """
import sys, time, json
t0 = time.perf_counter()
sys.path.insert(0, {root!r})
if {synthetic!r}:
    from benchmarks import _synthetic
    _synthetic.register()
from groundkit_datasette.retrieval.collection import Collection
t1 = time.perf_counter()
col = Collection.open({name!r}, index_dir={index!r})
t2 = time.perf_counter()
r = col.search(query={query!r}, mode={mode!r}, top_k=10)
t3 = time.perf_counter()
out = {{"hits": len(r.hits), "import_s": t1 - t0, "open_s": t2 - t1, "query_s": t3 - t2,
       "lancedb": int("lancedb" in sys.modules)}}
out.update({{k: v / 1000 for k, v in r.timings_ms.items() if k != "total_ms"}})
print(json.dumps(out), flush=True)
"""

_CHILD_BM25S = """
import json, time
t0 = time.perf_counter()
import bm25s, Stemmer
t1 = time.perf_counter()
retriever = bm25s.BM25.load({path!r}, mmap=True)
t2 = time.perf_counter()
tokens = bm25s.tokenize([{query!r}], stopwords="en", stemmer=Stemmer.Stemmer("english"), show_progress=False, return_ids=False)
docs, scores = retriever.retrieve(tokens, k=10, show_progress=False)
t3 = time.perf_counter()
print(json.dumps({{"hits": int(docs.shape[1]), "import_s": t1 - t0, "open_s": t2 - t1, "query_s": t3 - t2}}), flush=True)
"""

_CHILD_NUMPY = """
import json, time
t0 = time.perf_counter()
import numpy as np
t1 = time.perf_counter()
m = np.load({path!r}, mmap_mode="r")
t2 = time.perf_counter()
q = np.random.default_rng(1).standard_normal(m.shape[1]).astype(np.float32)
q /= np.linalg.norm(q)
s = m @ q
top = np.argpartition(-s, 10)[:10]
t3 = time.perf_counter()
print(json.dumps({{"hits": len(top), "import_s": t1 - t0, "open_s": t2 - t1, "query_s": t3 - t2}}), flush=True)
"""

_CHILD_MINILM = """
import json, time
t0 = time.perf_counter()
from groundkit_datasette.embedding.embedders import get_embedder
t1 = time.perf_counter()
e = get_embedder("minilm")
e.load()
t2 = time.perf_counter()
e.embed_query({query!r})
t3 = time.perf_counter()
print(json.dumps({{"hits": 1, "import_s": t1 - t0, "open_s": t2 - t1, "query_s": t3 - t2}}), flush=True)
"""


# The floor under any answer built on the same libraries (adr/0041): a fresh process imports
# them and does each one's first piece of work (one pydantic model validated, the tokenizer file
# read), nothing of ours. The hybrid floor leaves the model's session out: building it holds no
# GIL, so it can overlap the imports on a second core.
_CHILD_FLOOR = """
import json, time
t0 = time.perf_counter()
import sqlite3
import numpy
import Stemmer
from pydantic import BaseModel, ConfigDict
class Floor(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    query: str
Floor(query="x")
Stemmer.Stemmer("english").stemWord("words")
if {mode!r} == "hybrid":
    import onnxruntime
    from tokenizers import Tokenizer
    Tokenizer.from_file({tokenizer!r})
t1 = time.perf_counter()
print(json.dumps({{"hits": 0, "import_s": t1 - t0, "open_s": 0.0, "query_s": 0.0}}), flush=True)
"""


# The query model's load alone, three ways, in fresh processes (adr/0037): ours (weights
# dequantised in numpy, handed over from memory), onnxruntime folding the shipped file's
# Cast/Mul at ORT_ENABLE_ALL (the session before adr/0037), and the file at ORT_DISABLE_ALL
# (nothing folded: every run dequantises every weight).
_CHILD_SESSION = """
import json, time
import numpy as np
import onnxruntime as ort
from groundkit_datasette.embedding import embedders, onnx_cpu
e = embedders.MiniLMEmbedder()
model, _tok = e._model_files()
c0, t0 = time.process_time(), time.perf_counter()
if {variant!r} == "ours":
    s = onnx_cpu.cpu_session(model, 1)
else:
    o = ort.SessionOptions()
    o.intra_op_num_threads = 1
    o.inter_op_num_threads = 1
    o.log_severity_level = 3
    o.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if {variant!r} == "folding"
                                  else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    s = ort.InferenceSession(str(model), sess_options=o, providers=["CPUExecutionProvider"])
c1, t1 = time.process_time(), time.perf_counter()
ids = np.array([[101] + list(range(2000, 2010)) + [102]])
feed = {{"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}}
s.run(None, feed)
c2, t2 = time.process_time(), time.perf_counter()
s.run(None, feed)
c3 = time.process_time()
print(json.dumps({{"hits": 1, "import_s": 0.0, "open_s": t1 - t0, "query_s": t2 - t1, "session_cpu": c1 - c0,
                  "first_run_cpu": c2 - c1, "next_run_cpu": c3 - c2}}), flush=True)
"""


def session_variants(repeats: int) -> list[list]:
    """Model load + first query, ours and the two ways onnxruntime can load the file, interleaved."""
    variants = ("ours", "folding", "unfolded")
    codes = {v: _CHILD_SESSION.format(variant=v) for v in variants}
    for v in variants:
        spawn(codes[v])  # warm the page cache
    runs = {v: [] for v in variants}
    for _ in range(repeats):
        for v in variants:
            runs[v].append(spawn(codes[v]))
    rows = []
    for v in variants:
        med = {k: statistics.median(r[k] for r in runs[v]) for k in runs[v][0]}
        rows.append([v, med["session_cpu"], med["first_run_cpu"], med["next_run_cpu"] * 1000,
                     med["open_s"] + med["query_s"]])
    return rows


def spawn(code: str) -> dict:
    """Wall time from spawn to the answer line, plus the child's own breakdown."""
    import resource

    env = dict(os.environ, LANCE_LOG="error", RUST_LOG="error")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    line = proc.stdout.readline()
    wall = time.perf_counter() - t
    _out, err = proc.communicate(timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0 or not line:
        raise RuntimeError(f"child failed: {err[-2000:]}")
    # The child's CPU time (user + system, its exit included): steadier than wall under load.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return dict(json.loads(line), wall_s=wall, cpu_s=cpu)


def cli_run(root: Path, index: Path, name: str, mode: str) -> tuple[float, float]:
    """`groundkit search --json` in a fresh process, spawn to exit (what a shell waits for):
    wall and CPU s."""
    import resource

    code = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from groundkit_datasette.cli import main; "
            "main()")  # what the groundkit console script runs
    env = dict(os.environ, LANCE_LOG="error", RUST_LOG="error")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, str(root), "search", name, QUERY, "--index-dir", str(index),
                          "--mode", mode, "--json"], capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"groundkit search failed: {out.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cli_rows(index: Path, name: str, before_tree: Path | None, repeats: int) -> list[list]:
    """The command line end to end, ours and (given) the tree before, runs alternating."""
    trees = [("ours", HERE.parent)] + ([("before", Path(before_tree).resolve())] if before_tree else [])
    rows = []
    for mode in ("bm25", "hybrid"):
        runs = {label: [] for label, _ in trees}
        for i in range(repeats + 1):
            for label, root in trees:
                r = cli_run(root, index, name, mode)
                if i:  # the first round warms the page cache
                    runs[label].append(r)
        row = [mode]
        for label, _ in trees:
            row += [statistics.median(w for w, _ in runs[label]), statistics.median(c for _, c in runs[label])]
        rows.append(row)
    return rows


def median_runs(code: str, repeats: int) -> dict:
    runs = [spawn(code) for _ in range(repeats + 1)][1:]  # the first run warms the page cache
    return {k: statistics.median(r.get(k, 0.0) for r in runs) for k in runs[0]}


def median_pair(ours_code: str, before_code: str | None, repeats: int):
    """Medians of ours and (when given) the old path, their runs alternating."""
    spawn(ours_code)
    if before_code:
        spawn(before_code)
    ours, before = [], []
    for _ in range(repeats):
        ours.append(spawn(ours_code))
        if before_code:
            before.append(spawn(before_code))

    def med(runs):
        return {k: statistics.median(r.get(k, 0.0) for r in runs) for k in runs[0]} if runs else None
    return med(ours), med(before)


def _manifest_copy(index: Path, name: str, work: Path, folder: str, suffix: str, edit) -> tuple[Path, str]:
    """A copy of the SQLite file with ``edit(conn)`` applied to it, beside a link to the same
    LanceDB directory (remade when the source is newer)."""
    import shutil
    import sqlite3

    out_dir = work / folder
    out_dir.mkdir(parents=True, exist_ok=True)
    new = f"{name}-{suffix}"
    target = out_dir / f"{new}.sqlite3"
    source = index / f"{name}.sqlite3"
    if not target.exists() or target.stat().st_mtime < source.stat().st_mtime:
        tmp = out_dir / f".{new}.tmp"
        shutil.copyfile(source, tmp)
        conn = sqlite3.connect(tmp)
        edit(conn)
        conn.commit()
        conn.close()
        tmp.replace(target)
    link = out_dir / f"{new}.lance"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to((index / f"{name}.lance").resolve(), target_is_directory=True)
    return out_dir, new


def without_index_file(index: Path, name: str, work: Path) -> tuple[Path, str]:
    """The collection as before the index file existed: its manifest names none."""
    return _manifest_copy(index, name, work, "no-index-file", "lancedb",
                          lambda conn: conn.execute("DELETE FROM groundkit_manifest WHERE key = 'vector_index'"))


def real_model_copy(index: Path, name: str, work: Path, compute: str = "int8") -> tuple[Path, str]:
    """The collection with a manifest naming the default MiniLM: a fresh process then loads the
    real model. ``compute``: the ``embedding_compute`` record (adr/0040; what an ingest with
    today's default writes is "int8"; "fp32" is a collection written before that record)."""
    from groundkit_datasette.embedding.embedders import MiniLMEmbedder
    from groundkit_datasette.registry import DEFAULT_EMBEDDER

    def edit(conn):
        for key, value in (("embedder", DEFAULT_EMBEDDER), ("embedding_provider", MiniLMEmbedder.provider),
                           ("embedding_model", MiniLMEmbedder.model_name),
                           ("embedding_dimensions", str(MiniLMEmbedder.dimensions))):
            conn.execute("UPDATE groundkit_manifest SET value = ? WHERE key = ?", (value, key))
        conn.execute("DELETE FROM groundkit_manifest WHERE key = 'embedding_compute'")
        if compute != "fp32":
            conn.execute("INSERT INTO groundkit_manifest (key, value) VALUES ('embedding_compute', ?)",
                         (compute,))

    return _manifest_copy(index, name, work, "real-model", f"minilm-{compute}", edit)


def prepare_baselines(index: Path, name: str, work: Path):
    """bm25s index of the same chunks and the same vectors as .npy, saved to disk."""
    import bm25s
    import numpy as np
    import Stemmer

    from groundkit_datasette.retrieval.collection import Collection

    bm25s_dir = work / f"{name}.bm25s"
    npy = work / f"{name}.npy"
    if not bm25s_dir.exists():
        _ids, texts, _src = c.chunk_texts(index / f"{name}.sqlite3")
        tokens = bm25s.tokenize(texts, stopwords="en", stemmer=Stemmer.Stemmer("english"), show_progress=False)
        retriever = bm25s.BM25()
        retriever.index(tokens, show_progress=False)
        retriever.save(str(bm25s_dir))
    if not npy.exists():
        with Collection.open(name, index_dir=index) as col:
            data = col.vectors().to_arrow().column("vector").to_numpy(zero_copy_only=False)
        np.save(npy, np.stack(data).astype(np.float32))
    return bm25s_dir, npy


def _compile_tree(root: Path) -> bool:
    """Byte-compile a checkout's package (as pip does when it installs the wheel)."""
    import compileall

    return bool(compileall.compile_dir(str(root / "groundkit_datasette"), quiet=1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,50000,200000")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--work", help="directory for the synthetic collections (shared with dense.py)")
    ap.add_argument("--collection", action="append", default=[],
                    help="also an existing collection .sqlite3 built with --embedder synthetic")
    ap.add_argument("--skip-baselines", action="store_true",
                    help="no bm25s / numpy baselines (building them for 268k chunks takes minutes); the "
                         "LanceDB path ('before') still runs beside ours")
    ap.add_argument("--before-tree", metavar="DIR",
                    help="a checkout of the code to compare with (e.g. a worktree at the commit before "
                         "adr/0037): the real-MiniLM rows' 'before' is then that code on the same collection, "
                         "runs interleaved with ours, instead of the LanceDB path")
    ap.add_argument("--compute", default="int8", choices=("int8", "fp32"),
                    help="the real-MiniLM copy's embedding_compute record (int8: a collection "
                         "ingested with today's default; fp32: one written before adr/0040)")
    ap.add_argument("--real-only", action="store_true",
                    help="only the rows judged against the target (bm25 and hybrid with the real MiniLM)")
    args = ap.parse_args(argv)
    from benchmarks import _synthetic as syn

    work = Path(args.work or tempfile.mkdtemp(prefix="gk-bench-cold-"))
    # A wheel install writes the bytecode; a source tree run with PYTHONDONTWRITEBYTECODE (or
    # edited since its last import) would compile every changed module in every child instead.
    compiled = [_compile_tree(Path(t)) for t in [HERE.parent] + ([args.before_tree] if args.before_tree else [])]
    print(f"# Cold start ({c.machine()}, {time.strftime('%Y-%m-%d')}); medians of {args.repeats} fresh processes, "
          f"warm page cache; bytecode compiled first as a wheel install does ({'ok' if all(compiled) else 'FAILED'})")
    floor = median_runs("print('{\"hits\": 0, \"import_s\": 0, \"open_s\": 0, \"query_s\": 0}')", args.repeats)
    minilm = median_runs(_CHILD_MINILM.format(query=QUERY), args.repeats)
    from groundkit_datasette.embedding.embedders import MiniLMEmbedder

    tokenizer = str(MiniLMEmbedder()._model_files()[1])
    floors = {m: median_runs(_CHILD_FLOOR.format(mode=m, tokenizer=tokenizer), args.repeats)
              for m in ("bm25", "hybrid")}
    sessions = session_variants(max(args.repeats, 3))
    rows = []
    targets = []
    for size in [int(s) for s in args.sizes.split(",") if s]:
        index, name, _report, _ = syn.build_collection(work, size)
        targets.append((index, name))
    targets += [(Path(p).parent, Path(p).name.removesuffix(".sqlite3")) for p in args.collection]
    for index, name in targets:
        import sqlite3

        size = sqlite3.connect(f"file:{index / (name + '.sqlite3')}?immutable=1", uri=True).execute(
            "SELECT count(*) FROM chunks").fetchone()[0]
        base = {}
        if not args.skip_baselines:
            bm25s_dir, npy = prepare_baselines(index, name, work)
            base = {
                "bm25": median_runs(_CHILD_BM25S.format(path=str(bm25s_dir), query=QUERY), args.repeats),
                "dense": median_runs(_CHILD_NUMPY.format(path=str(npy)), args.repeats),
            }
        real_index, real_name = real_model_copy(index, name, work, args.compute)
        runs = []
        if not args.real_only:
            # The same collections read the old way (no index file: LanceDB imported and read).
            old_index, old_name = without_index_file(index, name, work)
            runs += [(index, name, mode, True, (old_index, old_name, HERE.parent)) for mode in ("bm25", "dense", "hybrid")]
        if args.before_tree:
            before_real = (real_index, real_name, Path(args.before_tree).resolve())
        else:
            old_real_index, old_real_name = without_index_file(real_index, real_name, work)
            before_real = (old_real_index, old_real_name, HERE.parent)
        runs += [(real_index, real_name, mode, False, before_real) for mode in ("bm25", "hybrid")]
        cli_table = cli_rows(real_index, real_name, args.before_tree, args.repeats)
        for run_index, run_name, mode, synthetic, before in runs:
            b = base.get(mode)
            label = f"{name} ({size:,})" + ("" if synthetic else ", real MiniLM")

            def child(where, called, root=HERE.parent):
                return _CHILD_OURS.format(root=str(root), name=called, index=str(where), query=QUERY,
                                          mode=mode, synthetic=synthetic)
            compare = mode != "bm25" or (args.before_tree and not synthetic)
            try:
                pair = median_pair(child(run_index, run_name), child(*before) if compare else None,
                                   args.repeats)
                ours, old = pair
            except RuntimeError as exc:
                last = str(exc).strip().splitlines()[-1][:120]
                rows.append([label, mode] + [None] * 12 + [f"failed: {last}"])
                continue
            judged = not synthetic or mode == "bm25"
            rows.append([label, mode, ours["wall_s"], ours["cpu_s"], ours["import_s"], ours["open_s"],
                         ours["query_s"], ours.get("embed_ms", 0.0), ours.get("bm25_ms", 0.0),
                         ours.get("dense_ms", 0.0), "yes" if ours.get("lancedb") else "no",
                         b["wall_s"] if b else None,
                         old["wall_s"] if old else None, old["cpu_s"] if old else None,
                         # (a synthetic hybrid loads no model: the hybrid floor is not its own)
                         floors[mode]["wall_s"] if mode in floors and (mode == "bm25" or not synthetic) else None,
                         ("met" if ours["wall_s"] < 0.5 else "MISSED") if judged else "-"])
        print(f"built/reused {name}", flush=True)
    print(f"python start floor (python -c print): {floor['wall_s']:.3f} s")
    print(c.table(["collection (chunks)", "mode", "ours wall s", "ours CPU s", "import s", "open s",
                   "1st query s", "embed s", "bm25 s", "dense s", "lancedb imported", "bm25s/numpy wall s",
                   "before wall s", "before CPU s", "library floor s", "wall < 0.5 s"], rows))
    print("baselines: bm25 -> bm25s (BM25.load mmap=True + retrieve); dense -> numpy (np.load mmap + matmul); "
          "before -> the same collection without its index file (the LanceDB path), runs interleaved with ours"
          + (f"; for the real-MiniLM rows, the code in {args.before_tree} on the same collection. " if args.before_tree
             else ". ") +
          "CPU s: the child's user+system time, exit included (steadier than wall when the machine is loaded). "
          "embed/bm25/dense: the first query's own timings. Judged: bm25, and hybrid with the real MiniLM. "
          "library floor: a fresh process that only imports the libraries the answer needs (sqlite3, numpy, "
          "PyStemmer, pydantic with one model validated; for hybrid also onnxruntime and tokenizers with the "
          "tokenizer file read) and does nothing of ours; the model session is left out (adr/0041).")
    print("library floor, median wall s: " + ", ".join(f"{m} {f['wall_s']:.3f} (CPU {f['cpu_s']:.3f})"
                                                      for m, f in floors.items()))
    print("query model load in a fresh process (median; CPU s of this process, all threads): ours = weights "
          "dequantised in numpy and handed over from memory (adr/0037); folding = onnxruntime folding the "
          "shipped file at ORT_ENABLE_ALL (before); unfolded = the file at ORT_DISABLE_ALL")
    print(c.table(["session", "create CPU s", "first query CPU s", "next query CPU ms", "create + first query wall s"],
                  sessions))
    if targets:
        print("`groundkit search --json` on the real-MiniLM copy, spawn to exit (what a shell waits for; the "
              "exit included, unlike the table above), medians" + (", runs alternating with the tree before" if
                                                                  args.before_tree else ""))
        print(c.table(["mode", "ours wall s", "ours CPU s"] + (["before wall s", "before CPU s"] if args.before_tree
                                                               else []), cli_table))
    print(f"default MiniLM in a fresh process: import {minilm['import_s']:.3f} s, model load {minilm['open_s']:.3f} s, "
          f"first embed_query {minilm['query_s']:.3f} s (wall {minilm['wall_s']:.3f} s): add to dense/hybrid "
          "when the query is text")


if __name__ == "__main__":
    main()
