"""One search over one open collection: the reader's permissions and the request's filters
decided before anything is ranked, the registered search mode (``modes.py``), the optional
rerank, and the hits."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..errors import DenseUnavailable, InvalidRequest, RerankNotConfigured, RerankerError
from .models import (
    CITATION_FIELDS, MAX_OFFSET, MAX_TOP_K, PlainResponse, SearchRequest, SearchResponse,
)
from . import rankers
from .rows import CITATION_COLUMNS
from .modes import BUILTIN_MODES, HYBRID_DEPTH, RRF_K, RankContext, registered_modes
from .rankers import dense_unavailable_reason, query_embedder  # noqa: F401  (part of the API)

_GLOB_CHARS = set("*?[")
_BUILTIN_BY_NAME = {m.name: m for m in BUILTIN_MODES}


def filter_sql(request: SearchRequest):
    clauses, params = [], []
    if request.source:
        if _GLOB_CHARS & set(request.source):
            clauses.append("d.source GLOB ?")
            params.append(request.source)
        else:
            clauses.append("substr(d.source, 1, ?) = ?")
            params += [len(request.source), request.source]
    if request.document_id:
        clauses.append("d.document_id = ?")
        params.append(request.document_id)
    return clauses, params


@dataclass(frozen=True)
class Allowed:
    """The chunks a search may return, decided before anything is scored or truncated.

    ``exclude`` flips the polarity: the rows and documents listed are the ones
    *not* allowed (permissions alone usually hide few documents, so listing
    those is the smaller set).
    """

    rows: np.ndarray  # sorted chunk row ids
    documents: list[str]
    exclude: bool = False
    # Sorted row ids hidden by the reader's permissions (not by the request's filters).
    hidden: np.ndarray | None = None
    # The reader's BM25 view (views.ReaderView): its chunks weighted with their own statistics.
    view: object = None

    @property
    def only_permissions(self) -> bool:
        """Whether the reader's permissions are all that is left out (no request filter)."""
        return self.exclude and self.hidden is not None and self.rows is self.hidden

    def mask(self, ids: np.ndarray) -> np.ndarray:
        return np.isin(ids, self.rows, invert=self.exclude)

    def lance_where(self) -> str | None:
        if not self.documents:
            return None if self.exclude else "false"
        quoted = ",".join("'" + d.replace("'", "''") + "'" for d in self.documents)
        return f"document_id {'NOT IN' if self.exclude else 'IN'} ({quoted})"

    def count(self, total: int) -> int:
        return total - int(self.rows.size) if self.exclude else int(self.rows.size)


def _allowed(collection, request, access=None) -> Allowed | None:
    """The chunks passing the request's filters and the reader's permissions; None: all of them."""
    clauses, params = filter_sql(request)
    if access is not None and not access.hidden_documents:
        access = None
    if not clauses and access is None:
        return None
    hidden_rows = view = None
    if access is not None:
        hidden_documents = list(access.hidden_documents)
        # Kept per open collection and set of hidden documents, with the hidden chunk rows.
        view = collection.reader_view(access.hidden_documents)
        hidden_rows = view.hidden_rows
    if not clauses:
        return Allowed(hidden_rows, hidden_documents, exclude=True, hidden=hidden_rows, view=view)
    if access is not None:
        clauses.append(access.sql)
        params += list(access.params)
    rows = collection.query(
        "SELECT c.id, c.document_id FROM chunks c JOIN documents d USING (document_id) WHERE "
        + " AND ".join(clauses),
        params,
    )
    ids = np.sort(np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)))
    return Allowed(ids, sorted({r[1] for r in rows}), hidden=hidden_rows, view=view)


if CITATION_COLUMNS != CITATION_FIELDS:  # a hit row's first columns are a citation's fields
    raise ImportError("rows.HitRow and models.Citation disagree")


