"""Keep query text out of the HTTP server's access log."""

import logging


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
