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
                    f"ingest: {event['done']}/{event['total']} files read",
                    file=self.stream,
                )
        elif kind == "postings":
            self._close()
            click.echo(f"ingest: {self.chunks} chunks written; rebuilding the BM25 index and publishing",
                       file=self.stream)
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

    options = _key_values(embedder_option, "--embedder-option")
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


def _open(collection, index_dir, base_dir=None, reranker=None):
    from .collection import Collection
    from .names import resolve_collection_arg

    directory, name = resolve_collection_arg(collection, index_dir)
    return Collection.open(name, index_dir=directory, base_dir=base_dir, reranker=reranker)


def _reranker_from_options(name, options):
    if not name:
        return None
    from .rerankers import get_reranker

    return get_reranker(name, **_key_values(options, "--reranker-option"))


def _key_values(items, hint):
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter("expected KEY=VALUE", param_hint=hint)
        out[key] = value
    return out


_index_dir_option = click.option(
    "--index-dir", default=".", show_default=True, type=click.Path(file_okay=False),
    help="Directory holding the collections.",
)


@cli.command()
@click.argument("collection")
@click.argument("query")
@_index_dir_option
@click.option("--mode", type=click.Choice(["bm25", "dense", "hybrid"]),
              help="Default: hybrid when the collection has vectors, else bm25.")
@click.option("--top-k", default=10, show_default=True, type=int)
@click.option("--rerank", is_flag=True, help="Rerank with --reranker.")
@click.option("--reranker", help="Reranker name: cross-encoder or http (or a plugin's).")
@click.option("--reranker-option", multiple=True, metavar="KEY=VALUE",
              help="e.g. -R model_dir=./ms-marco-onnx", )
@click.option("--source", help="Only sources with this prefix (or matching this glob).")
@click.option("--json", "as_json", is_flag=True, help="Print the response model as JSON.")
def search(collection, query, index_dir, mode, top_k, rerank, reranker, reranker_option, source,
           as_json):
    """Search COLLECTION (a name in --index-dir, or a path to a .sqlite3 file)."""
    from pydantic import ValidationError

    from .models import SearchRequest

    try:
        request = SearchRequest(query=query, mode=mode, top_k=top_k, rerank=rerank, source=source)
    except ValidationError as exc:
        raise click.UsageError("; ".join(e["msg"] for e in exc.errors())) from None
    try:
        with _open(collection, index_dir,
                   reranker=_reranker_from_options(reranker, reranker_option)) as col:
            response = col.search(request)
    except GroundkitError as error:
        _fail(error)
    if as_json:
        click.echo(response.model_dump_json(indent=2))
        return
    click.echo(f"{len(response.hits)} hits ({response.mode}, generation {response.generation}, "
               f"{response.timings_ms.get('total_ms', 0):.1f} ms)")
    for hit in response.hits:
        where = f"{hit.source}:{hit.line_start}-{hit.line_end}"
        click.echo(f"{hit.rank:>3}. {hit.score:.4f}  {where}  [{hit.chunk_id}]")
        if hit.heading:
            click.echo(f"     {hit.heading}")
        snippet = " ".join(hit.content.split())
        click.echo(f"     {snippet[:160]}{'...' if len(snippet) > 160 else ''}")


@cli.command("fetch-chunk")
@click.argument("collection")
@click.argument("chunk_id")
@_index_dir_option
@click.option("--base-dir", type=click.Path(file_okay=False),
              help="Where sources are re-read from. Default: the base directory recorded at ingest.")
@click.option("--json", "as_json", is_flag=True)
def fetch_chunk(collection, chunk_id, index_dir, base_dir, as_json):
    """Fetch a chunk and verify its citation against the current source."""
    from pydantic import ValidationError

    try:
        with _open(collection, index_dir, base_dir=base_dir) as col:
            response = col.fetch_chunk(chunk_id)
    except ValidationError:
        raise click.UsageError("chunk id must look like c_ followed by 24 hex digits") from None
    except GroundkitError as error:
        _fail(error)
    if as_json:
        click.echo(response.model_dump_json(indent=2))
        return
    c, v = response.chunk, response.verification
    click.echo(f"{c.source}:{c.line_start}-{c.line_end} [{c.start_offset}:{c.end_offset}] {c.heading}")
    click.echo(f"{v.status}: {v.reason}")
    if v.relocated is not None:
        r = v.relocated
        click.echo(f"now at lines {r.line_start}-{r.line_end} [{r.start_offset}:{r.end_offset}]")
    click.echo("")
    click.echo(c.content)


@cli.command()
@click.argument("collection")
@_index_dir_option
@click.option("--json", "as_json", is_flag=True)
def status(collection, index_dir, as_json):
    """Counts, embedding manifest and generation of a collection."""
    try:
        with _open(collection, index_dir) as col:
            response = col.status()
    except GroundkitError as error:
        _fail(error)
    if as_json:
        click.echo(response.model_dump_json(indent=2))
        return
    for key, value in response.model_dump().items():
        click.echo(f"{key}: {value}")


@cli.command()
@_index_dir_option
@click.option("--json", "as_json", is_flag=True)
def collections(index_dir, as_json):
    """List the collections in --index-dir."""
    from .collection import list_collections

    response = list_collections(index_dir)
    if as_json:
        click.echo(response.model_dump_json(indent=2))
        return
    for name in response.collections:
        click.echo(name)


@cli.command()
@click.option("--index-dir", type=click.Path(file_okay=False),
              help="Serve every collection in this directory. Default: plugins.groundkit.index_dir "
                   "from --metadata, else the current directory.")
