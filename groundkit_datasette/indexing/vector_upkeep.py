"""A run's vectors: the embedder bound to the collection (checked against what its vectors were
made with), the vector writer opened, and the chunks left without a vector embedded again."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ..errors import EmbedderError, InvalidRequest
from ..registry import DEFAULT_EMBEDDER
from .prepared import embedding_text
from .vectors import VectorWriter

log = logging.getLogger(__name__)

# The manifest key of the embedder's ``max_length`` (word pieces a text is cut to), for the
# embedders that have one: queries are embedded at the same length (retrieval/collection.py).
MAX_LENGTH_KEY = "embedding_max_length"
# The manifest key of how the embedder computed the vectors (MiniLM's ``compute``: "fp32" or
# "int8", adr/0040), for the embedders that have one: queries are embedded the same way. A
# collection without the record was embedded in fp32 (embedders.UNRECORDED_COMPUTE).
COMPUTE_KEY = "embedding_compute"


def embedding_max_length(embedder) -> int | None:
    """The embedder's ``max_length`` when it declares one as an integer, else None."""
    value = getattr(embedder, "max_length", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def embedding_compute(embedder) -> str | None:
    """The embedder's ``compute`` mode when it declares one as a string, else None."""
    value = getattr(embedder, "compute", None)
    return value if isinstance(value, str) else None


def _default_max_length(get_embedder, name: str) -> int | None:
    try:
        return embedding_max_length(get_embedder(name))
    except EmbedderError:  # an embedder that cannot be built without options: nothing to assume
        return None


@dataclass
class Binding:
    """The embedder a run uses: ``embedder`` None for a BM25-only run."""
    name: str
    embedder: object | None
    options: dict
    backfill: bool = False  # a BM25-only collection gains vectors for every chunk

    def manifest_entries(self) -> dict | None:
        if self.embedder is None:
            return None
        e = self.embedder
        values = {"embedder": self.name, "embedding_provider": e.provider,
                  "embedding_model": e.model_name, "embedding_dimensions": str(e.dimensions)}
        length = embedding_max_length(e)
        if length is not None:
            values[MAX_LENGTH_KEY] = str(length)
        compute = embedding_compute(e)
        if compute is not None:
            values[COMPUTE_KEY] = compute
        return values


def bind_embedder(conn, manifest: dict, collection: str, name: str | None, given: dict) -> Binding:
    """Pick the embedder and check it against the collection's manifest."""
    bound = manifest.get("embedder")
    if name is None:
        name = bound or DEFAULT_EMBEDDER
    has_docs = conn.execute("SELECT 1 FROM documents LIMIT 1").fetchone() is not None
    if name == "none":
        if bound and bound != "none":
            raise InvalidRequest(
                f"collection '{collection}' is bound to embedder {manifest.get('embedding_model')} "
                "and --embedder none would leave new chunks without vectors"
            )
        return Binding(name, None, dict(given))
    from ..embedding.embedders import (  # not for BM25-only runs
        UNRECORDED_COMPUTE, first_embedder, get_embedder)

    recorded = manifest.get(MAX_LENGTH_KEY) if bound == name else None
    recorded_compute = manifest.get(COMPUTE_KEY) if bound == name else None
    options = dict(given)
    if recorded and "max_length" not in options:
        # Embed at the length the collection's vectors were embedded at.
        options["max_length"] = int(recorded)
    # Computed the way they were (a collection from before the record: fp32), for the
    # embedders that have a compute mode; the others are tried without it.
    attempts = [options]
    if bound == name and "compute" not in options:
        attempts.insert(0, {**options, "compute": recorded_compute or UNRECORDED_COMPUTE})
    if options != given:
        attempts.append(dict(given))  # a factory without the option: checked below
    embedder, options = first_embedder(name, attempts)
    if not (bound and bound != "none"):
        return Binding(name, embedder, options, backfill=has_docs)
    want = (manifest.get("embedding_provider"), manifest.get("embedding_model"),
            str(manifest.get("embedding_dimensions")))
    got = (embedder.provider, embedder.model_name, str(embedder.dimensions))
    if want != got:
        raise EmbedderError(
            f"collection '{collection}' was built with {want[0]}/{want[1]} ({want[2]} dimensions); "
            f"refusing to add vectors from {got[0]}/{got[1]} ({got[2]} dimensions)"
        )
    got_length = embedding_max_length(embedder)
    if got_length is not None:
        # A collection from before the record was embedded at the embedder's default.
        want_length = int(recorded) if recorded else _default_max_length(get_embedder, name)
        if want_length is not None and want_length != got_length:
            raise EmbedderError(
                f"collection '{collection}' was embedded at max_length {want_length}; refusing "
                f"to add vectors embedded at {got_length} (give --embedder-option "
                f"max_length={want_length}, or ingest into a new collection)"
            )
    got_compute = embedding_compute(embedder)
    want_compute = recorded_compute or UNRECORDED_COMPUTE
    if got_compute is not None and got_compute != want_compute:
        raise EmbedderError(
            f"collection '{collection}' was embedded with compute {want_compute}; refusing "
            f"to add vectors computed with {got_compute} (give --embedder-option "
            f"compute={want_compute}, or ingest into a new collection)"
        )
    return Binding(name, embedder, options)


def open_vectors(lance_dir: Path, dimensions: int, manifest: dict, ann_threshold: int | None) -> VectorWriter:
    return VectorWriter(lance_dir, dimensions, manifest.get("lance_version"),
                        trained_rows=int(manifest.get("ann_trained_rows") or 0) or None,
                        **({"ann_threshold": ann_threshold} if ann_threshold is not None else {}))


def vectors_complete(conn, vectors: VectorWriter, manifest: dict, rechunk: bool) -> bool:
    """Every chunk has its vector at the published version when the table holds one row per
    chunk there (chunk ids are unique): then no search for missing vectors is needed."""
    return bool(
        vectors.table is not None and manifest.get("lance_version") and not rechunk
        and vectors.start_rows == conn.execute("SELECT count(*) FROM chunks").fetchone()[0])


def vectors_for(embedder, pending, ids, texts):
    """The vectors for ``ids``: as the map stage computed them, else from ``embedder`` now."""
    if pending and all(p.vectors is not None for p in pending):
        given = {cid: vec for p in pending for cid, vec in p.vectors.items()}
        return [given[cid] for cid in ids]
    return embedder.embed(texts) if texts else []


def restore_missing_vectors(conn, embedder, vectors: VectorWriter, report, collection: str,
                            batch_chunks: int) -> bool:
    """Embed every chunk that has no vector, so a publish never leaves chunks without one.

    Vectors go missing when ``<name>.lance`` is lost or incomplete; unchanged files are not
    re-embedded by the main pass, so without this a re-ingest would publish a vector table
    covering only the files that changed.
    """
    missing: dict[str, list[str]] = {}
    vectors.load_all()
    # The chunk ids alone come from their index, not from the rows (which hold the text).
    known = vectors.ids
    listed = conn.execute("SELECT group_concat(chunk_id, ' ') FROM chunks").fetchone()[0]
    if not known.issuperset((listed or "").split()):  # chunk ids hold no spaces
        for chunk_id, document_id in conn.execute("SELECT chunk_id, document_id FROM chunks"):
            if chunk_id not in known:
                missing.setdefault(document_id, []).append(chunk_id)
    total = sum(len(ids) for ids in missing.values())
    if not total:
        return False
    log.warning("%d chunks have no vector (the vector index was missing or incomplete); "
                "embedding them again", total)
    items = [(did, cid) for did, ids in missing.items() for cid in ids]
    for i in range(0, len(items), batch_chunks):
        batch = items[i : i + batch_chunks]
        texts = []
        for _did, cid in batch:
            heading, content = conn.execute(
                "SELECT heading, content FROM chunks WHERE chunk_id = ?", (cid,)
            ).fetchone()
            texts.append(embedding_text(heading, content))
        try:
            embedded = embedder.embed(texts)
        except Exception as exc:
            log.error("embedding missing vectors failed: %s", exc)
            raise EmbedderError(
                f"{total} chunks of collection '{collection}' have no vector (its vector index "
                "is missing or incomplete) and embedding them failed; nothing was published"
            ) from None
        by_document: dict[str, list] = {}
        for (did, cid), vec in zip(batch, embedded):
            by_document.setdefault(did, []).append((cid, vec))
        for did, rows in by_document.items():
            keep = vectors.by_document.get(did, set()) | {cid for cid, _ in rows}
            vectors.replace_document(did, rows, keep_ids=keep)
        report.chunks_embedded += len(batch)
        report.vectors_restored += len(batch)
    return True
