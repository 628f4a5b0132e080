"""One reading of untrusted JSON text, for every surface that parses a caller's bytes.

``loads`` refuses what would break a reader further on: invalid UTF-8, lone
surrogates (``"\\ud800"`` decodes to a string that cannot be encoded again) and
more than ``MAX_DEPTH`` levels of nesting (deeper text would otherwise end in a
``RecursionError`` somewhere downstream). ``NaN`` and ``Infinity`` parse as
Python's json reads them, so the request models' own rule (finite numbers)
answers them, as on the JSON API. Messages are fixed text: nothing of the input
is repeated.
"""

from __future__ import annotations

import json
import re

MAX_DEPTH = 64

_SURROGATE = re.compile("[\ud800-\udfff]")


class NotJSON(ValueError):
    """The bytes are not one well-formed JSON text (fixed message).

    ``value`` is what was parsed when the text parsed but carries a lone surrogate, else None.
    """

    def __init__(self, message: str, value=None):
        super().__init__(message)
        self.value = value


class TooDeep(ValueError):
    """Well-formed, but nested deeper than ``MAX_DEPTH`` (fixed message); ``value`` as for NotJSON."""

    def __init__(self, message: str, value=None):
        super().__init__(message)
        self.value = value


def loads(raw: bytes | str, *, max_depth: int = MAX_DEPTH):
    """Parse ``raw`` or raise :class:`NotJSON` / :class:`TooDeep`."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
        if text.startswith("\ufeff"):
            raise ValueError("byte order mark")
        value = json.loads(text)
    except RecursionError:
        raise TooDeep(f"JSON nested more than {max_depth} levels deep") from None
    except (ValueError, UnicodeDecodeError):
        raise NotJSON("not valid UTF-8 JSON text") from None
    # Iterative, so checking depth cannot itself run out of stack.
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise NotJSON("not valid UTF-8 JSON text", value)
        elif isinstance(item, (dict, list)):
            if depth > max_depth:
                raise TooDeep(f"JSON nested more than {max_depth} levels deep", value)
            if isinstance(item, dict):
                stack.extend((k, depth) for k in item)
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)
    return value