def _hits(collection, ranked, components, first_rank: int = 1, rows: dict | None = None):
    """Plain dicts, one per ranked chunk, with the keys in ``Hit``'s field order (what
    ``build_response`` builds the models from), and the chunks' row ids (for
    ``matched_terms``). ``rows``: hit rows the ranker already read (``rankers.RankedHits``),
    by chunk id; only the others are looked up."""
    if not ranked:
        return [], []
    found = [rows.get(cid) for cid, _ in ranked] if rows else [None] * len(ranked)
    if None in found:
        missing = [cid for (cid, _), r in zip(ranked, found) if r is None]
        looked_up = {r.chunk_id: r for r in collection.hit_rows("chunk_id", missing)}
        found = [r or looked_up.get(cid) for (cid, _), r in zip(ranked, found)]
        if None in found:  # a vector without its chunk row: never serve a half-consistent hit
            from ..errors import IndexInconsistent

            raise IndexInconsistent(
                "the collection's vectors and chunks disagree; re-run groundkit ingest"
            )
    return (_hit_dicts(collection, ranked, found, components, first_rank),
            [r.row_id for r in found])


def _hit_dicts(collection, ranked, found, components, first_rank: int) -> list[dict]:
    """The hits of ``ranked`` (``[(chunk id, score)]``) from their rows ``found``, in order.
    ``components``: each chunk's component entries."""
    changed = collection.sources_changed(found)
    parts = components.get
    hits = []
    append = hits.append
    rank = first_rank
    for (cid, score), citation, stale in zip(ranked, collection.citations(found), changed):
        # The citation's copy, then the rest of Hit's fields in order (one call: a third
        # cheaper than a copy and five stores). matched_terms is set by _add_matches.
        append(dict(citation, rank=rank, score=score,
                    components=parts(cid) or {},
                    source_changed=stale, matched_terms=[]))
        rank += 1
    return hits


def run_search(collection, request: SearchRequest, access=None) -> SearchResponse:
    """``access`` (acl.Access) restricts the search to one reader's documents.

    The mode (modes.py) only ranks; the reader's permissions and the request's filters are
    applied here, before ranking for the built-in rankers and again to whatever a mode
    returns, so no mode can hand out a chunk the reader may not see.
    """
    fields, trusted = _search(collection, request, access)
    return build_response(fields, trusted=trusted)


def search_plain(collection, request: SearchRequest, access=None) -> PlainResponse:
    """:func:`run_search` as the JSON API and MCP take it: the response's plain values
    (``model_dump(mode="json")`` of the model :func:`run_search` returns), the model built
    only if a caller asks (``.model()``, the HTML page). A plugin's mode is validated into
    the model first and its payload dumped from it."""
    return plain_response(*_search(collection, request, access))


def plain_response(fields: dict, trusted: bool) -> PlainResponse:
    """:func:`build_response`'s twin for the surfaces: ``fields`` as they are when a
    built-in mode ranked them (every field, in order, already JSON values), else the
    validated model's dump."""
    if not trusted:
        model = SearchResponse(**fields)
        return PlainResponse(model.model_dump(mode="json"), model=model)
    return PlainResponse(fields, build=_model_of_payload)


