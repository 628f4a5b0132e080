"""The docs cannot drift from the code: every `groundkit ...` command shown in the README, the docs
and the Makefile names a subcommand the live CLI has, with options its `--help` lists, choice
values it accepts and a plausible number of arguments; every subcommand is documented; the error
table and the manifest table match what the code produces.

Nothing here lists commands or options: they come from the docs and from `groundkit --help`."""

import functools
import json
import logging
import math
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", "SECURITY.md", "Makefile", "benchmarks/README.md"] + sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")
)
SHELL_BLOCKS = {"sh", "shell", "bash", "console", "zsh"}
# Commands a branch not yet merged adds: absent from this CLI, the docs that show them xfail
# (visibly, never as passed); once the command exists it is checked like any other.
PENDING: dict[str, str] = {}  # subcommand -> why a documented line may wait for it
ELLIPSIS = {"...", "…"}
WRAPPERS = {"sudo", "env", "time", "exec", "nohup"}


# ---------------------------------------------------------------- the live CLI


@dataclass
class Option:
    takes_value: bool
    choices: tuple[str, ...] = ()


@dataclass
class Help:
    options: dict[str, Option]
    commands: set[str]
    min_args: int
    max_args: float


def _run_cli(*words: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", "from groundkit_datasette.cli import cli; cli(prog_name='groundkit')", *words],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "120"}, timeout=120,
    )
    assert done.returncode == 0, (words, done.stderr)
    return done.stdout


@functools.cache
def help_of(*words: str) -> Help:
    """What ``groundkit WORDS --help`` prints: its options, subcommands and argument count."""
    text = _run_cli(*words, "--help")
    usage = re.search(r"^Usage: \S+(?: \S+)*? \[OPTIONS\](.*)$", text, re.M)
    assert usage, text
    low = high = 0
    for arg in usage.group(1).split():
        optional, many = arg.startswith("["), arg.endswith("...")
        low += 0 if optional else 1
        high = math.inf if many else high + 1
    options, commands, section = {}, set(), None
    for line in text.splitlines():
        if re.match(r"^\S.*:$", line):
            section = line[:-1]
            continue
        if not line.startswith("  ") or line.startswith("   "):
            continue  # a description or a continuation line
        first = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        if section == "Commands":
            commands.add(first)
        elif section == "Options":
            parts = re.split(r",\s+|\s+/\s+", first)
            metavars = [p.split(None, 1)[1] for p in parts if " " in p]
            choice = re.fullmatch(r"\[([^\]]+)\]", metavars[0]) if metavars else None
            opt = Option(bool(metavars), tuple(choice.group(1).split("|")) if choice else ())
            for part in parts:
                options[part.split()[0]] = opt
    return Help(options, commands, low, high)


# ---------------------------------------------------------------- the docs


def command_lines(relative: str, text: str):
    """(line number, shell text) for each place a file shows a command."""
    if relative == "Makefile":
        for n, line in enumerate(text.splitlines(), 1):
            if line.startswith("\t"):
                yield n, line.strip()
        return
    fence, info, block, start = None, "", [], 0
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        opening = re.match(r"(`{3,}|~{3,})\s*([\w+-]*)", stripped)
        if fence is None and opening:
            fence, info, block, start = opening.group(1), opening.group(2).lower(), [], n + 1
            continue
        if fence is not None:
            if stripped.startswith(fence) and stripped.strip("`~") == "":
                yield from _block_lines(info, block, start)
                fence = None
            else:
                block.append(line)
            continue
        for span in re.findall(r"`([^`]+)`", line):
            if re.match(r"(\$ )?groundkit\s", span):
                yield n, span


_CLIENT_CONFIG = re.compile(r'"command"\s*:\s*"([^"]*)"\s*,\s*"args"\s*:\s*(\[[^\]]*\])')


def _block_lines(info: str, lines: list[str], start: int):
    if info in {"json", "jsonc"}:
        # MCP client configurations: {"command": ".../groundkit", "args": [...]}.
        text = "\n".join(lines)
        for match in _CLIENT_CONFIG.finditer(text):
            n = start + text[: match.start()].count("\n")
            yield n, shlex.join([match.group(1), *json.loads(match.group(2))])
        return
    joined, first = "", start
    for offset, line in enumerate(lines):
        if not joined:
            first = start + offset
        if line.rstrip().endswith("\\"):
            joined += line.rstrip()[:-1] + " "
            continue
        joined += line
        text = joined.strip()
        joined = ""
        if text.startswith("$ "):
            text = text[2:]
        # Untyped blocks hold output, JSON and config too: only lines that start with a command.
        if info in SHELL_BLOCKS or (info == "" and re.match(r"groundkit\s", text)):
            yield first, text


