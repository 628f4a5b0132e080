"""``groundkit serve``: Datasette with the plugin, on loopback, every collection immutable.

The same Datasette a user would start by hand (``datasette -i x.sqlite3``), built
here so nobody needs its command line: the collections named (files, names or
index directories) are attached immutably, the plugin's start-up checks run
before the socket opens, and the URL is printed.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path

import click

from ..errors import GroundkitError
from ..indexing.names import NAME_PATTERN, SQLITE_SUFFIX, resolve_collection_arg

LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


def collection_files(targets, index_dir: str = ".") -> list[Path]:
    """The collection files ``targets`` name: directories give all their collections."""
    from ..retrieval.collection import list_collections
    from ..indexing.schema import is_collection_file

    files: list[Path] = []
    for target in targets or (index_dir,):
        path = Path(target)
        if path.is_dir():
            names = list_collections(path).collections
            if not names:
                raise click.UsageError(f"no groundkit collections in {target}")
            files += [path / f"{name}{SQLITE_SUFFIX}" for name in names]
            continue
        if not path.exists() and (os.sep in str(target) or "/" in str(target)
                                  or str(target).endswith(SQLITE_SUFFIX)
                                  or not NAME_PATTERN.fullmatch(str(target))):
            # A path, not a name: say it is missing rather than that the name is invalid.
            raise click.UsageError(f"{target}: no such file or directory")
        try:
            directory, name = resolve_collection_arg(str(target), Path(index_dir))
        except GroundkitError as exc:
            raise click.UsageError(f"{target}: {exc}") from None
        file = directory / f"{name}{SQLITE_SUFFIX}"
        if not file.is_file():
            raise click.UsageError(f"{target}: no such collection in {directory}")
        if not is_collection_file(file):
            raise click.UsageError(f"{target}: not a groundkit collection")
        files.append(file)
    seen: dict[str, Path] = {}
    for file in files:
        name = file.name[: -len(SQLITE_SUFFIX)]
        if name in seen and seen[name].resolve() != file.resolve():
            raise click.UsageError(f"two collections are named {name}; serve them separately")
        seen[name] = file
    return list(dict.fromkeys(seen.values()))


def is_loopback_host(host: str) -> bool:
    from ..security.boundary import loopback_ip

    return host.strip().lower() in ("localhost",) or loopback_ip(host.strip("[]"))


def serve_configuration(files: list[Path], metadata: dict, config: dict,
                        base_dir: str | None) -> tuple[dict, dict]:
    """(metadata, configuration) for Datasette: the caller's, with a title, a line per
    collection and the plugin settings. Plugin settings may come from either file (the
    configuration file's win); datasette_compat.datasette_options puts them where this
    Datasette line reads them."""
    metadata = dict(metadata or {})
    config = dict(config or {})
    names = [f.name[: -len(SQLITE_SUFFIX)] for f in files]
    metadata.setdefault("title", "groundkit: " + ", ".join(names))
    metadata.setdefault("description", "Search and cite your documents. Every collection is "
                                       "served read-only; re-ingest and reload to see new files.")
    databases = dict(metadata.get("databases") or {})
    for name in names:
        db = dict(databases.get(name) or {})
        db.setdefault("description", f"groundkit collection {name}: documents and chunks")
        databases[name] = db
    metadata["databases"] = databases
    plugins = {**(metadata.pop("plugins", None) or {}), **(config.get("plugins") or {})}
    settings = dict(plugins.get("groundkit") or {})
    if base_dir is not None:
        settings["base_dir"] = base_dir
    plugins["groundkit"] = settings
    config["plugins"] = plugins
    return metadata, config


def _read(file, option: str) -> dict:
    from datasette.utils import BadMetadataError, parse_metadata

    if file is None:
        return {}
    try:
        return dict(parse_metadata(file.read()) or {})
    except BadMetadataError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


def url_for(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}/-/groundkit"


def run(targets, *, index_dir=".", host="127.0.0.1", port=8001, open_browser=False,
        metadata_file=None, config_file=None, base_dir=None) -> None:
    from datasette.app import Datasette

    from .datasette_compat import datasette_options

    metadata = _read(metadata_file, "--metadata")
    config = _read(config_file, "--config")
    files = collection_files(targets, index_dir)
    metadata, config = serve_configuration(files, metadata, config, base_dir)
    if not is_loopback_host(host) and config["plugins"]["groundkit"].get(
            "allow_remote_access") is not True:
        raise click.UsageError(
            f"--host {host} is not a loopback address: to publish collections, set "
            "plugins.groundkit.allow_remote_access and authentication in --config or "
            "--metadata (see docs/deployment.md)"
        )
    ds = Datasette(files=[], immutables=[str(f) for f in files],
                   **datasette_options(metadata, config))
    # Start-up now, as `datasette serve` does: a bad setting stops here with one message.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(ds.invoke_startup())

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(ds.app(), host=host, port=port, log_level="info",
                                           lifespan="on", workers=1))
    # Bind and listen before saying where: a busy port is an error, not someone else's server.
    sock = listening_socket(host, port)
    url = url_for(host, port)
    names = ", ".join(f.name[: -len(SQLITE_SUFFIX)] for f in files)
    click.echo(f"Serving {names} at {url}  (Ctrl-C to stop)")
    sys.stdout.flush()
    if open_browser:
        threading.Thread(target=_open_when_up, args=(server, url), daemon=True).start()
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the
    # handler that was there before: make that an ordinary exit, status 0.
    import signal

    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()


class PortUnavailable(click.ClickException):
    """The address cannot be listened on: one ``Error:`` line, exit status 2 (a usage error:
    another --port or --host is the fix)."""

    exit_code = 2


def listening_socket(host: str, port: int):
    """A TCP socket bound to host:port and listening, as uvicorn would open it."""
    import errno
    import socket

    try:
        family = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0][0]
    except (socket.gaierror, UnicodeError):
        raise PortUnavailable(f"--host {host} is not an address this machine can listen on") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # As uvicorn does: reuse a port left in TIME_WAIT, never one a server listens on.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortUnavailable(f"port {port} on {host} is in use") from None
        if exc.errno == errno.EACCES:
            raise PortUnavailable(f"port {port} on {host} needs privileges this user lacks") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise PortUnavailable(f"--host {host} is not an address of this machine") from None
        raise PortUnavailable(f"cannot listen on port {port} on {host}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


def _open_when_up(server, url: str) -> None:
    import time
    import webbrowser

    while not server.started and not server.should_exit:
        time.sleep(0.1)
    if server.should_exit:
        return
    try:
        webbrowser.get()
    except webbrowser.Error:
        click.echo("No browser found here; open the URL above yourself.", err=True)
        return
    webbrowser.open(url)