def _search(collection, request: SearchRequest, access):
    """The response's fields (hits and groups as plain dicts, in the models' field order)
    and whether a built-in mode ranked them (then they are already what the JSON holds)."""
    started = time.perf_counter()
    name = request.mode or ("hybrid" if collection.embedding is not None else "bm25")
    # A built-in mode is always registered under its name (no plugin replaces one).
    mode = _BUILTIN_BY_NAME.get(name) or registered_modes()[name]
    if not mode.needs_vectors and request.vector is not None:  # no mode given, BM25-only collection
        raise DenseUnavailable("the collection was built without embeddings; a query vector "
                               "cannot be used")
    if request.rerank and collection.reranker is None:
        raise RerankNotConfigured("reranking was requested but no reranker is configured")
    depth = _ranking_depth(request, name)
    allowed = _allowed(collection, request, access)
    ctx = RankContext(collection, request, depth, allowed)
    if mode.needs_vectors and request.vector is None:
        collection.prefetch()  # a fresh process loads the query model while BM25 ranks
    ranked = mode.rank(ctx)
    builtin = _BUILTIN_BY_NAME.get(name) is mode  # not ``in``: that compares dataclasses
    # Hit rows a built-in ranker read along with its ranking (one lookup by row id).
    prefetched = getattr(ranked, "rows", None) if builtin else None
    if not builtin:  # the built-in rankers filter before ranking
        ranked = _only_allowed(collection, ranked, ctx.allowed)
    ranked = ranked[:depth]
    if request.min_score is not None:
        ranked = _above_floor(name, ranked, ctx.components, request.min_score)

    rerank_model = rerank_depth = None
    if request.rerank:
        ranked, rerank_model, rerank_depth = ctx.timed(
            "rerank_ms", _rerank, collection, request.query, ranked, ctx.components
        )
    window = request.offset + request.top_k
    more = len(ranked) > window and window <= MAX_OFFSET
    top_score = ranked[0][1] if ranked else None
    ranked = ranked[request.offset : window]
    hits, row_ids = _hits(collection, ranked, ctx.components, request.offset + 1, prefetched)
    lexical = _add_matches(collection, request.query, hits, row_ids, ctx.allowed)
    timings = ctx.timings
    return _fields(collection, name, request, window if more else None, top_score, hits,
                   rerank_model, rerank_depth, ctx.complete, lexical, timings, started), builtin


def _fields(collection, name, request, next_offset, top_score, hits, rerank_model, rerank_depth,
            complete, lexical, timings, started) -> dict:
    """Every field of SearchResponse, in its order (the payload is these values as they are)."""
    groups = _groups(hits) if request.group_by_document else None
    timings["total_ms"] = round((time.perf_counter() - started) * 1000, 3)
    return {
        "collection": collection.name,
        "mode": name,
        "generation": collection.generation,
        "top_k": request.top_k,
        "offset": request.offset,
        "next_offset": next_offset,
        "top_score": top_score,
        "groups": groups,
        "reranked": request.rerank,
        "rerank_model": rerank_model,
        "rerank_depth": rerank_depth,
        "complete": complete,
        "lexical_match": lexical,
        "note": None if lexical else NO_LEXICAL_MATCH,
        "timings_ms": timings,
        "hits": hits,
    }


def build_response(fields: dict, *, trusted: bool) -> SearchResponse:
    """The response model from ``fields`` (hits and groups as plain dicts), validated by
    pydantic whatever ``trusted`` says (a built-in mode's own rows and floats, or a plugin's):
    pydantic-core validates a page in one call (23 us on cisi) where ``model_construct``
    builds its 21 models in 68 us; writing pydantic's slots took 9 us (adr/0054)."""
    return SearchResponse(**fields)


def _model_of_payload(payload: dict) -> SearchResponse:
    """The model of a built-in mode's payload, leaving the payload as it is."""
    return SearchResponse(**payload)


def _ranking_depth(request: SearchRequest, mode_name: str) -> int:
    """How deep to rank so that the page (and whether another follows) is a cut of one ordering.

    BM25 and exact dense rankings are prefixes of each other at any depth, so one more than
    the page's end is enough. Hybrid fuses two lists of HYBRID_DEPTH and a reranked page
    comes from the reranked MAX_TOP_K: ranking deeper would change their order, so pages
    stop there instead.
    """
    window = request.offset + request.top_k
    if request.rerank:
        if window > MAX_TOP_K:
            raise InvalidRequest(f"offset: reranked pages end at hit {MAX_TOP_K} (offset + top_k)")
        return MAX_TOP_K
    if mode_name == "hybrid":
        if window > HYBRID_DEPTH:
            raise InvalidRequest(f"offset: hybrid pages end at hit {HYBRID_DEPTH} (offset + top_k)")
        if request.min_score is not None:  # the floor may drop any of them: fuse them all
            return HYBRID_DEPTH
        return min(window + 1, HYBRID_DEPTH)
    return window + 1


