"""A tool's response as the JSON API sends it and as MCP hands it over: one serializer for
both surfaces, so they stay in parity.

``payload(response)`` is exactly ``response.model_dump(mode="json")`` and ``body(response)``
exactly ``json.dumps(payload(response)).encode()`` (the text Datasette's ``Response.json``
wrote). For a search they are built without pydantic's serializer: each hit's citation
fields (the chunk's row, its content above all) are encoded once and kept
(:data:`FRAGMENTS_KEPT`), keyed by the values themselves, so a fragment can only ever stand
for the same values (adr/0036). tests/test_response_serialize.py checks both against
pydantic's output on real searches.
"""

from __future__ import annotations

import json
import math
import threading
from json.encoder import encode_basestring_ascii as _str
from operator import itemgetter

from ..retrieval.models import CITATION_FIELDS, SearchResponse

# Hits' citation fields kept encoded: about the size of the row (1-2 kB each).
FRAGMENTS_KEPT = 4096

_fragments: dict = {}
_lock = threading.Lock()
_citation = itemgetter(*CITATION_FIELDS)
_dumps = json.dumps


def payload(response) -> dict:
    """``response.model_dump(mode="json")``, a search's without pydantic's serializer."""
    if type(response) is not SearchResponse:
        return response.model_dump(mode="json")
    out = dict(response.__dict__)
    hits = []
    for hit in out["hits"]:
        d = dict(hit.__dict__)
        d["components"] = {k: dict(v.__dict__) for k, v in d["components"].items()}
        d["matched_terms"] = list(d["matched_terms"])
        hits.append(d)
    out["hits"] = hits
    groups = out["groups"]
    if groups is not None:
        out["groups"] = [dict(g.__dict__, chunk_ids=list(g.chunk_ids)) for g in groups]
    out["timings_ms"] = dict(out["timings_ms"])
    return out


def body(response) -> bytes:
    """``json.dumps(payload(response))`` as bytes: the JSON API's body."""
    if type(response) is not SearchResponse:
        return _dumps(response.model_dump(mode="json")).encode()
    d = response.__dict__
    head = dict(d)
    del head["hits"]  # the last field: spliced in below
    groups = head["groups"]
    if groups is not None:
        head["groups"] = [dict(g.__dict__, chunk_ids=list(g.chunk_ids)) for g in groups]
    parts = [_hit_json(h.__dict__) for h in d["hits"]]
    text = _dumps(head)
    return (text[:-1] + ', "hits": [' + ", ".join(parts) + "]}").encode()


def _hit_json(h: dict) -> str:
    key = _citation(h)
    fragment = _fragments.get(key)
    if fragment is None:
        fragment = _dumps(dict(zip(CITATION_FIELDS, key)))[:-1]
        with _lock:
            if len(_fragments) >= FRAGMENTS_KEPT:
                _fragments.clear()
            _fragments[key] = fragment
    components = h["components"]
    if components:
        comp = "{" + ", ".join(
            _str(name) + ": " + _component(c.__dict__) for name, c in components.items()) + "}"
    else:
        comp = "{}"
    changed = h["source_changed"]
    words = h["matched_terms"]
    return (f'{fragment}, "rank": {_num(h["rank"])}, "score": {_num(h["score"])}, '
            f'"components": {comp}, "source_changed": '
            f'{"null" if changed is None else "true" if changed else "false"}, '
            f'"matched_terms": [{", ".join(map(_str, words))}]}}')


def _component(c: dict) -> str:
    rank = c["rank"]
    return f'{{"rank": {"null" if rank is None else _num(rank)}, "score": {_num(c["score"])}}}'


def _num(value) -> str:
    """A number as ``json.dumps`` writes it (a non-finite float goes through it too)."""
    if type(value) is float and not math.isfinite(value):
        return _dumps(value)
    if type(value) is bool:
        return "true" if value else "false"
    return float.__repr__(value) if type(value) is float else int.__repr__(value)