def invocations(text: str) -> list[list[str]]:
    """The argument lists after each `groundkit` in one shell line."""
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError:
        return []
    segments, current = [], []
    for token in tokens:
        if token in {"&&", "||", "|", ";"}:
            segments.append(current)
            current = []
        elif token.endswith(";") and len(token) > 1:
            current.append(token[:-1])
            segments.append(current)
            current = []
        else:
            current.append(token)
    segments.append(current)
    found = []
    for seg in segments:
        # The command word of each segment, after VAR=value assignments and wrappers such as sudo:
        # "groundkit" elsewhere is an argument (a group name, a path).
        i = 0
        while i < len(seg) and (re.fullmatch(r"[A-Za-z_]\w*=.*", seg[i]) or seg[i] in WRAPPERS):
            i += 1
            while i < len(seg) and seg[i - 1] in WRAPPERS and seg[i].startswith("-"):
                i += 1
        if i < len(seg) and seg[i].rsplit("/", 1)[-1] == "groundkit":
            # Optional parts written as [--flag VALUE] are checked like the rest.
            found.append([t.strip("[]") for t in seg[i + 1 :] if t.strip("[]")])
    return found


def problems_of(args: list[str]) -> tuple[list[str], list[str]]:
    """(problems, pending commands) for one `groundkit ARGS` invocation."""
    group = help_of()
    i = 0
    problems = []
    while i < len(args) and args[i].startswith("-"):
        name = args[i].partition("=")[0]
        if name not in group.options:
            return [f"groundkit has no option {name}"], []
        i += 2 if group.options[name].takes_value and "=" not in args[i] else 1
    if i >= len(args):
        return [], []
    sub = args[i]
    if sub in ELLIPSIS:
        return [], []  # "`groundkit ...`": any command
    if sub not in group.commands:
        if sub in PENDING:
            return [], [sub]
        return [f"groundkit has no subcommand {sub!r}"], []
    h = help_of(sub)
    if len(args) == i + 1:
        return [], []  # a mention such as "`groundkit ingest` turns files into...": the name is enough
    positionals, open_ended = [], False
    j = i + 1
    while j < len(args):
        arg = args[j]
        if arg in ELLIPSIS:
            open_ended = True
        elif arg.startswith("-") and len(arg) > 1 and not re.fullmatch(r"-[\d.]+", arg):
            name, eq, value = arg.partition("=")
            opt = h.options.get(name)
            if opt is None:
                problems.append(f"groundkit {sub} has no option {name}")
            elif opt.takes_value and not eq:
                j += 1
                value = args[j] if j < len(args) else None
                if value is None:
                    problems.append(f"groundkit {sub} {name} needs a value")
            if opt is not None and opt.choices and value is not None and not _placeholder(value):
                if value not in opt.choices:
                    problems.append(f"groundkit {sub} {name} does not accept {value!r}")
        else:
            positionals.append(arg)
        j += 1
    n = len(positionals)
    if n > h.max_args or (n < h.min_args and not open_ended):
        problems.append(f"groundkit {sub} takes {h.min_args} to {h.max_args} arguments, the docs give {n}")
    return problems, []


def _placeholder(value: str) -> bool:
    return value in ELLIPSIS or bool(re.fullmatch(r"[A-Z][A-Z_]*|<[^>]+>", value))


def documented():
    for relative in DOCS:
        path = ROOT / relative
        if path.exists():
            text = path.read_text(encoding="utf-8")
            for n, line in command_lines(relative, text):
                for args in invocations(line):
                    yield relative, n, args


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("relative", [d for d in DOCS if (ROOT / d).exists()])
def test_documented_commands_exist_with_their_options(relative):
    """A renamed option, a removed command or a wrong choice value in the docs fails here."""
    problems, pending = [], set()
    for where, n, args in documented():
        if where != relative:
            continue
        found, waiting = problems_of(args)
        problems += [f"{where}:{n}: {p}: groundkit {' '.join(args)}" for p in found]
        pending.update(waiting)
    assert problems == []
    if pending:
        pytest.xfail("; ".join(PENDING[p] for p in sorted(pending)))


def test_every_subcommand_is_documented():
    """A command nobody can find in the README or docs is a command nobody uses."""
    shown = {args[0] for _where, _n, args in documented() if args and not args[0].startswith("-")}
    assert help_of().commands - shown == set()


def test_the_docs_check_sees_what_it_must_refuse():
    """The checker itself: real README commands are found, and made-up ones are refused."""
    found = [args for where, _n, args in documented() if where == "README.md"]
    assert ["collections", "--index-dir", "."] in found
    assert any(args[:1] == ["ingest"] and "--collection" in args for args in found)
    for bad in (
        "groundkit search groundkit.sqlite3 q --top-n 3",  # no such option
        "groundkit search groundkit.sqlite3 q --mode semantic",  # not a choice
        "groundkit frobnicate --index-dir .",  # no such command
        "groundkit fetch-chunk groundkit.sqlite3",  # an argument short
        "groundkit status a b",  # one too many
        "sudo -E env GK=1 groundkit serch x",  # after wrappers too
    ):
        (args,) = invocations(bad)
        assert problems_of(args)[0], bad
    text = "```sh\ngroundkit ingest docs \\\n  --collection x --chunk-size 10 && groundkit status x  # note\n```\n"
    assert invocations("sudo install -d -g groundkit /srv/groundkit/index") == []  # an argument, not the command
    lines = list(command_lines("x.md", text))
    assert [a for _n, line in lines for a in invocations(line)] == [
        ["ingest", "docs", "--collection", "x", "--chunk-size", "10"], ["status", "x"],
    ]