@click.option("--base-dir", type=click.Path(file_okay=False),
              help="Where fetch_chunk re-reads sources to verify citations.")
@click.option("--metadata", "-m", type=click.File("r"),
              help="Datasette metadata (YAML or JSON), e.g. permissions and plugins.groundkit settings.")
@click.option("--as-user", "as_user", metavar="ID",
              help="Answer as this Datasette actor id (default: anonymous). Permissions and "
                   "document access lists apply to it.")
@click.option("--group", "groups", multiple=True, metavar="NAME",
              help="A group of that actor, for document access lists (repeatable).")
def mcp(index_dir, base_dir, metadata, as_user, groups):
    """Serve the collections as MCP tools over stdio (for Claude Desktop, IDEs and other clients)."""
    # stdout carries JSON-RPC frames only: claim it before anything else can write to it.
    from .mcp_server import claim_stdout

    wire = claim_stdout()
    import asyncio
    from pathlib import Path

    from datasette.app import Datasette
    from datasette.utils import BadMetadataError, parse_metadata

    from .mcp_server import run_stdio

    try:
        config = dict(parse_metadata(metadata.read()) or {}) if metadata is not None else {}
    except BadMetadataError as exc:
        raise click.BadParameter(str(exc), param_hint="--metadata") from None
    plugins = dict(config.get("plugins") or {})
    settings = dict(plugins.get("groundkit") or {})
    if index_dir is not None:
        settings["index_dir"] = index_dir
    settings.setdefault("index_dir", ".")
    if base_dir is not None:
        settings["base_dir"] = base_dir
    if not Path(settings["index_dir"]).is_dir():
        raise click.UsageError(f"index directory not found: {settings['index_dir']}")
    plugins["groundkit"] = settings
    config["plugins"] = plugins

    # Chosen by whoever launches the process, who can read the files anyway: this scopes
    # what an agent on the other end sees, it does not grant anything.
    actor = None
    if as_user or groups:
        actor = {"groups": sorted(set(groups)), "auth": "stdio"}
        if as_user:
            actor["id"] = as_user

    async def serve():
        # The same configuration path as `datasette serve`: our startup hook attaches
        # every collection in index_dir as an immutable database.
        datasette = Datasette(files=[], metadata=config)
        try:
            await datasette.invoke_startup()
        except ValueError as exc:  # unknown plugin settings: say so, without a traceback
            raise click.ClickException(str(exc)) from None
        await run_stdio(datasette, stdout=wire, actor=actor)

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


@cli.command("eval")
@click.argument("dataset_dirs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--collection", "-c", help="Collection to build or reuse. Default: from the data set directory's name.")
@click.option("--index-dir", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Directory for the collection and its <name>-sources/ files.")
@click.option("--modes", help="Comma-separated: bm25,dense,hybrid. Default: all the collection supports.")
@click.option("--rerank", is_flag=True, help="Rerank each mode's top 50 with --reranker.")
@click.option("--reranker", help="Reranker name: cross-encoder or http (or a plugin's).")
@click.option("--reranker-option", multiple=True, metavar="KEY=VALUE")
@click.option("--top-k", "depth", default=100, show_default=True, type=int,
              help="Ranking depth per query (Recall@100 needs 100).")
@click.option("--embedder", help="Embedder for a new collection, or 'none' for BM25 only. "
                                 "Default: the collection's own, else 'minilm'.")
@click.option("--runs-db", type=click.Path(dir_okay=False),
              help="SQLite file the runs are appended to. Default: <index-dir>/groundkit-eval.sqlite3.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def eval_command(dataset_dirs, collection, index_dir, modes, rerank, reranker, reranker_option, depth,
                 embedder, runs_db, as_json):
    """Score retrieval on BEIR-layout data sets: nDCG@10, Recall@10/100, MRR@10, latency.

    Several data set directories are evaluated in turn (``groundkit eval data/*``) and
    their runs share one batch id in the runs database.
    """
    import os

    from .evaluate import evaluate_many, format_summary, format_table

    mode_list = [m.strip() for m in modes.split(",") if m.strip()] if modes else None
    # A shell glob (data/*) also names files such as a README: those are passed over.
    files = [d for d in dataset_dirs if not os.path.isdir(d)]
    dataset_dirs = [d for d in dataset_dirs if os.path.isdir(d)]
    if not dataset_dirs:
        raise click.BadParameter("give at least one data set directory", param_hint="DATASET_DIRS")
    for name in files:
        click.echo(f"skipping {os.path.basename(name)}: not a directory", err=True)
    try:
        reports, errors = evaluate_many(
            dataset_dirs,
            collection=collection,
            index_dir=index_dir,
            modes=mode_list,
            rerank=rerank,
            reranker=_reranker_from_options(reranker, reranker_option),
            depth=depth,
            embedder=embedder,
            runs_db=runs_db,
            progress=_Progress(),
            log=lambda message: click.echo(message, err=True),
        )
    except GroundkitError as error:
        _fail(error)
    if as_json:
        out = [r.as_dict() for r in reports]
        click.echo(json.dumps(out[0] if len(dataset_dirs) == 1 else
                              {"reports": out, "errors": errors}, indent=2))
    else:
        click.echo("\n\n".join(format_table(r) for r in reports))
        if len(dataset_dirs) > 1:
            click.echo("\n" + format_summary(reports, errors))
    if errors or any(r.failures for r in reports):
        sys.exit(1)


if __name__ == "__main__":
    cli()
