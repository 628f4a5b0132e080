"""Real MiniLM embeddings of real text, cheaply enough for 200k vectors: short windows.

Embedding 200k whole chunks takes hours on 2 CPUs; recall of an ANN index needs real vectors
(anisotropic, clustered by topic as the model clusters text), not their full text. So: the
default embedder (int8 ONNX all-MiniLM-L6-v2) at ``--max-length`` word pieces (16: [CLS], 14
word pieces, [SEP]) over the first 20 words of each chunk of a collection, in chunk order, and
as queries 20 words from word 40 on of ``--queries`` chunks spread through it (other text than
any corpus window). Raw float32 rows are appended, so an interrupted run resumes.

    python benchmarks/real_vectors.py --collection /var/tmp/gk-debian/debian-docs.sqlite3 \
        --out /var/tmp/gk-vec/real16 --count 200000
    python benchmarks/dense.py --sizes '' --real-vectors /var/tmp/gk-vec/real16.f32 \
        --real-queries /var/tmp/gk-vec/real16.queries.f32 --real-ids /var/tmp/gk-vec/real16.ids \
        --real-sqlite /var/tmp/gk-debian/debian-docs.sqlite3 --others
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import sqlite3
import time


def main(argv=None):
    import numpy as np

    from groundkit_datasette.embedding.embedders import MiniLMEmbedder

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collection", required=True, help="a collection .sqlite3 (read only)")
    ap.add_argument("--out", required=True, help="path prefix: OUT.f32, OUT.ids, OUT.queries.f32/.txt")
    ap.add_argument("--count", type=int, default=200_000)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--max-length", type=int, default=16)
    args = ap.parse_args(argv)
    conn = sqlite3.connect(f"file:{args.collection}?immutable=1", uri=True)
    rows = conn.execute("SELECT chunk_id, content FROM chunks ORDER BY id").fetchall()
    embedder = MiniLMEmbedder(max_length=args.max_length, batch_size=64)
    out = args.out
    if not os.path.exists(out + ".queries.f32"):
        picks = [r[1].split() for r in rows[:: max(1, len(rows) // (4 * args.queries))]]
        texts = [" ".join(w[40:60]) for w in picks if len(w) >= 60][: args.queries]
        with open(out + ".queries.txt", "w") as f:
            f.write("\n".join(texts))
        embedder.embed(texts).astype(np.float32).tofile(out + ".queries.f32.tmp")
        os.replace(out + ".queries.f32.tmp", out + ".queries.f32")
    rows = rows[: args.count]
    with open(out + ".ids", "w") as f:
        f.write("\n".join(r[0] for r in rows))
    done = os.path.getsize(out + ".f32") // (embedder.dimensions * 4) if os.path.exists(out + ".f32") else 0
    started = time.time()
    with open(out + ".f32", "ab") as f:
        for i in range(done, len(rows), 2048):
            texts = [" ".join(r[1].split()[:20]) for r in rows[i : i + 2048]]
            f.write(np.ascontiguousarray(embedder.embed(texts), dtype=np.float32).tobytes())
            f.flush()
            rate = (i + len(texts) - done) / (time.time() - started)
            print(f"{i + len(texts):,}/{len(rows):,} vectors, {rate:.0f}/s", flush=True)


if __name__ == "__main__":
    main()
