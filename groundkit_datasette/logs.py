"""Access logging: our one line per call, and no query text in the HTTP server's log."""

import contextvars
import inspect
import logging
import re
import sys
import types

# (method, route label) of the HTTP request being answered, set by the instance boundary;
# stdio MCP calls keep the default.
REQUEST_LINE: contextvars.ContextVar[tuple[str, str]] = contextvars.ContextVar(
    "groundkit_request_line", default=("-", "-")
)

_WORD = re.compile(r"[a-z][a-z0-9_-]{0,39}(\.[a-z]{1,5})?")
_FORMAT = re.compile(r"\.(jsono?|csv|db|html)$")
_PLACEHOLDERS = ("<database>", "<table>", "<row>")


def route_label(path: str) -> str:
    """The route's shape for a log line: literal words after ``/-/``, placeholders for
    database, table, row and id segments (they are the caller's input)."""
    out, literal = [], 0
    position = 0
    for segment in path.split("?", 1)[0].split("/")[1:]:
        if segment == "-":
            out.append("-")
            literal = 2
            continue
        if literal and _WORD.fullmatch(segment):
            out.append(segment)
            literal -= 1
            continue
        literal = 0
        if not segment:
            out.append("")
            continue
        fmt = _FORMAT.search(segment)
        name = _PLACEHOLDERS[position] if position < len(_PLACEHOLDERS) else "<id>"
        if out and out[-1] not in _PLACEHOLDERS and "-" in out:
            name = "<id>"
        position += 1
        out.append(name + (fmt.group(0) if fmt else ""))
    return "/" + "/".join(out)


class RedactQueryStrings(logging.Filter):
    """Drops the query string of every path from uvicorn access-log records.

    The HTML search page and Datasette's ``?_search=`` and ``?sql=`` carry query text
    in the URL (so it can be shared); access logs are kept longer and read more widely
    than the corpus warrants.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            path = args[2]
            if "?" in path:
                record.args = args[:2] + (path.split("?", 1)[0] + "?[redacted]",) + args[3:]
        return True


def install_access_log_filter() -> None:
    logger = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactQueryStrings) for f in logger.filters):
        logger.addFilter(RedactQueryStrings())


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (it may be replaced after start-up)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def install_call_log() -> None:
    """Print ``groundkit.access`` lines to stderr with a plain handler of their own.

    Without one, the INFO lines reach only the root logger. That shows nothing by
    default (Python's last-resort handler starts at WARNING). When the MCP SDK
    installs its ``rich`` root handler, each line costs about 2 ms per call. A
    logger that already has handlers is left as its owner configured it.
    """
    logger = logging.getLogger("groundkit.access")
    if logger.handlers:
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s groundkit %(message)s"))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    logger.propagate = False


# True while the MCP SDK answers one of our stateless HTTP requests (surfaces/mcp_server.py).
IN_STATELESS_MCP: contextvars.ContextVar[bool] = contextvars.ContextVar("groundkit_stateless_mcp", default=False)


class QuietStatelessTransport(logging.Filter):
    """Drops the SDK's INFO lines about the throwaway transport of one of our stateless calls.

    Each call ends with ``Terminating session: None``; with the ``rich`` root handler the
    SDK's FastMCP installs (datasette-mcp builds one), rendering it costs 1.5-2 ms a call.
    Our access line already records the call. Warnings and errors pass, and so does every
    line of another server built on the same SDK (the flag is set only around ours)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or not IN_STATELESS_MCP.get()


def install_stateless_mcp_filter() -> None:
    logger = logging.getLogger("mcp.server.streamable_http")
    if not any(isinstance(f, QuietStatelessTransport) for f in logger.filters):
        logger.addFilter(QuietStatelessTransport())


def withhold_sql_error() -> None:
    """Say on stderr that a Datasette query on a collection failed, where Datasette would print
    its SQL, parameters and SQLite's message (``CollectionVersion.execute`` asks it not to).
    The parameters are the caller's ``?_search=`` or ``?sql=`` input and the message often
    quotes it (``fts5: syntax error near "..."``); the caller still gets the error in the
    response."""
    sys.stderr.write("ERROR: a Datasette SQL query failed (SQL, parameters and message withheld)\n")
    sys.stderr.flush()


def _stand_in_frame():
    return inspect.currentframe()  # traceback withheld by groundkit: frames' locals are not printed


def withhold_exception_locals(exception: BaseException) -> None:
    """Keep an exception Datasette is about to handle from printing its frames' locals.

    Datasette's default handler prints each exception it handles (every 404 and 400
    included) with rich's ``show_locals=True`` when rich is installed: the request's scope,
    headers with a bearer token, and the caller's query text would go to stdout. Called by
    the plugin's ``handle_exception`` hook, whose body runs before any handler's response is
    made: an internal error's traceback is logged here first (frames and lines, no locals),
    then the exception and those it was raised from get a stand-in traceback of one frame
    without locals. (Python 3.11+ reads the handled exception's traceback from the exception.)
    """
    if exception.__traceback__ is None:
        return
    status = getattr(exception, "status", 500)
    if not isinstance(status, int) or status >= 500:
        logging.getLogger("groundkit").error(
            "a Datasette request failed",
            exc_info=(type(exception), exception, exception.__traceback__))
    frame = _stand_in_frame()
    stand_in = types.TracebackType(None, frame, frame.f_lasti, frame.f_lineno)
    pending, seen = [exception], set()
    while pending:
        exc = pending.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if exc.__traceback__ is not None:
            exc.__traceback__ = stand_in
        pending += [exc.__cause__, exc.__context__]
