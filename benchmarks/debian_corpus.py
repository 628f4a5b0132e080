"""A large real corpus: Debian documentation packages ingested into one collection.

Installs the packages with apt-get (root; skip with --no-install), lists their
HTML and text files under /usr/share/doc with ``dpkg -L``, and ingests them with
the normal Indexer (BM25 only by default), printing how long ingest took. With
the default packages the collection passes 200,000 chunks; ``--max-files``
ingests a subset spread evenly over the packages (for machines where the full
run takes too long) and extrapolates.

    sudo python benchmarks/debian_corpus.py --index-dir /var/tmp/gk-debian
    python benchmarks/debian_corpus.py --no-install --max-files 5000 --index-dir /tmp/gk-debian
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
import itertools
import subprocess
import time
from pathlib import Path

from benchmarks import _common as c  # noqa: E402

PACKAGES = ("python3.11-doc", "postgresql-doc-15", "perl-doc", "git-doc", "sqlite3-doc", "openjdk-17-doc",
            "rust-doc")
DOC_ROOT = Path("/usr/share/doc")
SUFFIXES = {".html", ".htm", ".txt", ".md", ".rst"}


def install(packages) -> None:
    if os.geteuid() != 0:
        sys.exit("installing needs root (or pass --no-install when the packages are there)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages], check=True, env=env)


def package_files(package: str) -> list[Path]:
    """The package's own regular HTML/text files under /usr/share/doc (symlinks left out)."""
    out = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"warning: {package} is not installed", file=sys.stderr)
        return []
    files = []
    for line in out.stdout.splitlines():
        p = Path(line)
        if p.suffix.lower() in SUFFIXES and DOC_ROOT in p.parents and p.is_file() and not p.is_symlink():
            files.append(p)
    return sorted(files)


def round_robin(lists: list[list[Path]], limit: int | None) -> list[Path]:
    mixed = [p for group in itertools.zip_longest(*lists) for p in group if p is not None]
    return mixed[:limit] if limit else mixed


class Progress:
    def __init__(self):
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.chunks = 0

    def __call__(self, event):
        if event["event"] == "document":
            self.chunks += event["chunks"]
        elif event["event"] == "file":
            now = time.perf_counter()
            if now - self.last > 15 or event["done"] == event["total"]:
                self.last = now
                el = now - self.t0
                print(f"  {event['done']:,}/{event['total']:,} files, {self.chunks:,} chunks, {el:.0f} s "
                      f"({self.chunks / max(el, 1e-9):.0f} chunks/s)", flush=True)
        elif event["event"] == "postings":
            print(f"  rebuilding BM25 postings and publishing at {time.perf_counter() - self.t0:.0f} s", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packages", default=",".join(PACKAGES))
    ap.add_argument("--no-install", action="store_true")
    ap.add_argument("--index-dir", default="/var/tmp/groundkit-debian")
    ap.add_argument("--collection", default="debian-docs")
    ap.add_argument("--embedder", default="none", help="'none' (default), an embedder name such as minilm, or 'synthetic' "
                         "(benchmarks/_synthetic.py's random vectors, for dense figures at this size)")
    ap.add_argument("--max-files", type=int, help="ingest only this many files, spread over the packages")
    args = ap.parse_args(argv)
    packages = [p for p in args.packages.split(",") if p]
    if not args.no_install:
        t = time.perf_counter()
        install(packages)
        print(f"installed {len(packages)} packages in {time.perf_counter() - t:.0f} s")

    from groundkit_datasette.indexing.ingest import Indexer

    if args.embedder == "synthetic":
        # Clustered random vectors from a registered plugin: dense figures at this size without a model.
        from benchmarks import _synthetic

        _synthetic.register()

    per_package = {p: package_files(p) for p in packages}
    all_files = round_robin(list(per_package.values()), None)
    files = round_robin(list(per_package.values()), args.max_files)
    total_bytes = sum(p.stat().st_size for p in all_files)
    chosen_bytes = sum(p.stat().st_size for p in files)
    print(f"# Debian documentation corpus ({c.machine()}, {time.strftime('%Y-%m-%d')})")
    for p, fl in per_package.items():
        print(f"  {p}: {len(fl):,} files")
    print(f"ingesting {len(files):,} of {len(all_files):,} files ({chosen_bytes / 2**20:.0f} of "
          f"{total_bytes / 2**20:.0f} MiB) into '{args.collection}' in {args.index_dir} (embedder {args.embedder})")
    indexer = Indexer(args.collection, index_dir=args.index_dir, base_dir=DOC_ROOT, embedder=args.embedder,
                      progress=Progress())
    report = indexer.ingest(files)
    print(f"ingest took {report.seconds:.1f} s: {report.added:,} added, {report.updated:,} updated, "
          f"{report.unchanged:,} unchanged, {sum(report.skipped.values()):,} skipped, {report.failed} failed; "
          f"{report.chunks_written:,} chunks written ({report.chunks_per_second:.0f} chunks/s), "
          f"generation {report.generation}")
    for reason, n in sorted(report.skipped.items()):
        print(f"  skipped ({reason}): {n:,}")
    from groundkit_datasette.retrieval.collection import Collection

    with Collection.open(args.collection, index_dir=args.index_dir) as col:
        st = col.status()
    size = Path(args.index_dir, args.collection + ".sqlite3").stat().st_size
    print(f"collection: {st.documents:,} documents, {st.chunks:,} chunks, {st.bm25_terms:,} terms, "
          f"{size / 2**20:.0f} MiB; >= 200,000 chunks: {'yes' if st.chunks >= 200_000 else 'no'}")
    if args.max_files and chosen_bytes and report.chunks_written:
        scale = total_bytes / chosen_bytes
        print(f"extrapolated to every file: ~{st.chunks * scale:,.0f} chunks, ~{report.seconds * scale / 60:.0f} min "
              "(by bytes; HTML sizes vary)")


if __name__ == "__main__":
    main()
