"""Retrieval quality: our BM25 against bm25s on every judged irdata collection, in one run.

Ours is scored exactly as `groundkit eval --modes bm25 --embedder none` scores it (the
same function, the same collections, built or reused in --index-dir, runs appended to its
runs database): chunks ranked, a document ranked where its best chunk is. bm25s gets the
whole documents (title + text, as the corpus gives them) with its default settings
(Lucene BM25, k1 1.5, b 0.75), the PyStemmer English stemmer and its English stop words,
as issue 15 measured it. Both are scored with the same nDCG@10 (trec_eval's ndcg_cut).

    python benchmarks/quality.py                      # all five collections
    python benchmarks/quality.py --corpora cisi,cacm --check   # exit 1 when ours is below

--header measures the contextual header (adr/0035-contextual-title-header.md) where it is
needed: each corpus written as HTML pages (the title in ``<title>`` only, the text in one
``<p>``, no headings), ingested without the header (``Indexer(title_header=False)``, the
chunks of before) and with it, scored the way ``groundkit eval`` scores, side by side; then
BM25-only ingest of the same HTML files, fresh builds, the two variants interleaved (CPU time):

    python benchmarks/quality.py --header                         # BM25, all five
    python benchmarks/quality.py --header --modes bm25,dense,hybrid --corpora cisi,cranfield,cacm
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks import _common as c  # noqa: E402

COLLECTIONS = ("cranfield", "nfcorpus_approx", "cisi", "med", "cacm")


def bm25s_ndcg(dataset) -> tuple[float, float]:
    """(mean nDCG@10, index seconds) of bm25s over the whole documents of ``dataset``."""
    import bm25s
    import Stemmer

    from groundkit_datasette.evaluation.evaluate import document_text, ndcg_at

    stemmer = Stemmer.Stemmer("english")
    docs = list(dataset.corpus())
    ids = [str(d["_id"]) for d in docs]
    t = time.perf_counter()
    tokens = bm25s.tokenize([document_text(d) for d in docs], stopwords="en", stemmer=stemmer,
                            show_progress=False)
    retriever = bm25s.BM25()
    retriever.index(tokens, show_progress=False)
    index_s = time.perf_counter() - t
    scores = []
    for qid in dataset.judged_queries:
        words = bm25s.tokenize([dataset.queries[qid]], stopwords="en", stemmer=stemmer,
                               show_progress=False, return_ids=False)[0]
        words = [w for w in words if w in retriever.vocab_dict]
        ranking = []
        if words:
            found, values = retriever.retrieve([words], k=min(10, len(ids)), show_progress=False)
            # A zero score is no match: bm25s fills k with arbitrary documents otherwise.
            ranking = [ids[j] for j, s in zip(found[0], values[0]) if s > 0]
        scores.append(ndcg_at(ranking, dataset.qrels[qid], 10))
    return sum(scores) / len(scores), index_s


def header_comparison(names, dirs, index_dir: str, modes: list[str], repeats: int, log) -> dict:
    """nDCG@10 per mode without and with the title header, and BM25-only ingest rates."""
    import shutil
    import statistics

    from groundkit_datasette.indexing.ingest import Indexer
    from groundkit_datasette.evaluation.evaluate import default_collection_name, evaluate, load_dataset

    embedder = "none" if modes == ["bm25"] else None
    variants = (("without", False), ("with", True))
    figures = {}
    for name, directory in zip(names, dirs):
        row = {}
        for label, on in variants:
            report = evaluate(directory, index_dir=Path(index_dir) / f"html-{label}", modes=modes,
                              embedder=embedder, source_format="html",
                              indexer_options={"title_header": on}, log=log)
            row[label] = {"chunks": report.chunks, "batch": report.batch,
                          **{r.mode: r.ndcg_at_10 for r in report.results}}
        # Ingest cost: fresh BM25-only builds of the same HTML files, interleaved.
        collection = default_collection_name(load_dataset(directory))
        sources = Path(index_dir) / "html-with" / f"{collection}-sources"
        rates = {label: [] for label, _ in variants}
        for i in range(repeats):
            for label, on in (variants if i % 2 == 0 else variants[::-1]):
                target = Path(tempfile.mkdtemp(prefix="gk-header-", dir=index_dir))
                try:
                    cpu = time.process_time()
                    report = Indexer(collection, index_dir=target, base_dir=sources, embedder="none",
                                     title_header=on, spare_copy=False).ingest([sources])
                    cpu = time.process_time() - cpu
                    rates[label].append((report.chunks_written / cpu, report.chunks_per_second))
                finally:
                    shutil.rmtree(target, ignore_errors=True)
        for label, _ in variants:
            row[label]["ingest_chunks_per_cpu_s"] = round(statistics.median(r[0] for r in rates[label]), 1)
            row[label]["ingest_chunks_per_wall_s"] = round(statistics.median(r[1] for r in rates[label]), 1)
        figures[name] = row
    return figures


def print_header_comparison(figures: dict, modes: list[str]) -> None:
    headers = ["collection", "chunks"]
    for mode in modes:
        headers += [f"{mode} without", f"{mode} with", "delta"]
    headers += ["ingest chunks/CPU s without", "with", "ratio"]
    rows = []
    for name, f in figures.items():
        w, o = f["with"], f["without"]
        row = [name, f"{o['chunks']}/{w['chunks']}"]
        for mode in modes:
            row += [f"{o[mode]:.4f}", f"{w[mode]:.4f}", f"{w[mode] - o[mode]:+.4f}"]
        ratio = w["ingest_chunks_per_cpu_s"] / o["ingest_chunks_per_cpu_s"]
        row += [f"{o['ingest_chunks_per_cpu_s']:,.0f}", f"{w['ingest_chunks_per_cpu_s']:,.0f}", f"{ratio:.3f}"]
        rows.append(row)
    print(c.table(headers, rows))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpora", default=",".join(COLLECTIONS), help="irdata collections (comma-separated)")
    ap.add_argument("--index-dir", default=os.path.join(tempfile.gettempdir(), "groundkit-quality"),
                    help="where the collections are built, and reused by the next run")
    ap.add_argument("--json", dest="json_out", help="also write the figures to this JSON file")
    ap.add_argument("--check", action="store_true", help="exit 1 if ours is below bm25s anywhere")
    ap.add_argument("--header", action="store_true",
                    help="compare the corpora as HTML pages without and with the contextual title header")
    ap.add_argument("--modes", default="bm25", help="with --header: modes to score (bm25,dense,hybrid)")
    ap.add_argument("--repeats", type=int, default=3, help="with --header: fresh ingests per variant")
    args = ap.parse_args(argv)

    if args.header:
        from groundkit_datasette.evaluation.evaluate import MODES

        modes = [m for m in args.modes.split(",") if m]
        if not modes or any(m not in MODES for m in modes):
            sys.exit(f"--modes: use some of {', '.join(MODES)}")
        names = [n for n in args.corpora.split(",") if n]
        print(f"# quality --header: {c.machine()}; index dir {args.index_dir}")
        figures = header_comparison(names, [c.irdata(n) for n in names], args.index_dir, modes,
                                    args.repeats, lambda m: print(f"  {m}", file=sys.stderr))
        print_header_comparison(figures, modes)
        print(f"# after: {c.machine()}")
        if args.json_out:
            Path(args.json_out).write_text(json.dumps({"modes": modes, "collections": figures}, indent=2))
        return

    from groundkit_datasette.retrieval import bm25
    from groundkit_datasette.evaluation.evaluate import evaluate_many, load_dataset

    names = [n for n in args.corpora.split(",") if n]
    dirs = [c.irdata(n) for n in names]
    print(f"# quality: {c.machine()}; {c.versions('bm25s', 'PyStemmer')}; ours: bm25 "
          f"{json.dumps(bm25.settings())}; index dir {args.index_dir}")
    reports, errors = evaluate_many(dirs, index_dir=args.index_dir, modes=["bm25"], embedder="none",
                                    log=lambda m: print(f"  {m}", file=sys.stderr))
    if errors:
        sys.exit(f"evaluation failed: {errors}")
    rows, figures = [], {}
    for name, directory, report in zip(names, dirs, reports):
        ours = report.results[0].ndcg_at_10
        theirs, index_s = bm25s_ndcg(load_dataset(directory))
        gap = ours - theirs
        figures[name] = {"ours": ours, "bm25s": round(theirs, 4), "gap": round(gap, 4),
                         "queries": report.results[0].queries, "chunks": report.chunks,
                         "documents": report.documents, "bm25s_index_s": round(index_s, 3)}
        rows.append([name, f"{ours:.4f}", f"{theirs:.4f}", f"{gap:+.4f}", "met" if gap >= 0 else "missed"])
    print(c.table(["collection", "ours nDCG@10", "bm25s", "gap", "target"], rows))
    met = sum(1 for f in figures.values() if f["gap"] >= 0)
    print(f"ours >= bm25s on {met} of {len(figures)}; runs stored in batch {reports[0].batch}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"bm25": bm25.settings(), "collections": figures}, indent=2))
    if args.check and met < len(figures):
        sys.exit(1)


if __name__ == "__main__":
    main()
