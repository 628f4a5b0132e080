"""Search modes: how one mode ranks a collection's chunks for a query.

BM25, dense and hybrid are registered through the ``register_search_modes`` hook
exactly as a plugin's mode would be (``hookspecs.py``). A mode returns ranked
``(chunk_id, score)`` pairs; everything around it (the reader's access lists and the
request's filters, reranking, ``top_k``, building hits) is the search's, so a mode
never has to apply permissions itself.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from ..hookspecs import hookimpl
from . import rankers

# Candidates taken from each list before reciprocal rank fusion.
HYBRID_DEPTH = 100
RRF_K = 60


@dataclass(frozen=True)
class SearchMode:
    """One way of ranking. ``needs_vectors``: it embeds the query (or takes the caller's
    ``vector``) and searches the collection's vectors, so it is offered only where this
    server can do that for the collection."""

    name: str
    description: str
    rank: Callable[["RankContext"], list[tuple[str, float]]]
    needs_vectors: bool = False


@dataclass
class RankContext:
    """What a mode may use: the open collection, the request, how many candidates to
    return, and the built-in rankers (already restricted to the chunks the search may
    return)."""

    collection: object
    request: object
    depth: int
    allowed: object = None
    components: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    complete: bool = True
    _vector: object = None

    def timed(self, label, fn, *args):
        started = time.perf_counter()
        out = fn(*args)
        self.timings[label] = round((time.perf_counter() - started) * 1000, 3)
        return out

    def record(self, component: str, ranked, *, with_rank: bool = True) -> None:
        """Show each candidate's place in a component list on its hit (``components``)."""
        # Every field of ComponentScore, in order (a search's payload holds them as is).
        components = self.components
        if not components and with_rank:  # the first list recorded: one dict per candidate
            components.update({cid: {component: {"rank": rank, "score": score}}
                               for rank, (cid, score) in enumerate(ranked, 1)})
            return
        for rank, (cid, score) in enumerate(ranked, 1):
            entry = {"rank": rank if with_rank else None, "score": score}
            components.setdefault(cid, {})[component] = entry

    def query_vector(self):
        if self._vector is None:
            self._vector = self.timed("embed_ms", rankers.query_vector, self.collection,
                                      self.request)
        return self._vector

    def bm25(self, depth: int):
        ranked = self.timed("bm25_ms", rankers.bm25_ranked, self.collection, self.request.query, depth,
                            self.allowed)
        self.record("bm25", ranked)
        return ranked

    def dense(self, depth: int):
        vector = self.query_vector()
        ranked = self.timed("dense_ms", rankers.dense_ranked, self.collection, vector, depth,
                            self.allowed)
        self.complete = self.complete and rankers.dense_complete(self.collection, ranked, depth,
                                                                 self.allowed)
        self.record("dense", ranked)
        return ranked


def fuse(*lists):
    """Reciprocal rank fusion; ties by chunk id, so the order is stable."""
    scores: dict[str, float] = {}
    for ranked in lists:
        for rank, (cid, _score) in enumerate(ranked, 1):
            scores[cid] = scores.get(cid, 0.0) + 1.0 / (RRF_K + rank)
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))


def _bm25(ctx: RankContext):
    return ctx.bm25(ctx.depth)


def _dense(ctx: RankContext):
    return ctx.dense(ctx.depth)


def _hybrid(ctx: RankContext):
    ctx.query_vector()  # embed first: a failing embedder fails before any ranking work
    depth = max(ctx.depth, HYBRID_DEPTH)
    return fuse(ctx.bm25(depth), ctx.dense(depth))[: ctx.depth]


BUILTIN_MODES = (
    SearchMode("bm25", "keyword ranking (BM25) over the chunks' words", _bm25),
    SearchMode("dense", "nearest chunks by embedding similarity", _dense, needs_vectors=True),
    SearchMode("hybrid", "BM25 and dense fused by reciprocal rank", _hybrid, needs_vectors=True),
)


@hookimpl
def register_search_modes(register):
    for mode in BUILTIN_MODES:
        register(mode)


def registered_modes() -> dict[str, SearchMode]:
    """Every registered mode by name: the built-ins first, then plugins' in load order."""
    from ..registry import _load_builtins, add_builtins, pm

    global _registered
    # Every search asks (twice): the answer is kept while the hook's implementations stay
    # the same ones (a plugin registered or removed since makes it ask them again).
    known = _registered
    if known is not None and known[0] == tuple(pm.hook.register_search_modes.get_hookimpls()):
        return dict(known[1])
    add_builtins(sys.modules[__name__])
    _load_builtins()
    impls = tuple(pm.hook.register_search_modes.get_hookimpls())
    found: dict[str, SearchMode] = {}

    def register(mode):
        if not isinstance(mode, SearchMode):
            raise TypeError("register_search_modes: register() takes a SearchMode")
        found.setdefault(mode.name, mode)

    for mode in BUILTIN_MODES:  # first, and a plugin cannot replace one
        register(mode)
    for impl in impls:  # in registration order
        if impl.function is not register_search_modes:
            impl.function(register=register)
    _registered = (impls, dict(found))
    return found


_registered = None


def mode_names() -> list[str]:
    return list(registered_modes())


def available_modes(collection, dense_reason: str | None) -> list[str]:
    """The modes this server can run on ``collection`` (``dense_reason``: why it cannot
    search vectors, or None)."""
    return [m.name for m in registered_modes().values() if not (m.needs_vectors and dense_reason)]
