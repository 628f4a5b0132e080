"""The built-in rankers the search modes use (``modes.py``): BM25 over the stored postings,
dense over the LanceDB table, and the query vector. Each takes the ``Allowed`` set and
never returns a chunk outside it (filter before ranking).
"""

from __future__ import annotations

import threading

import numpy as np

from . import bm25
from ..errors import DenseUnavailable, EmbedderError, EmbedderMismatch, InvalidRequest

_embedders: dict[tuple, object] = {}  # (name, max_length, compute) -> embedder
_embedders_lock = threading.Lock()


def query_embedder(collection, *, probe: bool = True):
    """The embedder that turns queries into vectors for ``collection``; checked against its manifest.

    ``probe=False`` never calls out: an endpoint whose width is not configured yet is
    checked by provider and model only (its first reply checks the width).
    """
    manifest = collection.embedding
    embedder = collection.embedder
    length = collection.embedding_max_length  # queries are embedded at the documents' length
    compute = collection.embedding_compute  # and computed as they were (None: not recorded)
    if embedder is None:
        name = collection.manifest.get("embedder")
        with _embedders_lock:
            embedder = _embedders.get((name, length, compute))
            if embedder is None:
                from ..embedding.embedders import UNRECORDED_COMPUTE, first_embedder

                options = {"max_length": length} if length else {}
                # Computed as the documents were (not recorded: fp32) for embedders with a
                # compute mode; the others are built without it, then without any option
                # (the checks below decide).
                attempts = [{**options, "compute": compute or UNRECORDED_COMPUTE}, options]
                attempts += [{}] if options else []
                try:
                    embedder, _options = first_embedder(name, attempts)
                except EmbedderError:
                    raise DenseUnavailable(
                        f"this server has no embedder '{name}' for the collection's queries; "
                        "use mode bm25 or pass a query vector"
                    ) from None
                _embedders[(name, length, compute)] = embedder
    known = probe or getattr(embedder, "_dimensions", 0) is not None
    got = (embedder.provider, embedder.model_name,
           int(embedder.dimensions) if known else manifest.dimensions)
    want = (manifest.provider, manifest.model, manifest.dimensions)
    if got != want:
        raise EmbedderMismatch(
            f"the server's embedder {got[0]}/{got[1]} ({got[2]} dimensions) does not match the "
            f"collection's {want[0]}/{want[1]} ({want[2]} dimensions)"
        )
    got_length = getattr(embedder, "max_length", None)
    if length is not None and isinstance(got_length, int) and got_length != length:
        raise EmbedderMismatch(
            f"the server's embedder embeds queries at max_length {got_length}; the collection's "
            f"documents were embedded at max_length {length}"
        )
    got_compute = getattr(embedder, "compute", None)
    if isinstance(got_compute, str):
        from ..embedding.embedders import UNRECORDED_COMPUTE

        want_compute = compute or UNRECORDED_COMPUTE
        if got_compute != want_compute:
            raise EmbedderMismatch(
                f"the server's embedder computes query vectors with {got_compute}; the collection's "
                f"documents were embedded with compute {want_compute}"
            )
    return embedder


def dense_unavailable_reason(collection) -> str | None:
    """Why this server cannot run dense queries on ``collection``, or None when it can:
    the collection has vectors, and an embedder here matches its manifest and is installed."""
    if collection.embedding is None:
        return "the collection was built without embeddings"
    try:
        embedder = query_embedder(collection, probe=False)
        check = getattr(embedder, "check_available", None)
        if check is not None:
            check()
    except (DenseUnavailable, EmbedderError) as exc:
        return str(exc)
    return None


# Up to this depth the BM25 ranker reads the hits' whole rows with its one lookup by row id
# (``RankedHits.rows``), so the search builds its hits without a second query. Deeper lists
# (hybrid's candidates, eval) read only the chunk ids.
PREFETCH_DEPTH = 64


class RankedHits(list):
    """A ranking ``[(chunk_id, score)]`` with the hit rows read along with it (``rows``, by
    chunk id: ``collection.HitRow``)."""

    rows: dict = {}


def bm25_ranked(collection, query, depth, allowed):
    """Top ``depth`` as ``[(chunk_id, score)]``; ties broken by chunk content hash."""
    found = bm25_top_rows(collection, query, depth, allowed)
    if found is None:
        return _bm25_ranked_by_hash(collection, query, depth, allowed)
    rows_ids, score_list = found
    if not rows_ids:
        return []
    if depth <= PREFETCH_DEPTH:
        rows = collection.hit_rows("id", rows_ids)  # in rank order
        chunk_ids = [r.chunk_id for r in rows]
        if len(rows) == len(rows_ids):
            out = RankedHits(zip(chunk_ids, score_list))
        else:  # a row missing: never shift the ranking or serve a half-consistent hit
            from ..errors import IndexInconsistent

            raise IndexInconsistent(
                "the collection's postings and chunks disagree; re-run groundkit ingest")
        out.rows = dict(zip(chunk_ids, rows))
        return out
    marks = ",".join("?" * len(rows_ids))
    chunk_ids = dict(
        collection.query(f"SELECT id, chunk_id FROM chunks WHERE id IN ({marks})", rows_ids)
    )
    return [(chunk_ids[i], s) for i, s in zip(rows_ids, score_list)]


