"""The ``groundkit`` command line: a thin layer over the Python API.

Exit statuses (README.md, "Exit statuses"): 0 success; 2 a usage error or a refused request
(click's own code for usage errors); 1 any other error. ``ingest`` also exits 1 when some files
failed and 3 when files failed and none was written; ``fetch-chunk`` exits 0 only for a verified
citation, 3 for drifted and 4 for unresolvable.
"""

import json
import logging
import shlex
import sys
import time
from pathlib import Path

import click

from .errors import GroundkitError

EXIT_ERROR = 1
EXIT_USAGE = 2
INGEST_SOME_FAILED = 1
INGEST_ALL_FAILED = 3
FETCH_DRIFTED = 3
FETCH_UNRESOLVABLE = 4
FETCH_EXIT = {"verified": 0, "drifted": FETCH_DRIFTED, "unresolvable": FETCH_UNRESOLVABLE}
# Skipped and failed files the plain ingest summary names before pointing at -v / --json.
SUMMARY_FILES = 5


# Commands that print one answer and exit.
ONE_ANSWER_COMMANDS = frozenset({"search", "fetch-chunk", "status", "collections"})
# True only in the ``groundkit`` console process (``main``), never where ``cli`` is called
# from someone else's code: the exit shortcut below changes the whole interpreter.
_own_process = False


def _skip_collecting_at_exit() -> None:
    """Let the interpreter's exit free the objects without first collecting their cycles
    (pydantic's, numpy's): about 10% of a one-answer command's cold start (adr/0059), for
    memory the operating system frees anyway. The commands close their files and connections
    themselves."""
    import atexit
    import gc

    atexit.register(gc.freeze)


def main() -> None:
    """The ``groundkit`` console script: a process of our own."""
    global _own_process
    _own_process = True
    cli(prog_name="groundkit")


def _fail(error: GroundkitError, code: int | None = None):
    click.echo(f"Error: {error}", err=True)
    sys.exit(code if code is not None else EXIT_USAGE if error.kind.startswith("invalid") else EXIT_ERROR)


def _explain(exc, model, names: dict[str, str]) -> str:
    """A pydantic validation error in the CLI's words: which option, and the rule."""
    messages = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        name = names.get(field, field)
        ctx = error.get("ctx") or {}
        kind = error["type"]
        if kind == "string_too_short":
            n = ctx.get("min_length", 1)
            messages.append(f"{name} must not be empty" if n == 1
                            else f"{name} must be at least {n} characters")
        elif kind == "string_too_long":
            messages.append(f"{name} must be at most {ctx.get('max_length')} characters")
        elif kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
            low = high = None
            for rule in model.model_fields[field].metadata:
                low = getattr(rule, "ge", low)
                high = getattr(rule, "le", high)
            messages.append(f"{name} must be between {low} and {high}")
        elif kind == "value_error":  # a validator's own words, which may start with the field
            from .retrieval.models import readable_message

            message = readable_message(error)
            messages.append(name + message[len(field):] if message.startswith(field + " ")
                            else f"{name} {message}")
        else:
            messages.append(f"{name} is not valid")
    return "; ".join(messages)


@click.group()
@click.version_option(package_name="groundkit-datasette")
@click.option("-v", "--verbose", count=True,
              help="More log output on stderr (and every skipped or failed file from ingest).")
@click.pass_context
def cli(ctx, verbose):
    """Ingest documents into collections and search and cite them."""
    ctx.ensure_object(dict)["verbose"] = verbose
    if _own_process and ctx.invoked_subcommand in ONE_ANSWER_COMMANDS:
        _skip_collecting_at_exit()
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
              help="Directory holding <name>.sqlite3 and <name>.lance (created private if missing).")
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
@click.option("--group-readable/--private", "group_readable", default=None,
              help="Let the files' group read the collection (files 0640, directories 0750), or "
                   "not (0600 / 0700). Default: private for a new collection; a re-ingest keeps "
                   "whether the group could read it.")
@click.option("--verbose", "-v", "list_all", is_flag=True,
              help="List every skipped and failed file with its reason.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--watch", is_flag=True,
              help="Keep running: re-ingest after every batch of changes to PATHS (one new "
                   "generation per batch, deleted files removed) until Ctrl-C or SIGTERM.")
@click.option("--debounce", default=300, show_default=True, type=click.IntRange(10, 60000),
              metavar="MS", help="With --watch: quiet time in milliseconds before a batch runs.")
