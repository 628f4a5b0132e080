"""A third-party groundkit plugin used by the tests: adds one search mode.

It ranks every chunk whose document's title or source names a query word, and it
deliberately ignores access lists and filters: the search must apply them for it."""

import re

from groundkit_datasette.hookspecs import hookimpl
from groundkit_datasette.retrieval.modes import SearchMode


def rank_by_title(ctx):
    words = {w for w in re.findall(r"\w+", ctx.request.query.lower()) if len(w) > 2}
    rows = ctx.collection.query(
        "SELECT c.chunk_id, lower(coalesce(d.title, '') || ' ' || d.source) FROM chunks c "
        "JOIN documents d USING (document_id) ORDER BY c.chunk_id"
    )
    scored = [(cid, float(sum(w in text for w in words))) for cid, text in rows]
    ranked = sorted((p for p in scored if p[1] > 0), key=lambda p: (-p[1], p[0]))
    ctx.record("title", ranked)
    return ranked


MODE = SearchMode("title", "chunks of documents whose title or path names a query word",
                  rank_by_title)


@hookimpl
def register_search_modes(register):
    register(MODE)
