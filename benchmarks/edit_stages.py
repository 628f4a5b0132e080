"""One-file edits in one process, per stage (issue 14, adr/0034-one-file-edit-cost.md): wall and CPU seconds of each
stage of ``Indexer.ingest`` (``Indexer.timings``), lancedb imported first as in a long-running
``groundkit ingest --watch``. The fresh-process comparison with the baseline is benchmarks/ingest.py
--debian --incremental-from.

    python benchmarks/edit_stages.py COPY_OF_A_VECTOR_COLLECTION_DIR [EDITS]

The directory must hold ``debian-docs.sqlite3`` and ``debian-docs.lance`` (a copy: it is
written); the edited file is the one benchmarks/ingest.py edits. The first edit is not counted.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

from benchmarks import _common as c  # noqa: E402
from benchmarks import _synthetic  # noqa: E402

SOURCE = "rust-doc/html/std/primitive.reference.html"


def main() -> None:
    _synthetic.register()
    import lancedb  # noqa: F401  (paid once, as in a long-running process)

    from groundkit_datasette.indexing.ingest import Indexer

    index_dir, edits = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 5
    cpu: dict[str, float] = {}
    mark = Indexer._mark

    def timed_mark(self, stage):
        now = time.process_time()
        cpu[stage] = cpu.get(stage, 0.0) + now - getattr(self, "_last_cpu", now)
        self._last_cpu = now
        mark(self, stage)

    Indexer._mark = timed_mark
    base = index_dir.parent / (index_dir.name + "-src")
    target = base / SOURCE
    target.parent.mkdir(parents=True, exist_ok=True)
    original = (Path("/usr/share/doc") / SOURCE).read_bytes()
    print(f"# One-file edits in one process ({c.machine()})")
    walls, cpus, totals = [], [], []
    for i in range(edits):
        words = "postings and vectors" if i % 2 else "incremental ingest"
        target.write_bytes(original + f"\n<p>A paragraph about {words}.</p>\n".encode())
        indexer = Indexer("debian-docs", index_dir=index_dir, base_dir=base)
        cpu.clear()
        t, c0 = time.perf_counter(), time.process_time()
        indexer._last_cpu = c0
        indexer.ingest([target])
        totals.append((time.perf_counter() - t, indexer.published_seconds, time.process_time() - c0))
        walls.append(dict(indexer.timings))
        cpus.append(dict(cpu))
        print(f"edit {i}: call {totals[-1][0]:.2f} s, published {totals[-1][1]:.2f} s, CPU {totals[-1][2]:.2f} s, "
              f"postings {'rebuilt' if indexer.postings_rebuilt else 'updated'}, load {os.getloadavg()[0]:.1f}",
              flush=True)
    rows = [[stage, statistics.median(w.get(stage, 0.0) for w in walls[1:]),
             statistics.median(x.get(stage, 0.0) for x in cpus[1:])] for stage in walls[-1]]
    rows.append(["published after", statistics.median(x[1] for x in totals[1:]), ""])
    rows.append(["call returned after", statistics.median(x[0] for x in totals[1:]),
                 statistics.median(x[2] for x in totals[1:])])
    print(c.table(["stage", "wall s (median)", "CPU s (median)"], rows))


if __name__ == "__main__":
    main()
