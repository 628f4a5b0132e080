"""A tool's response as the JSON API sends it and as MCP hands it over: one place for both
surfaces, so they stay in parity.

``payload(response)`` is ``response.model_dump(mode="json")`` (MCP's structured result);
``body(response)`` is the same value as compact UTF-8 JSON text. It parses to exactly
``payload(response)`` (tests/test_response_serialize.py).

A search of a built-in mode reaches here as a ``PlainResponse`` (retrieval/search.py's
``search_plain``): its payload is the plain dicts the search built, and its body is that
payload written by orjson, with no pydantic model built or serialized (adr/0038). Any other
response is a model: its body is pydantic's compiled serializer (``model_dump_json``, one
call; adr/0036).
"""

from __future__ import annotations

import json

from pydantic_core import PydanticSerializationError

from ..retrieval.models import PlainResponse

_orjson_dumps = None


def payload(response) -> dict:
    """The JSON-ready value of a response."""
    if type(response) is PlainResponse:
        return response.payload
    return response.model_dump(mode="json")


def body(response) -> bytes:
    """The JSON text of a response, as bytes: the JSON API's body."""
    if type(response) is PlainResponse:
        try:
            return (_orjson_dumps or _load_orjson())(response.payload)
        except TypeError:  # a value orjson does not write (orjson.JSONEncodeError is one)
            response = response.model()
    try:
        return response.__pydantic_serializer__.to_json(response)
    except PydanticSerializationError:  # a value only Python's encoder can write
        return json.dumps(payload(response)).encode()


def dumps(value) -> bytes:
    """Compact UTF-8 JSON of plain values: orjson, or Python's encoder for a value orjson
    does not write (an integer past 64 bits)."""
    try:
        return (_orjson_dumps or _load_orjson())(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def model(response):
    """The response model (the HTML pages read models)."""
    return response.model() if type(response) is PlainResponse else response


def _load_orjson():
    # Imported on the first body written, not when the plugin loads (the cold start).
    global _orjson_dumps
    import orjson

    _orjson_dumps = orjson.dumps
    return _orjson_dumps
