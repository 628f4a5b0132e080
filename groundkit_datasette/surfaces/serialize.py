"""A tool's response as the JSON API sends it and as MCP hands it over: one place for both
surfaces, so they stay in parity.

``payload(response)`` is ``response.model_dump(mode="json")`` (MCP's structured result);
``body(response)`` is the same value as JSON text, written by pydantic's compiled
serializer in one call (``model_dump_json``): compact, UTF-8. It parses to exactly
``payload(response)`` (tests/test_response_serialize.py). Before, the JSON API built the
dict and ran ``json.dumps`` over it: three times the cost of a search's body (adr/0036,
which also has the per-hit fragments measured and rejected).
"""

from __future__ import annotations

import json

from pydantic_core import PydanticSerializationError


def payload(response) -> dict:
    """The JSON-ready value of a response model."""
    return response.model_dump(mode="json")


def body(response) -> bytes:
    """The JSON text of a response model, as bytes: the JSON API's body."""
    try:
        return response.__pydantic_serializer__.to_json(response)
    except PydanticSerializationError:  # a value only Python's encoder can write
        return json.dumps(payload(response)).encode()