@click.option("--cluster", metavar="ADDRESS",
              help="Extract, chunk and embed on this Dask scheduler's workers (tls://HOST:PORT, "
                   "with --cluster-tls-*); this machine still writes and publishes, and takes "
                   "only text, chunks and vectors back. Needs groundkit-datasette[cluster] "
                   "(docs/scaling.md).")
@click.option("--cluster-tls-ca", metavar="FILE", type=click.Path(dir_okay=False),
              help="With --cluster tls://: the CA certificate that signed the scheduler's and "
                   "workers' certificates.")
@click.option("--cluster-tls-cert", metavar="FILE", type=click.Path(dir_okay=False),
              help="With --cluster tls://: this machine's client certificate (signed by that CA).")
@click.option("--cluster-tls-key", metavar="FILE", type=click.Path(dir_okay=False),
              help="With --cluster tls://: the client certificate's private key (if not in the "
                   "certificate file).")
@click.option("--cluster-insecure", is_flag=True,
              help="Accept a tcp:// cluster address: no encryption and no authentication, so "
                   "anyone who can reach the scheduler can run code on the workers and feed this "
                   "ingest lies. Only on a network you trust.")
@click.option("--single-process", is_flag=True, hidden=True,
              help="Accepted and ignored: every ingest extracts and chunks in this process (adr/0055).")
@click.pass_context
def ingest(ctx, paths, collection, index_dir, base_dir, embedder, embedder_option, chunk_size,
           chunk_overlap, exclude, group_readable, list_all, as_json, watch, debounce, cluster,
           cluster_tls_ca, cluster_tls_cert, cluster_tls_key, cluster_insecure, single_process):
    """Ingest files and directories into a collection (incremental).

    Exits 0 when every file was ingested or skipped, 1 when some files failed (the rest are
    published), 3 when files failed and none was written, 2 on a usage error or a refusal
    (nothing is written). With --watch: one line (or JSON object) per batch, exit 0 when
    stopped by Ctrl-C or SIGTERM.
    """
    from .indexing.ingest import Indexer

    if chunk_size < 50:
        raise click.UsageError("--chunk-size must be at least 50 (characters)")
    if not 0 <= chunk_overlap < chunk_size // 2:
        raise click.UsageError(
            f"--chunk-overlap must be at least 0 and less than half of --chunk-size ({chunk_size})"
        )
    options = _key_values(embedder_option, "--embedder-option")
    stage = None
    try:
        tls_files = (cluster_tls_ca, cluster_tls_cert, cluster_tls_key)
        if (any(tls_files) or cluster_insecure) and not cluster:
            raise click.UsageError("--cluster-tls-* and --cluster-insecure need --cluster")
        if cluster:
            from .indexing.cluster import ClusterMap, tls_security

            security = None
            if any(tls_files):
                if not cluster.lower().startswith("tls://"):
                    raise click.UsageError("--cluster-tls-* need a tls:// --cluster address")
                if not (cluster_tls_ca and cluster_tls_cert):
                    raise click.UsageError("--cluster-tls-ca and --cluster-tls-cert go together")
                security = tls_security(*tls_files)
            stage = ClusterMap(cluster, security=security, insecure=cluster_insecure)
        indexer = Indexer(
            collection,
            index_dir=index_dir,
            base_dir=base_dir,
            embedder=embedder,
            embedder_options=options,
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            exclude=exclude,
            progress=None if watch else _Progress(),
            group_readable=group_readable,
            map_stage=stage,
        )
        if watch:
            _watch(indexer, paths, debounce, as_json)
            return
        report = indexer.ingest(paths)
    except GroundkitError as error:
        _fail(error, EXIT_USAGE)  # refused before publishing: nothing was written
    finally:
        if stage is not None:
            stage.close()
    path = Path(index_dir) / f"{indexer.name}.sqlite3"
    if as_json:
        summary = report.as_dict()
        summary["collection"] = indexer.name
        summary["path"] = str(path) if path.exists() else None
        click.echo(json.dumps(summary, indent=2))
    else:
        _print_ingest_summary(report, path, list_all or (ctx.obj or {}).get("verbose", 0) > 0)
    if report.failed:
        sys.exit(INGEST_ALL_FAILED if report.written == 0 else INGEST_SOME_FAILED)


def _watch(indexer, paths, debounce: int, as_json: bool) -> None:
    from .indexing.watch import BaseReplaced, watch

    def as_json_line(number, changes, report):
        click.echo(json.dumps({"batch": number, "changes": changes, **report.as_dict()}))

    try:
        watch(indexer, paths, debounce_ms=debounce, echo=click.echo,
              on_batch=as_json_line if as_json else None)
    except BaseReplaced as error:  # not a usage error: the watch ran, then had to stop
        _fail(error, EXIT_ERROR)


