"""Dense search: ours (LanceDB through a real collection) against exact numpy search.

Collections of synthetic chunks are built through the normal ingest path with a
synthetic embedder plugin (clustered random 384-d vectors), so no model runs and
query embedding is excluded, as the target is stated. For each size: p50/p95
of the public search call (``vector=`` given), of the raw LanceDB ranking, and
of exact numpy search (matrix-vector product + argpartition) over the same
vectors; recall@10 of ours against exact; whether an ANN index was used.

Ours is the product path: the collection's index file (indexing/vector_index.py
``IndexSearch``: flat up to 50k vectors, above it the HNSW graph with an exact
re-rank of its shortlist, adr/0033), or without the file LanceDB (``VectorSearch``).
"ANN forced" is LanceDB's IVF_HNSW_SQ at any size; the notes add the inverted
file alone (the path before the graph), the ranker at depth 100 and BM25 alone. Hybrid p50 is
the public call with a text query for BM25 and the vector given.

Recall on REAL embeddings (``--real``): a collection embedded with the default
MiniLM (``debian_corpus.py --embedder minilm --max-files N``); queries are the
headings of sampled chunks embedded by the same model, exact search over the
same vectors is the truth, and the ANN path is forced whatever the table's
size, so the figure is the index's recall, not numpy's.

    python benchmarks/dense.py --sizes 10000,100000,200000 [--queries 200]
    python benchmarks/dense.py --sizes '' --collection /var/tmp/gk-debian-syn/debian-docs.sqlite3 \
        --real /var/tmp/gk-dense/real/debian-real.sqlite3
    python benchmarks/dense.py --sizes 1000000        # if time and memory allow
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


def run_collection(index: Path, name: str, nq: int, repeats: int, built: str, real: bool = False) -> list:
    import numpy as np

    from groundkit_datasette.indexing.vector_search import VectorSearch

    if not real:
        syn.register()
    col = Collection_open(index, name)
    table = col.vectors()
    t = time.perf_counter()
    data = table.to_arrow().select(["chunk_id", "vector"])
    ids = data.column("chunk_id").to_pylist()
    matrix = np.stack(data.column("vector").to_numpy(zero_copy_only=False)).astype(np.float32)
    load_s = time.perf_counter() - t
    texts = query_texts(col, nq)
    if real:
        from groundkit_datasette.retrieval.rankers import query_embedder

        queries = np.stack([query_embedder(col).embed_query(q) for q in texts]).astype(np.float32)
    else:
        queries = syn.query_vectors(nq)
    pairs = list(zip(texts, queries))

    def exact(q, k=10):
        scores = matrix @ q
        top = np.argpartition(-scores, k)[:k]
        return top[np.argsort(-scores[top])]

    search = col.vector_search()
    forced = VectorSearch(table, ann=bool(col.manifest.get("ann_index")), exact_max_rows=0)
    ivf = None
    if type(search).__name__ == "IndexSearch" and getattr(search, "ivf", False):
        from groundkit_datasette.indexing.vector_index import IndexSearch

        # The inverted file alone, at its default probes (the product path before the graph).
        ivf = IndexSearch(col.lance_path, col.manifest["vector_index"], int(col.manifest["lance_version"]),
                          graph=False)

    def raw(q):
        return search.search(q, 10)

    def ann(q):
        return forced.search(q, 10)

    def public(q):
        return col.search(query="vector query", mode="dense", top_k=10, vector=q.tolist())

    def hybrid(pair):
        return col.search(query=pair[0], mode="hybrid", top_k=10, vector=pair[1].tolist())

    def bm25(pair):
        return col.search(query=pair[0], mode="bm25", top_k=10)

    public(queries[0])
    hybrid(pairs[0])
    ann(queries[0])
    # Passes interleaved; hybrid's input is the (text, vector) pair, the others' the vector.
    qs = list(range(len(queries)))
    fns = {"public": lambda i: public(queries[i]), "hybrid": lambda i: hybrid(pairs[i]),
           "bm25": lambda i: bm25(pairs[i]), "raw": lambda i: raw(queries[i]),
           "raw100": lambda i: search.search(queries[i], 100), "ann": lambda i: ann(queries[i]),
           "exact": lambda i: exact(queries[i])}
    if ivf is not None:
        fns["ivf"] = lambda i: ivf.search(queries[i], 10)
    stats = _interleaved(fns, qs, repeats)
    recalls, ann_recalls, ivf_recalls = [], [], []
    for q in queries:
        truth = {ids[i] for i in exact(q)}
        recalls.append(len(truth & {cid for cid, _ in raw(q)}) / 10)
        ann_recalls.append(len(truth & {cid for cid, _ in ann(q)}) / 10)
        if ivf is not None:
            ivf_recalls.append(len(truth & {cid for cid, _ in ivf.search(q, 10)}) / 10)
    recall = sum(recalls) / len(recalls)
    ann_recall = sum(ann_recalls) / len(ann_recalls)
    graph = getattr(search, "graph", None) is not None
    path = (f"index file ({'HNSW graph, shortlist re-ranked exactly' if graph else 'IVF, nprobe ' + str(search.nprobe) if getattr(search, 'ivf', False) else 'flat'})"
            if type(search).__name__ == "IndexSearch" else ("exact numpy" if search.exact else "LanceDB ANN"))
    state = ann_state(col) + f"; product path: {path}"
    if ivf is not None:
        state += (f"; inverted file alone (nprobe {ivf.nprobe}): p50 {stats['ivf'][0]:.3f} ms, recall@10 "
                  f"{sum(ivf_recalls) / len(ivf_recalls):.3f}")
    state += (f"; ranker at depth 100 (hybrid's dense half): p50 {stats['raw100'][0]:.3f} ms; "
              f"BM25 public call p50 {stats['bm25'][0]:.3f} ms")
    col.close()
    return [name + (" (real MiniLM)" if real else ""), len(ids), built, stats["public"], stats["hybrid"],
            stats["raw"], stats["ann"], stats["exact"], recall, ann_recall, state, load_s]


def Collection_open(index: Path, name: str):
    from groundkit_datasette.retrieval.collection import Collection

    return Collection.open(name, index_dir=index)


def query_texts(col, n: int) -> list[str]:
    """Headings (or first words) of ``n`` chunks picked evenly through the collection: text queries
    for BM25 in hybrid, and for the model on a real collection."""
    total = col.query("SELECT count(*) FROM chunks")[0][0]
    step = max(1, total // max(n, 1))
    rows = col.query("SELECT heading, content FROM chunks WHERE id % ? = 0 ORDER BY id LIMIT ?", (step, n))
    out = []
    for heading, content in rows:
        text = (heading or "").strip() or " ".join((content or "").split()[:8])
        out.append(text or "documentation")
    while len(out) < n:
        out.append("zipf words about the section and its topic")
    return out


def run_real_vectors(vectors_path: str, queries_path: str, ids_path: str, sqlite_path: str, size: int,
                     repeats: int, work: Path, others: bool, nq: int = 200, probes=(8, 16, 24, 32, 48, 64),
                     widths=()) -> None:
    """Real MiniLM vectors given as raw float32 files (``/var/tmp/gk-vec/embed_real.py``): the index
    file (ours) against exact numpy search over the same vectors (the baseline and the truth), in
    the same run, passes interleaved; recall@10 and p50 per probe count; optionally faiss IVF-flat
    (memory-mapped) and usearch HNSW (``view=True``) on the same vectors."""
    import sqlite3

    import numpy as np

    from groundkit_datasette.indexing import vector_index as v

    dims = 384
    total = os.path.getsize(vectors_path) // (dims * 4)
    n = min(size, total)
    matrix = np.fromfile(vectors_path, dtype=np.float32, count=n * dims).reshape(n, dims)
    queries = np.fromfile(queries_path, dtype=np.float32).reshape(-1, dims)[:nq]
    ids = open(ids_path).read().split("\n")[:n]
    conn = sqlite3.connect(f"file:{sqlite_path}?immutable=1", uri=True)
    docs = dict(conn.execute("SELECT chunk_id, document_id FROM chunks"))
    doc_ids = [docs[i] for i in ids]
    folder = work / f"real-{n}"
    folder.mkdir(parents=True, exist_ok=True)
    name = v.index_file_name(1)
    t, cpu = time.perf_counter(), time.process_time()
    v.write_base_index(folder / name, 1, ids, doc_ids, matrix)
    build = (time.perf_counter() - t, time.process_time() - cpu)
    size_mb = (folder / name).stat().st_size / 1e6
    unit = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)

    def exact(q, k=10):
        scores = unit @ q
        top = np.argpartition(-scores, k)[:k]
        return top[np.argsort(-scores[top])]

    truth = [{ids[i] for i in exact(q)} for q in queries]
    # Short windows repeat (boilerplate lines): 16% of these vectors are exact duplicates, so the
    # true top 10 is often one of several equal sets. Recall counts a hit as found when its exact
    # score reaches the 10th best exact score (ties count), as well as by chunk id.
    kth = [float(np.sort(unit @ q)[-10]) for q in queries]

    def tie_recall(i, rows):
        q = queries[i]
        return min(10, sum(1 for r in rows if float(unit[r] @ q) >= kth[i] - 1e-5)) / 10

    position = {cid: j for j, cid in enumerate(ids)}
    print(f"\n## Real MiniLM vectors: {n:,} (of {total:,} embedded; whole rows), {len(queries)} queries, "
          f"{'process CPU' if CLOCK is not time.perf_counter else 'wall'} clock; index file "
          f"{size_mb:.0f} MB built in {build[0]:.1f} s wall / {build[1]:.1f} s CPU")
    rows = []
    default = v.IndexSearch(folder, name, 1, graph=False).nprobe
    chosen = v.GRAPH_EXPANSION_SEARCH
    settings = ([("graph", w) for w in sorted(set(widths) | {chosen})]
                + [("ivf", p) for p in sorted(set(probes) | {default})])
    for kind, nprobe in settings:
        v.GRAPH_EXPANSION_SEARCH = nprobe if kind == "graph" else chosen  # the graph's search width
        search = v.IndexSearch(folder, name, 1, nprobe=nprobe) if kind == "ivf" else v.IndexSearch(folder, name, 1)
        search.load()
        if kind == "graph" and search.graph is None:
            continue
        answers = [[c for c, _ in search.search(q, 10)] for q in queries]
        id_recall = float(np.mean([len(truth[i] & set(a)) / 10 for i, a in enumerate(answers)]))
        recall = float(np.mean([tie_recall(i, [position[c] for c in a]) for i, a in enumerate(answers)]))
        fns = {"ours": lambda q: search.search(q, 10), "ours depth 100": lambda q: search.search(q, 100),
               "numpy exact": exact}
        stats = _interleaved(fns, list(queries), repeats)
        ours, deep, base = stats["ours"], stats["ours depth 100"], stats["numpy exact"]
        met = ours[0] <= 10 and recall >= 0.95
        label = (f"HNSW graph ({search.base.graph_meta['dtype']}, shortlist {v.GRAPH_SHORTLIST}, width "
                 f"{nprobe}) + exact re-rank{' (default)' if nprobe == chosen else ''}" if kind == "graph"
                 else f"IVF-flat nprobe {nprobe}{' (default without the graph)' if nprobe == default else ''}")
        rows.append([label, search.base.centroids.shape[0]
                     if search.ivf else 1, ours[0], ours[1], deep[0], base[0], c.ratio(ours[0], base[0]), recall,
                     id_recall, "met" if met else "MISSED"])
    print(c.table(["ours (index file)", "lists", "ours p50", "ours p95", "ours p50 depth 100", "numpy exact p50",
                   "ours/numpy", "recall@10 (ties count)", "recall@10 by id", "p50<=10ms & recall>=0.95"], rows))
    v.GRAPH_EXPANSION_SEARCH = chosen
    if others:
        _other_engines(unit, queries, tie_recall, folder, repeats)


CLOCK = time.perf_counter


def _interleaved(fns: dict, queries: list, repeats: int) -> dict:
    """(p50, p95) per function, the passes of each alternating with the others' (load drifts).
    ``CLOCK`` is wall time, or with ``--cpu-clock`` the process's CPU time, every thread's
    (LanceDB's included; with one BLAS thread, near what a quiet machine's wall clock shows)."""
    passes = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            times = []
            for q in queries:
                t = CLOCK()
                f(q)
                times.append((CLOCK() - t) * 1000)
            passes[k].append(times)
    return {k: c.latency_stats(p) for k, p in passes.items()}


def _other_engines(unit, queries, tie_recall, folder: Path, repeats: int) -> None:
    """faiss IVF-flat read back with IO_FLAG_MMAP and usearch HNSW opened with view=True, on the same
    vectors (benchmark-only packages, absent from the product's dependencies)."""
    import numpy as np

    rows = []
    try:
        import faiss

        n = unit.shape[0]
        nlist = int(2 * n ** 0.5)
        t = time.perf_counter()
        quant = faiss.IndexFlatIP(unit.shape[1])
        index = faiss.IndexIVFFlat(quant, unit.shape[1], nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(unit[np.random.default_rng(0).choice(n, min(n, nlist * 32), replace=False)])
        index.add(unit)
        faiss.write_index(index, str(folder / "faiss.ivf"))
        build = time.perf_counter() - t
        mapped = faiss.read_index(str(folder / "faiss.ivf"), faiss.IO_FLAG_MMAP)
        faiss.omp_set_num_threads(1)
        for nprobe in (16, 32, 48):
            mapped.nprobe = nprobe
            f = lambda q: mapped.search(q[None, :], 10)  # noqa: E731
            recall = float(np.mean([tie_recall(i, [int(j) for j in f(q)[1][0]]) for i, q in enumerate(queries)]))
            p = _interleaved({"f": f}, list(queries), repeats)["f"]  # the same clock as ours
            rows.append([f"faiss IVF-flat mmap, nprobe {nprobe} of {nlist}", f"{build:.1f}", p[0], recall])
    except ImportError:
        rows.append(["faiss (not installed)", "-", None, None])
    try:
        from usearch.index import Index

        t = time.perf_counter()
        index = Index(ndim=unit.shape[1], metric="cos", dtype="f32")
        index.add(np.arange(unit.shape[0]), unit)
        index.save(str(folder / "usearch.hnsw"))
        build = time.perf_counter() - t
        view = Index.restore(str(folder / "usearch.hnsw"), view=True)
        for ef in (64, 128):
            view.expansion_search = ef
            f = lambda q: view.search(q, 10)  # noqa: E731
            recall = float(np.mean([tie_recall(i, [int(j) for j in f(q).keys]) for i, q in enumerate(queries)]))
            p = _interleaved({"f": f}, list(queries), repeats)["f"]  # the same clock as ours
            rows.append([f"usearch HNSW view=True, ef {ef}", f"{build:.1f}", p[0], recall])
    except ImportError:
        rows.append(["usearch (not installed)", "-", None, None])
    print(c.table(["alternative (same vectors, 1 thread)", "build s", "p50 ms (the same clock as ours)", "recall@10 (ties count)"], rows))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,200000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", help="directory for the synthetic collections (reused between runs)")
    ap.add_argument("--collection", action="append", default=[],
                    help="also an existing collection .sqlite3 built with --embedder synthetic")
    ap.add_argument("--real", action="append", default=[],
                    help="a collection .sqlite3 embedded with the default MiniLM: recall on real embeddings")
    ap.add_argument("--real-vectors", help="raw float32 MiniLM vectors (384-d), e.g. /var/tmp/gk-vec/real16.f32")
    ap.add_argument("--real-queries", help="raw float32 query vectors, e.g. /var/tmp/gk-vec/queries16.f32")
    ap.add_argument("--real-ids", help="one chunk id a line, the vectors' order")
    ap.add_argument("--real-sqlite", help="the collection those chunk ids come from (document ids)")
    ap.add_argument("--real-size", type=int, default=200_000)
    ap.add_argument("--others", action="store_true", help="also faiss and usearch on the real vectors")
    ap.add_argument("--probes", default="8,16,24,32,48,64",
                    help="inverted-file probe counts measured beside the graph on the real vectors")
    ap.add_argument("--widths", default="128",
                    help="graph search widths measured beside the default on the real vectors")
    ap.add_argument("--cpu-clock", action="store_true",
                    help="timings in process CPU time (set OPENBLAS_NUM_THREADS=1): for a loaded machine")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="gk-bench-dense-"))
    if args.cpu_clock:
        global CLOCK
        CLOCK = time.process_time
    if args.real_vectors:
        print(f"# Dense benchmark on real vectors ({c.machine()}, {time.strftime('%Y-%m-%d')})")
        run_real_vectors(args.real_vectors, args.real_queries, args.real_ids, args.real_sqlite, args.real_size,
                         args.repeats, work, args.others, args.queries,
                         probes=tuple(int(p) for p in args.probes.split(",") if p),
                         widths=tuple(int(w) for w in args.widths.split(",") if w))
        if not args.sizes and not args.collection and not args.real:
            return
    print(f"# Dense benchmark ({c.machine()}, {time.strftime('%Y-%m-%d')}); {args.queries} queries, "
          f"{args.repeats} passes; query embedding excluded")
    results = [run_size(work, int(s), args.queries, args.repeats) for s in args.sizes.split(",") if s]
    for extra in args.collection:
        p = Path(extra)
        results.append(run_collection(p.parent, p.name.removesuffix(".sqlite3"), args.queries, args.repeats,
                                      "earlier"))
    for extra in args.real:
        p = Path(extra)
        results.append(run_collection(p.parent, p.name.removesuffix(".sqlite3"), args.queries, args.repeats,
                                      "earlier", real=True))
    rows, notes = [], []
    for name, n, built, pub, hyb, raw, ann, ex, recall, ann_recall, state, load_s in results:
        met = pub[0] <= 10 and hyb[0] <= 10 and recall >= 0.95  # ours; LanceDB's recall is a baseline
        rows.append([name, f"{n:,}", pub[0], pub[1], hyb[0], raw[0], ann[0], ex[0], c.ratio(pub[0], ex[0]), recall,
                     ann_recall, "met" if met else "MISSED"])
        notes.append(f"{name}: {n:,} vectors; built {built}; numpy matrix loaded in {load_s:.1f} s; {state}")
    print(c.table(["collection", "vectors", "dense p50", "dense p95", "hybrid p50", "ranker p50",
                   "ANN forced p50", "numpy p50", "dense/numpy", "recall@10", "ANN recall@10",
                   "p50s<=10ms & recall>=0.95"], rows))
    print("dense/hybrid p50: the public call (query vector given); ranker: the product ranker alone (the index file's search); ANN forced: LanceDB's IVF_HNSW_SQ; numpy: exact "
          "matrix-vector product + argpartition over the same vectors (the baseline and the truth for recall)")
    print("\n".join(notes))


if __name__ == "__main__":
    main()
