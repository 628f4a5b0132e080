"""The ``groundkit`` command line: a thin layer over the Python API."""

import json
import logging
import sys
import time

import click

from .errors import GroundkitError


def _fail(error: GroundkitError):
    click.echo(f"Error: {error}", err=True)
    sys.exit(2 if error.kind.startswith("invalid") else 1)


@click.group()
@click.version_option(package_name="groundkit-datasette")
@click.option("-v", "--verbose", count=True, help="More log output on stderr.")
def cli(verbose):
    """Ingest documents into collections and search and cite them."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


class _Progress:
    """A bar on a terminal, a plain line every few seconds otherwise."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.tty = stream.isatty()
        self.bar = None
        self.last = 0.0
        self.chunks = 0

    def __call__(self, event):
        kind = event["event"]
        if kind == "start":
            if self.tty and event["total"]:
                self.bar = click.progressbar(length=event["total"], label="ingest", file=self.stream)
                self.bar.__enter__()
        elif kind == "document":
            self.chunks += event["chunks"]
        elif kind == "file":
            if self.bar is not None:
                self.bar.update(1)
            elif time.monotonic() - self.last > 2 or event["done"] == event["total"]:
                self.last = time.monotonic()
                click.echo(
                    f"ingest: {event['done']}/{event['total']} files, {self.chunks} chunks written",
                    file=self.stream,
                )
        elif kind == "postings":
            self._close()
            click.echo("ingest: rebuilding the BM25 index and publishing", file=self.stream)
        elif kind == "done":
            self._close()

    def _close(self):
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--collection", "-c", required=True, help="Collection name (letters, digits, - and _).")
@click.option("--index-dir", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Directory holding <name>.sqlite3 and <name>.lance.")
@click.option("--base-dir", type=click.Path(file_okay=False),
              help="Only files under this directory are read; sources are stored relative to it. "
                   "Default: the common root of PATHS.")
@click.option("--embedder", help="Embedder name, or 'none' for a BM25-only collection. "
                                 "Default: the collection's own, else 'minilm'.")
@click.option("--embedder-option", "-o", multiple=True, metavar="KEY=VALUE",
              help="Option for the embedder, e.g. -o base_url=https://... -o api_key_env=MY_KEY.")
@click.option("--chunk-size", default=1000, show_default=True, type=int, help="Characters per chunk.")
@click.option("--chunk-overlap", default=100, show_default=True, type=int,
              help="Characters shared by consecutive chunks of one section.")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Skip files or directories matching GLOB.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def ingest(paths, collection, index_dir, base_dir, embedder, embedder_option, chunk_size,
           chunk_overlap, exclude, as_json):
    """Ingest files and directories into a collection (incremental)."""
    from .ingest import Indexer

    options = {}
    for item in embedder_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter("expected KEY=VALUE", param_hint="--embedder-option")
        options[key] = value
    try:
        indexer = Indexer(
            collection,
            index_dir=index_dir,
            base_dir=base_dir,
            embedder=embedder,
            embedder_options=options,
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            exclude=exclude,
            progress=_Progress(),
        )
        report = indexer.ingest(paths)
    except GroundkitError as error:
        _fail(error)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    skipped = sum(report.skipped.values())
    click.echo(
        f"{report.added} added, {report.updated} updated, {report.unchanged} unchanged, "
        f"{report.removed} removed, {skipped} skipped, {report.failed} failed"
    )
    for reason, count in sorted(report.skipped.items()):
        click.echo(f"  skipped ({reason}): {count}")
    for source, reason in report.failed_files:
        click.echo(f"  failed: {source} ({reason})")
    click.echo(
        f"{report.chunks_written} chunks written ({report.chunks_embedded} embedded) in "
        f"{report.seconds:.2f} s, {report.chunks_per_second:.0f} chunks/s; "
        f"generation {report.generation}" + ("" if report.published else " (nothing changed)")
    )

if __name__ == "__main__":
    cli()
