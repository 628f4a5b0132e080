"""Access logging: our one line per call, and no query text in the HTTP server's log."""

import logging
import sys


class RedactQueryStrings(logging.Filter):
    """Drops the query string of groundkit paths from uvicorn access-log records.

    The HTML search page carries the query in its URL (so it can be shared);
    access logs are kept longer and read more widely than the corpus warrants.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            path = args[2]
            if "/-/groundkit" in path and "?" in path:
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
