"""Which searches run on the event loop instead of a worker thread: a fixed rule on the
request and the published version, never on how earlier calls went (adr/0058, which
replaces adr/0044's moving average).

Handing a call to a thread and back wakes two threads; on the 2-CPU virtual machine this
project is measured on, that costs more than a short BM25 search of a small collection.
A search runs in place only when everything that bounds its cost is bounded
(:func:`search_key`): BM25 alone, a short query, a first page of few hits, no filters,
source checks that stay on a local file system, and a collection file of bounded size.
Anything else goes to a thread, every time.
"""

from __future__ import annotations

# What bounds the postings a search touches (its query's terms) and the hits it builds.
MAX_QUERY_CHARS = 64
MAX_HITS = 20
# What bounds the postings of one term: the published file's size. nfcorpus_approx (5,924
# chunks, 16 MB) searches in 0.2-0.6 ms; four times that still holds the loop a few ms.
MAX_FILE_BYTES = 64 * 1024 * 1024


def search_key(collection, request, sources_local: bool):
    """Not None when this search of this version runs on the event loop (the same answer
    for the same request and version, whatever ran before); None sends it to a thread."""
    mode = request.mode or ("bm25" if collection.embedding is None else None)
    if (mode != "bm25" or request.rerank or request.vector is not None or request.offset
            or request.top_k > MAX_HITS or request.source is not None or request.document_id is not None
            or request.group_by_document or len(request.query) > MAX_QUERY_CHARS or not sources_local
            or collection.identity.size > MAX_FILE_BYTES):
        return None
    return collection.path, collection.identity, request.top_k


class InlineCalls:
    """Runs a call :func:`search_key` placed on the event loop. No state: where a call runs
    is decided by its key alone."""

    async def run(self, key, fn):
        """``fn()`` here, on the event loop."""
        return fn()