def _groups(hits: list[dict]) -> list[dict]:
    """The page's hits by document, documents in the order of their best hit."""
    groups: dict[str, dict] = {}
    for hit in hits:
        group = groups.get(hit["document_id"])
        if group is None:
            group = groups[hit["document_id"]] = dict(
                document_id=hit["document_id"], source=hit["source"], title=hit["title"],
                best_rank=hit["rank"], chunk_ids=[])
        group["chunk_ids"].append(hit["chunk_id"])
    return list(groups.values())


def _only_allowed(collection, ranked, allowed):
    """``ranked`` without chunks outside ``allowed`` (built-in rankers never return any; a
    plugin's mode is held to the same rule here). Unknown chunk ids are dropped too."""
    if not ranked:
        return []
    ids = [cid for cid, _ in ranked]
    marks = ",".join("?" * len(ids))
    rows = dict(collection.query(f"SELECT chunk_id, id FROM chunks WHERE chunk_id IN ({marks})", ids))
    if allowed is None:
        return [(cid, s) for cid, s in ranked if cid in rows]
    known = [(cid, s) for cid, s in ranked if cid in rows]
    keep = allowed.mask(np.asarray([rows[cid] for cid, _ in known], dtype=np.int64))
    return [pair for pair, ok in zip(known, keep) if ok]


def _rerank(collection, query, ranked, components):
    reranker = collection.reranker
    if not ranked:
        return [], reranker.model_name, 0
    ids = [cid for cid, _ in ranked]
    marks = ",".join("?" * len(ids))
    rows = dict(
        (r[0], (r[1], r[2]))
        for r in collection.query(
            f"SELECT chunk_id, content, content_hash FROM chunks WHERE chunk_id IN ({marks})", ids
        )
    )
    texts = [rows[cid][0] for cid in ids]
    try:
        scores = reranker.score(query, texts)
    except RerankerError:
        raise
    except Exception:
        raise RerankerError("the reranker failed") from None
    if len(scores) != len(ids):
        raise RerankerError("the reranker returned the wrong number of scores")
    order = sorted(range(len(ids)), key=lambda i: (-float(scores[i]), rows[ids[i]][1]))
    out = []
    for i in order:
        # Every field of ComponentScore, as the payload holds it (a reranker has no rank).
        components.setdefault(ids[i], {})["rerank"] = {"rank": None, "score": float(scores[i])}
        out.append((ids[i], float(scores[i])))
    return out, reranker.model_name, len(ids)


# -- how well the hits match (matched_terms, lexical_match, min_score) ---------------

NO_LEXICAL_MATCH = ("No chunk you can read contains any of the query's words: these hits are only "
                    "semantically near the query and may not be about it.")


def _above_floor(mode_name: str, ranked, components, floor: float):
    """``ranked`` without the hits under ``min_score`` (its meaning per mode in docs/api.md).

    Hybrid's fused score is a rank statistic with no scale a caller could choose a floor on,
    so there the floor is the dense cosine's, and a hit BM25 ranked passes it."""
    if mode_name != "hybrid":
        return [(cid, s) for cid, s in ranked if s >= floor]
    out = []
    for cid, s in ranked:
        parts = components.get(cid, {})
        dense = parts.get("dense")
        if "bm25" in parts or (dense is not None and dense["score"] >= floor):
            out.append((cid, s))
    return out


def _add_matches(collection, query: str, hits: list[dict], row_ids: list[int], allowed) -> bool:
    """Set each hit's ``matched_terms``; return whether any chunk the search may return
    contains a query word (``lexical_match``), looked up only when no hit does."""
    if hits:
        matched = collection.matched_terms(query, row_ids)
        for hit, words in zip(hits, matched):
            hit["matched_terms"] = words
        if any(matched):
            return True
    rows = collection.term_rows(query)
    if allowed is None:
        return any(r.size for r in rows)
    return any(r.size and allowed.mask(r.astype(np.int64)).any() for r in rows)