def _print_ingest_summary(report, path: Path, list_all: bool) -> None:
    skipped = sum(report.skipped.values())
    click.echo(
        f"{report.added} added, {report.updated} updated, {report.unchanged} unchanged, "
        f"{report.removed} removed, {skipped} skipped, {report.failed} failed"
    )
    named = [("failed", s, r) for s, r in report.failed_files]
    named += [("skipped", s, r) for s, r in report.skipped_files]
    shown = named if list_all else named[:SUMMARY_FILES]
    for kind, source, reason in shown:
        click.echo(f"  {kind}: {source} ({reason})")
    if len(shown) < len(named):
        click.echo(f"  ... and {len(named) - len(shown)} more; run with -v (or --json) to list "
                   "every file")
    if report.vectors_restored:
        click.echo(f"{report.vectors_restored} chunks had lost their vectors and were embedded again")
    if not report.published and report.generation == 0:
        click.echo("Nothing published: no document could be ingested.")
        return
    click.echo(
        f"{report.chunks_written} chunks written ({report.chunks_embedded} embedded) in "
        f"{report.seconds:.2f} s, {report.chunks_per_second:.0f} chunks/s; "
        f"generation {report.generation}" + ("" if report.published else " (nothing changed)")
    )
    click.echo(f"Collection: {path}")
    click.echo(f"Serve it with: groundkit serve {shlex.quote(str(path))}")


def _open(collection, index_dir, base_dir=None, reranker=None):
    from .retrieval.collection import Collection
    from .errors import NotACollection
    from .indexing.names import SQLITE_SUFFIX, resolve_collection_arg
    from .indexing.schema import is_collection_file

    directory, name = resolve_collection_arg(collection, index_dir)
    file = Path(directory) / f"{name}{SQLITE_SUFFIX}"
    if file.is_file() and not is_collection_file(file):
        # Found, but not ours: "not found" would send the user looking for the file.
        raise NotACollection(f"{file} is not a groundkit collection (no groundkit tables in it)")
    return Collection.open(name, index_dir=directory, base_dir=base_dir, reranker=reranker)


def _reranker_from_options(name, options):
    if not name:
        return None
    from .retrieval.rerankers import get_reranker

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
    try:
        with _open(collection, index_dir,
                   reranker=_reranker_from_options(reranker, reranker_option)) as col:
            # The fields, not a request: the search starts loading the query model before it
            # imports pydantic to validate them (adr/0041).
            response = col.search(query=query, mode=mode, top_k=top_k, rerank=rerank, source=source)
    except GroundkitError as error:
        _fail(error)
    except Exception as exc:
        from pydantic import ValidationError

        from .retrieval.models import SearchRequest

        if not (isinstance(exc, ValidationError) and exc.title == SearchRequest.__name__):
            raise
        raise click.UsageError(_explain(exc, SearchRequest, {
            "query": "QUERY", "top_k": "--top-k", "source": "--source", "mode": "--mode",
        })) from None
    if as_json:
        click.echo(response.model_dump_json(indent=2))
        return
    if response.note:  # no readable chunk holds a query word: say so before the hits
        click.echo(f"Note: {response.note}", err=True)
    click.echo(f"{len(response.hits)} hits ({response.mode}, generation {response.generation}, "
               f"{response.timings_ms.get('total_ms', 0):.1f} ms)")
    for hit in response.hits:
        click.echo(f"{hit.rank:>3}. {hit.score:.4f}  {_where(hit)}  [{hit.chunk_id}]")
        if hit.heading.strip():
            click.echo(f"     {hit.heading.strip()}")
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
    """Fetch a chunk and verify its citation against the current source.

    Exits 0 only when the citation is verified: 3 when it drifted, 4 when it cannot be
    checked (unresolvable), 1 when the collection or chunk is not found, 2 on a usage error.
    """
    from pydantic import ValidationError

    try:
        with _open(collection, index_dir, base_dir=base_dir) as col:
            response = col.fetch_chunk(chunk_id)
    except ValidationError:
        raise click.UsageError("CHUNK_ID must be c_ followed by 24 hex digits") from None
    except GroundkitError as error:
        _fail(error)
    c, v = response.chunk, response.verification
    if as_json:
        click.echo(response.model_dump_json(indent=2))
    else:
        heading = f" {c.heading.strip()}" if c.heading.strip() else ""
        click.echo(f"{_where(c)} [{c.start_offset}:{c.end_offset}]{heading}")
        click.echo(f"{v.status}: {v.reason}")
        if v.relocated is not None:
            r = v.relocated
            click.echo(f"now at lines {r.line_start}-{r.line_end} [{r.start_offset}:{r.end_offset}]")
        click.echo("")
        click.echo(c.content)
    sys.exit(FETCH_EXIT[v.status])