def bm25_top_rows(collection, query, depth, allowed):
    """Top ``depth`` as ``([chunk row id], [score])`` in rank order, or None for a collection
    written before the tie order was stored (see :func:`bm25_ranked`)."""
    ranks = collection.tie_ranks()
    if ranks is None:
        return None
    view = collection.bm25_view(allowed.view if allowed is not None else None)
    if allowed is None or (view is not None and allowed.only_permissions):
        # Nothing outside the postings ranked (the stored ones, or the reader's view):
        # only the chunks that can reach the top ``depth`` are scored.
        return collection.bm25_top(query, depth, view)
    ids, scores = _bm25_scores(collection, query, allowed, view)
    if ids.size:
        keep = allowed.mask(ids)  # before truncation: hidden chunks never take a top-k slot
        ids, scores = ids[keep], scores[keep]
    return bm25.in_rank_order(ids, scores, depth, ranks)


def _bm25_scores(collection, query, allowed, view):
    """Every matching chunk's score, on the reader's view when it has one."""
    if view is not None:
        return collection.bm25_scores(query, view)
    return collection.bm25_scores(query, hidden=allowed.hidden if allowed is not None else None)


def _bm25_ranked_by_hash(collection, query, depth, allowed):
    """Collections written before the tie order was stored: ties by the hashes looked up."""
    ids, scores = _bm25_scores(collection, query, allowed,
                               collection.bm25_view(allowed.view if allowed is not None else None))
    if allowed is not None and ids.size:
        keep = allowed.mask(ids)  # before truncation: hidden chunks never take a top-k slot
        ids, scores = ids[keep], scores[keep]
    if not ids.size:
        return []
    if ids.size > depth:
        kth = np.partition(scores, ids.size - depth)[ids.size - depth]
        sel = scores >= kth
        ids, scores = ids[sel], scores[sel]
    marks = ",".join("?" * ids.size)
    meta = dict(
        (r[0], (r[1], r[2]))
        for r in collection.query(
            f"SELECT id, chunk_id, content_hash FROM chunks WHERE id IN ({marks})",
            [int(i) for i in ids],
        )
    )
    ranked = sorted(
        ((float(s), meta[int(i)][1], meta[int(i)][0]) for i, s in zip(ids, scores)),
        key=lambda t: (-t[0], t[1]),
    )
    return [(chunk_id, score) for score, _h, chunk_id in ranked[:depth]]


def dense_ranked(collection, vector, depth, allowed):
    """Top ``depth`` by cosine similarity among the allowed chunks (a prefilter, never a
    cut after ranking): exact in numpy for small tables, LanceDB's ANN index above
    (indexing/vectors.py ``VectorSearch``)."""
    search = collection.vector_search()
    if search is None:
        raise DenseUnavailable("the collection has no vectors; use mode bm25")
    if allowed is None:
        return search.search(vector, depth)
    return search.search(vector, depth, allowed.documents, exclude=allowed.exclude)


def dense_complete(collection, ranked, depth, allowed) -> bool:
    """Whether a dense list short of ``depth`` holds every allowed chunk.

    A flat prefiltered search always does; an ANN index probing too few
    partitions for a selective filter may not, and then the answer is False.
    """
    if len(ranked) >= depth:
        return True
    total = collection.query("SELECT count(*) FROM chunks")[0][0]
    readable = allowed.count(total) if allowed is not None else total
    return len(ranked) >= readable


def query_vector(collection, request):
    manifest = collection.embedding
    if manifest is None:
        raise DenseUnavailable("the collection was built without embeddings; use mode bm25")
    if request.vector is not None:
        if len(request.vector) != manifest.dimensions:
            raise InvalidRequest(
                f"vector has {len(request.vector)} dimensions; the collection's embeddings have "
                f"{manifest.dimensions}"
            )
        vec = np.asarray(request.vector, dtype=np.float32)
        norm = float(np.linalg.norm(vec))
        if norm == 0.0:
            raise InvalidRequest("vector must not be all zeros")
        return vec / norm
    # A fresh process reads the vectors in the background while the model embeds the query.
    collection.prefetch(embedder=False)
    return query_embedder(collection).embed_query(request.query)