def _error_table() -> dict[int, set[str]]:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    section = text.split("## Errors", 1)[1].split("\n## ", 1)[0]
    table = {}
    for status, kinds in re.findall(r"^\| (\d{3}) \| ([^|]+) \|", section, re.M):
        table[int(status)] = set(re.findall(r"`([a-z_]+)`", kinds))
    return table


def test_the_error_table_lists_every_error_a_call_can_return():
    """Each error type in the hierarchy, mapped the way the API maps it, is in docs/api.md's table
    under its status."""
    from groundkit_datasette import errors
    from groundkit_datasette.surfaces.service import map_exception

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    table = _error_table()
    missing = []
    for cls in {errors.GroundkitError, *subclasses(errors.GroundkitError)}:
        info = map_exception(cls("x"))
        if info.kind not in table.get(info.status, set()):
            missing.append((cls.__name__, info.status, info.kind))
    assert sorted(missing) == []


def test_the_manifest_table_names_every_key_a_collection_has(tmp_path):
    """docs/collection-format.md's manifest table and a real collection with vectors agree."""
    import sqlite3

    from groundkit_datasette.indexing.ingest import ingest

    from .conftest import write_corpus

    ingest([write_corpus(tmp_path / "c")], collection="m", index_dir=tmp_path / "i")
    with sqlite3.connect(f"file:{tmp_path / 'i' / 'm.sqlite3'}?mode=ro&immutable=1", uri=True) as db:
        keys = {k for (k,) in db.execute("SELECT key FROM groundkit_manifest")}
    text = (ROOT / "docs" / "collection-format.md").read_text(encoding="utf-8")
    table = text.split("`groundkit_manifest`", 1)[1].split("\n## ", 1)[0]
    documented_keys = set()
    for row in re.findall(r"^\| ([^|]+) \|", table, re.M):
        documented_keys.update(re.findall(r"`([a-z0-9_]+)`", row))
    assert keys - documented_keys == set()
    assert documented_keys - keys == set()


async def test_query_text_is_never_logged(tmp_path, caplog, capfd):
    """docs/api.md says query text is never logged, at any level: a search at DEBUG proves it."""
    from datasette.app import Datasette

    from groundkit_datasette.indexing.ingest import ingest

    from .conftest import write_corpus

    corpus = write_corpus(tmp_path / "c")
    ingest([corpus], collection="energy", index_dir=tmp_path / "i", embedder="none")
    ds = Datasette(files=[], immutables=[str(tmp_path / "i" / "energy.sqlite3")],
                   metadata={"plugins": {"groundkit": {"base_dir": str(corpus)}}})
    secret = "photovoltaic zqxjsecretword"
    records = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    access = logging.getLogger("groundkit.access")  # has its own handler and does not propagate
    access.addHandler(handler)
    try:
        with caplog.at_level(logging.DEBUG), caplog.at_level(logging.DEBUG, logger="groundkit.access"):
            ok = await ds.client.post("/energy/-/groundkit/search.json", content=json.dumps({"query": secret}),
                                      headers={"content-type": "application/json"})
            bad = await ds.client.post("/energy/-/groundkit/search.json",
                                       content=json.dumps({"query": secret, "top_k": 0}),
                                       headers={"content-type": "application/json"})
    finally:
        access.removeHandler(handler)
    assert ok.status_code == 200 and ok.json()["hits"] and bad.status_code == 422
    assert len(records) == 2  # the call log did run, once per call
    logged = "\n".join(r.getMessage() + str(r.args) for r in [*records, *caplog.records])
    assert "zqxjsecretword" not in logged + capfd.readouterr().err


def test_every_readme_image_exists_and_was_taken_by_the_screenshot_test():
    """The README shows only screenshots that test_readme_screenshots took (each carries its
    mark), every one it takes, and its first link is the search page, not a raw table."""
    from .browser_support import README_SHOTS, SCREENSHOT_MARK, png_text

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", readme)
    assert images, "the README shows no screenshots"
    for image in images:
        path = ROOT / image
        assert path.is_file(), image
        assert png_text(path.read_bytes()).get("Software") == SCREENSHOT_MARK, (
            f"{image} was not written by the screenshot test: run it with "
            "GROUNDKIT_README_SCREENSHOTS=1")
    assert sorted(images) == sorted(f"docs/screenshots/{n}.png" for n in README_SHOTS)
    first = re.search(r"<(http://127\.0\.0\.1:8001/[^>]*)>", readme).group(1)
    assert first.endswith("/-/groundkit/search"), first