def _where(citation) -> str:
    """``source p. N`` for paged sources (PDF), else ``source:first-last`` lines."""
    if citation.page_start is not None:
        end = citation.page_end or citation.page_start
        pages = (f"p. {citation.page_start}" if end == citation.page_start
                 else f"pp. {citation.page_start}-{end}")
        return f"{citation.source} {pages}"
    return f"{citation.source}:{citation.line_start}-{citation.line_end}"


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
    for label, value in _status_lines(response):
        click.echo(f"{label:<12} {value}")


def _status_lines(s) -> list[tuple[str, str]]:
    lines = [
        ("collection", s.collection),
        ("generation", str(s.generation)),
        ("schema", str(s.schema_version)),
        ("documents", str(s.documents)),
        ("chunks", str(s.chunks)),
    ]
    if s.embedding is None:
        lines.append(("embedding", "none (BM25 only)"))
    else:
        e = s.embedding
        lines.append(("embedding", f"{e.provider} {e.model}, {e.dimensions} dimensions"))
        if s.vectors is not None:
            lines.append(("vectors", f"{s.vectors} of {s.chunks} chunks"))
    lines.append(("dense", "available" if s.dense_available
                  else f"unavailable: {s.dense_unavailable_reason or 'unknown reason'}"))
    if s.embedding is not None:
        lines.append(("ann index", s.ann_index or "none (exact search)"))
    if s.chunker:
        lines.append(("chunker", f"{s.chunker.get('chunk_size')} characters, "
                                 f"{s.chunker.get('chunk_overlap')} overlap"))
    lines.append(("bm25 terms", str(s.bm25_terms)))
    return lines


@cli.command()
@_index_dir_option
@click.option("--json", "as_json", is_flag=True)
def collections(index_dir, as_json):
    """List the collections in --index-dir."""
    from .retrieval.collection import list_collections

    if not Path(index_dir).is_dir():
        click.echo(f"Error: index directory not found: {index_dir}", err=True)
        sys.exit(EXIT_ERROR)
    response = list_collections(index_dir)
    if as_json:
        click.echo(response.model_dump_json(indent=2))
        return
    if not response.collections:
        click.echo(f"no collections in {index_dir}")
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
    from .surfaces.mcp_stdio import claim_stdout

    wire = claim_stdout()
    import asyncio
    from pathlib import Path

    from datasette.app import Datasette
    from datasette.utils import BadMetadataError, parse_metadata

    from .surfaces.mcp_stdio import run_stdio

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


@cli.command("serve")
@click.argument("targets", nargs=-1, metavar="[COLLECTION|INDEX_DIR]...")
@click.option("--index-dir", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Where COLLECTION names are looked up; served whole when no target is given.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on: loopback unless --config publishes (allow_remote_access).")
@click.option("--port", "-p", default=8001, show_default=True, type=click.IntRange(1, 65535))
@click.option("--open", "open_browser", is_flag=True, help="Open the search page in a browser.")
@click.option("--base-dir", type=click.Path(file_okay=False),
              help="Where fetch_chunk re-reads sources to verify citations.")
@click.option("--config", "-c", "config", type=click.File("r"),
              help="Datasette configuration (datasette.yaml, YAML or JSON): plugins.groundkit "
                   "settings, permissions; read on Datasette 0.65 and 1.0 alike.")
@click.option("--metadata", "-m", type=click.File("r"),
              help="Datasette metadata (YAML or JSON): titles and descriptions; on 0.65 also "
                   "permissions and plugins.groundkit settings, as before.")
def serve_command(targets, index_dir, host, port, open_browser, base_dir, config, metadata):
    """Browse and search collections in Datasette: loopback, read-only, the plugin loaded."""
    from .surfaces.serve import run

    run(targets, index_dir=index_dir, host=host, port=port, open_browser=open_browser,
        metadata_file=metadata, config_file=config, base_dir=base_dir)


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

    from .evaluation.evaluate import evaluate_many, format_summary, format_table

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
