"""Evaluate retrieval on a judged, BEIR-layout data set (``groundkit eval``).

The corpus goes through the normal ingest path (one source file per corpus
document), so an eval collection is a real collection whose citations
``fetch_chunk`` can verify. Every judged query is answered by the public
``Collection.search`` (timed: that is the latency a user sees) and, for the
metrics, by the same retrieval functions at depth 100: the public API caps
``top_k`` at 50, and Recall@100 needs a deeper list. The depth-100 list is
checked against the public top 10 and disagreements are counted.
"""

from __future__ import annotations

import datetime
import gzip
import hashlib
import html
import json
import math
import re
import sqlite3
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from ..errors import InvalidRequest
from ..retrieval.models import MAX_QUERY_CHARS, SearchRequest
from ..indexing.names import NAME_PATTERN

MODES = ("bm25", "dense", "hybrid")
DEFAULT_DEPTH = 100
RUNS_DB = "groundkit-eval.sqlite3"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


# -- the data set ------------------------------------------------------------


@dataclass
class Dataset:
    name: str
    path: Path
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    corpus_file: Path

    def corpus(self) -> Iterator[dict]:
        opener = gzip.open if self.corpus_file.suffix == ".gz" else open
        with opener(self.corpus_file, "rt", encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except ValueError:
                    raise InvalidRequest(f"corpus line {line_no} is not JSON") from None
                if "_id" not in doc:
                    raise InvalidRequest(f"corpus line {line_no} has no _id")
                yield doc

    @property
    def judged_queries(self) -> list[str]:
        """Queries with text and at least one relevant document, in a stable order."""
        ids = [q for q, rels in self.qrels.items() if q in self.queries and any(r > 0 for r in rels.values())]
        return sorted(ids, key=_natural_key)


def _natural_key(value: str):
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", value)]


def load_dataset(path: str | Path) -> Dataset:
    """Read ``corpus.jsonl[.gz]``, ``queries.jsonl`` and ``qrels/test.tsv`` (with header)."""
    root = Path(path)
    corpus = next((root / n for n in ("corpus.jsonl", "corpus.jsonl.gz") if (root / n).is_file()), None)
    if corpus is None:
        raise InvalidRequest("data set has no corpus.jsonl or corpus.jsonl.gz")
    queries_file, qrels_file = root / "queries.jsonl", root / "qrels" / "test.tsv"
    if not queries_file.is_file() or not qrels_file.is_file():
        raise InvalidRequest("data set needs queries.jsonl and qrels/test.tsv")
    queries = {}
    with open(queries_file, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                q = json.loads(line)
                queries[str(q["_id"])] = q.get("text") or ""
    qrels: dict[str, dict[str, int]] = {}
    with open(qrels_file, encoding="utf-8") as f:
        for n, line in enumerate(f):
            parts = line.rstrip("\n").split("\t")
            if n == 0 and not parts[-1].lstrip("-").isdigit():
                continue  # the header line
            if len(parts) < 3:
                continue
            qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    return Dataset(root.resolve().name, root, queries, qrels, corpus)


def safe_file_name(doc_id: str, suffix: str = ".txt") -> str:
    """A portable file name for a corpus id; altered ids get a hash suffix so they stay unique."""
    safe = _SAFE.sub("_", doc_id)[:100].lstrip(".") or "doc"
    if safe != doc_id:
        safe += "-" + hashlib.sha256(doc_id.encode("utf-8")).hexdigest()[:10]
    return safe + suffix


# How ``write_sources`` writes a corpus document: "markdown" (the default, what ``groundkit
# eval`` measures) or "html" (a ``<title>`` and a body without headings: benchmarks/quality.py
# measures the contextual header on it, adr/0035-contextual-title-header.md).
SOURCE_FORMATS = ("markdown", "html")


def document_file(doc: dict, source_format: str = "markdown") -> tuple[str, str]:
    """``(file name, text)`` of a corpus document.

    A titled document is written as Markdown with its title as the level-1 heading, so
    ingest knows it as the title: every chunk carries its heading path (here, the title)
    into BM25 and the embedder, as for any titled Markdown file. Untitled documents are
    plain text. See adr/0018-bm25-over-chunks.md. ``source_format="html"`` writes a titled
    document as an HTML page instead: the title in ``<title>`` only, the text in one ``<p>``.
    """
    title = " ".join((doc.get("title") or "").split())
    text = doc.get("text") or ""
    if title and source_format == "html":
        page = (f"<!doctype html>\n<html><head><title>{html.escape(title)}</title></head>\n"
                f"<body><p>{html.escape(text)}</p></body></html>\n")
        return safe_file_name(str(doc["_id"]), ".html"), page
    if title:
        return safe_file_name(str(doc["_id"]), ".md"), f"# {title}\n\n{text}"
    return safe_file_name(str(doc["_id"])), text


def document_text(doc: dict) -> str:
    """The text the corpus gives for a document: its title (if any), a blank line, its text."""
    title = (doc.get("title") or "").strip()
    text = doc.get("text") or ""
    return f"{title}\n\n{text}" if title else text


@dataclass
class SourceSync:
    written: int = 0
    unchanged: int = 0
    removed: int = 0
    id_of_source: dict[str, str] = field(default_factory=dict)


def write_sources(corpus: Iterable[dict], directory: Path, source_format: str = "markdown") -> SourceSync:
    """One file per document (:func:`document_file`); identical files are left alone so
    ingest sees no change."""
    if source_format not in SOURCE_FORMATS:
        raise InvalidRequest(f"unknown source format {source_format!r}; use {', '.join(SOURCE_FORMATS)}")
    directory.mkdir(parents=True, exist_ok=True)
    sync = SourceSync()
    seen: set[str] = set()
    for doc in corpus:
        doc_id = str(doc["_id"])
        name, text = document_file(doc, source_format)
        if name in sync.id_of_source or doc_id in seen:
            raise InvalidRequest(f"corpus document id {doc_id!r} appears twice")
        seen.add(doc_id)
        sync.id_of_source[name] = doc_id
        data = text.encode("utf-8")
        target = directory / name
        try:
            if target.read_bytes() == data:
                sync.unchanged += 1
                continue
        except FileNotFoundError:
            pass
        target.write_bytes(data)
        sync.written += 1
    # Files this command wrote for documents no longer in the corpus.
    for stale in [*directory.glob("*.txt"), *directory.glob("*.md"), *directory.glob("*.html")]:
        if stale.name not in sync.id_of_source:
            stale.unlink()
            sync.removed += 1
    return sync


# -- metrics -------------------------------------------------------------------


def ndcg_at(ranking: list[str], qrels: dict[str, int], k: int = 10) -> float:
    """Graded nDCG as trec_eval's ndcg_cut: gain = grade, discount log2(rank + 1)."""
    dcg = sum(qrels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranking[:k]) if qrels.get(d, 0) > 0)
    ideal = sorted((g for g in qrels.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at(ranking: list[str], qrels: dict[str, int], k: int) -> float:
    relevant = {d for d, g in qrels.items() if g > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranking[:k])) / len(relevant)


def mrr_at(ranking: list[str], qrels: dict[str, int], k: int = 10) -> float:
    for i, d in enumerate(ranking[:k]):
        if qrels.get(d, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def query_metrics(ranking: list[str], qrels: dict[str, int]) -> dict[str, float]:
    return {
        "ndcg_at_10": ndcg_at(ranking, qrels, 10),
        "recall_at_10": recall_at(ranking, qrels, 10),
        "recall_at_100": recall_at(ranking, qrels, 100),
        "mrr_at_10": mrr_at(ranking, qrels, 10),
    }


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def documents_from_chunks(ranked_chunks: list[tuple[str, float]], doc_of_chunk: dict[str, str]) -> list[str]:
    """Chunk ranking -> document ranking: a document ranks where its best chunk does."""
    seen, out = set(), []
    for chunk_id, _score in ranked_chunks:
        doc = doc_of_chunk.get(chunk_id)
        if doc is not None and doc not in seen:
            seen.add(doc)
            out.append(doc)
    return out


# -- running -------------------------------------------------------------------


def _ranked_chunks(collection, query: str, mode: str, depth: int, vector=None):
    """``[(chunk_id, score)]`` down to ``depth``, built as ``run_search`` builds it.

    Uses the search module's internals because the public request refuses
    ``top_k`` above 50. BM25 and dense over-fetch chunks (several chunks can
    share a document) so the document list still reaches ``depth``.
    """
    from ..retrieval import rankers
    from ..retrieval.modes import HYBRID_DEPTH, fuse

    chunk_depth = depth * 3
    if mode == "bm25":
        return rankers.bm25_ranked(collection, query, chunk_depth, None)
    if mode == "dense":
        return rankers.dense_ranked(collection, vector, chunk_depth, None)
    # Hybrid keeps the product's candidate depth per list, so its fusion is the product's.
    per_list = max(depth, HYBRID_DEPTH)
    return fuse(
        rankers.bm25_ranked(collection, query, per_list, None),
        rankers.dense_ranked(collection, vector, per_list, None),
    )


@dataclass
class ModeResult:
    mode: str
    rerank: bool
    queries: int
    ndcg_at_10: float
    recall_at_10: float
    recall_at_100: float
    mrr_at_10: float
    latency_p50_ms: float
    latency_p95_ms: float
    top10_mismatches: int
    per_query: list[dict] = field(default_factory=list, repr=False)

    def summary(self) -> dict:
        out = asdict(self)
        out.pop("per_query")
        return out


@dataclass
class EvalReport:
    dataset: str
    dataset_dir: str
    collection: str
    index_dir: str
    generation: int
    documents: int
    chunks: int
    reused: bool
    ingest_seconds: float
    embedder: str
    depth: int
    started_at: str
    results: list[ModeResult]
    failures: dict[str, str] = field(default_factory=dict)
    run_ids: list[int] = field(default_factory=list)
    # What the figures depend on: the collection's chunker and BM25 record, embedder, depth.
    settings: dict = field(default_factory=dict)
    # Shared by every data set of one ``groundkit eval`` command.
    batch: str | None = None

    def as_dict(self, per_query: bool = False) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "results"}
        out["results"] = [r.summary() | ({"per_query": r.per_query} if per_query else {}) for r in self.results]
        return out


def default_collection_name(dataset: Dataset) -> str:
    name = _SAFE.sub("_", dataset.name).replace(".", "_")[:64].lstrip("_-") or "eval"
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidRequest("cannot derive a collection name from the data set directory; pass --collection")
    return name


def build_collection(dataset: Dataset, name: str, index_dir: Path, embedder: str | None, progress=None,
                     source_format: str = "markdown", indexer_options: dict | None = None):
    """Write the sources and ingest them incrementally; an unchanged corpus publishes nothing.
    ``indexer_options`` go to the ``Indexer`` (benchmarks: ``title_header=False``)."""
    from ..indexing.ingest import Indexer

    sources = index_dir / f"{name}-sources"
    sync = write_sources(dataset.corpus(), sources, source_format)
    indexer = Indexer(name, index_dir=index_dir, base_dir=sources, embedder=embedder, progress=progress,
                      **(indexer_options or {}))
    report = indexer.ingest([sources])
    return sync, report


def evaluate(
    dataset_dir: str | Path,
    *,
    collection: str | None = None,
    index_dir: str | Path = ".",
    modes: Iterable[str] | None = None,
    rerank: bool = False,
    reranker=None,
    depth: int = DEFAULT_DEPTH,
    embedder: str | None = None,
    runs_db: str | Path | None = None,
    progress=None,
    log=lambda message: None,
    batch: str | None = None,
    source_format: str = "markdown",
    indexer_options: dict | None = None,
) -> EvalReport:
    """Build (or reuse) the collection for ``dataset_dir`` and score every mode on its judged queries."""
    from ..retrieval.collection import Collection

    if not 10 <= depth <= 1000:
        raise InvalidRequest("depth (--top-k) must be between 10 and 1000")
    if rerank and reranker is None:
        from ..errors import RerankNotConfigured

        raise RerankNotConfigured("--rerank needs a reranker (--reranker NAME)")
    for mode in modes or ():
        if mode not in MODES:
            raise InvalidRequest(f"unknown mode {mode!r}; use {', '.join(MODES)}")
    dataset = load_dataset(dataset_dir)
    judged = dataset.judged_queries
    if not judged:
        raise InvalidRequest("no query in queries.jsonl has a relevant document in qrels/test.tsv")
    name = collection or default_collection_name(dataset)
    index_dir = Path(index_dir)
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

    t0 = time.perf_counter()
    sync, ingest_report = build_collection(dataset, name, index_dir, embedder, progress,
                                           source_format, indexer_options)
    ingest_seconds = time.perf_counter() - t0
    log(
        f"sources: {sync.written} written, {sync.unchanged} unchanged, {sync.removed} removed; "
        f"ingest: {ingest_report.added} added, {ingest_report.updated} updated, "
        f"{ingest_report.unchanged} unchanged, {ingest_report.removed} removed"
        + ("" if ingest_report.published else " (collection reused)")
    )

    col = Collection.open(name, index_dir=index_dir, reranker=reranker)
    try:
        has_vectors = col.embedding is not None
        modes = list(modes) if modes else (list(MODES) if has_vectors else ["bm25"])
        for mode in modes:
            if mode != "bm25" and not has_vectors:
                raise InvalidRequest(f"mode {mode} needs a collection with embeddings (not --embedder none)")
        doc_of_chunk = {
            chunk_id: sync.id_of_source.get(source)
            for chunk_id, source in col.query(
                "SELECT c.chunk_id, d.source FROM chunks c JOIN documents d USING (document_id)"
            )
        }
        documents = col.query("SELECT count(*) FROM documents")[0][0]
        results, failures = [], {}
        for mode in modes:
            try:
                results.append(_run_mode(col, dataset, judged, mode, rerank, depth, doc_of_chunk, log))
            except Exception as exc:  # one broken mode must not hide the others' figures
                failures[mode] = f"{type(exc).__name__}: {exc}"[:300]
                log(f"{mode}: failed: {failures[mode]}")
        report = EvalReport(
            dataset=dataset.name, dataset_dir=str(Path(dataset_dir).resolve()), collection=name,
            index_dir=str(index_dir.resolve()), generation=col.generation, documents=documents,
            chunks=len(doc_of_chunk), reused=not ingest_report.published,
            ingest_seconds=round(ingest_seconds, 3), embedder=col.manifest.get("embedder") or "none",
            depth=depth, started_at=started_at, results=results, failures=failures,
            settings=run_settings(col.manifest, depth, rerank, reranker)
            | ({"source_format": source_format} if source_format != "markdown" else {}), batch=batch,
        )
    finally:
        col.close()
    db = Path(runs_db) if runs_db is not None else index_dir / RUNS_DB
    report.run_ids = store_runs(db, report, reranker_name=getattr(reranker, "model_name", None))
    return report


def run_settings(manifest: dict, depth: int, rerank: bool, reranker) -> dict:
    """The settings a run's figures depend on, as recorded in the runs database."""
    def parsed(key):
        try:
            return json.loads(manifest[key])
        except (KeyError, TypeError, ValueError):
            return manifest.get(key)

    from ..retrieval.modes import HYBRID_DEPTH, RRF_K

    return {
        "chunker": parsed("chunker"),
        # How hybrid fuses (issue 15 compares fusions by this record).
        "fusion": {"method": "rrf", "k": RRF_K, "depth": HYBRID_DEPTH},
        "bm25": parsed("bm25"),
        "embedder": manifest.get("embedder") or "none",
        "embedding_model": manifest.get("embedding_model"),
        "depth": depth,
        "rerank": bool(rerank),
        "reranker": getattr(reranker, "model_name", None) if rerank else None,
    }


def evaluate_many(dataset_dirs: Iterable[str | Path], *, collection: str | None = None, log=lambda m: None,
                  **options) -> tuple[list[EvalReport], dict[str, str]]:
    """:func:`evaluate` each data set in turn; one batch id ties their runs together.

    Returns the reports and, per data set directory, the error that stopped it (the
    others still run; a single data set's error is raised). ``collection`` names the
    collection of a single data set only.
    """
    dirs = list(dict.fromkeys(str(d) for d in dataset_dirs))
    if collection is not None and len(dirs) > 1:
        raise InvalidRequest("--collection names one collection; give one data set with it")
    names = [Path(d).resolve().name for d in dirs]
    if len(set(names)) != len(names):
        raise InvalidRequest("two data set directories have the same name; evaluate them separately")
    batch = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + \
        hashlib.sha256(repr((dirs, time.time_ns())).encode()).hexdigest()[:8]
    from ..errors import GroundkitError

    if len(dirs) == 1:  # a single data set's error is the command's error
        return [evaluate(dirs[0], collection=collection, log=log, batch=batch, **options)], {}
    reports, errors = [], {}
    for d in dirs:
        if len(dirs) > 1:
            log(f"== {Path(d).name}")
        try:
            reports.append(evaluate(d, collection=collection, log=log, batch=batch, **options))
        except GroundkitError as exc:
            errors[d] = str(exc)
            log(f"{Path(d).name}: {exc}")
    return reports, errors


def format_summary(reports: list[EvalReport], errors: dict[str, str] | None = None) -> str:
    """One line per data set and mode: the side-by-side view of a multi-data-set run."""
    lines = [f"{'data set':<18}{'mode':<14}{'nDCG@10':>9}{'R@100':>9}{'MRR@10':>9}{'p50 ms':>9}"]
    for report in reports:
        for r in report.results:
            label = r.mode + (" +rerank" if r.rerank else "")
            lines.append(f"{report.dataset:<18}{label:<14}{r.ndcg_at_10:>9.4f}{r.recall_at_100:>9.4f}"
                         f"{r.mrr_at_10:>9.4f}{r.latency_p50_ms:>9.2f}")
        for mode in report.failures:
            lines.append(f"{report.dataset:<18}{mode:<14}{'failed':>9}")
    for d, error in (errors or {}).items():
        lines.append(f"{Path(d).name:<18}{'-':<14}failed: {error}")
    if reports and reports[0].batch:
        lines.append(f"batch {reports[0].batch}")
    return "\n".join(lines)


def _run_mode(col, dataset, judged, mode, rerank, depth, doc_of_chunk, log) -> ModeResult:
    from ..retrieval.rankers import query_vector as _query_vector

    per_query, latencies, mismatches = [], [], 0
    # One untimed query first: loads the embedder and warms the vector table.
    col.search(SearchRequest(query=dataset.queries[judged[0]][:MAX_QUERY_CHARS].strip() or "x", mode=mode))
    for qid in judged:
        text = dataset.queries[qid][:MAX_QUERY_CHARS].strip() or "?"
        request = SearchRequest(query=text, mode=mode, top_k=50 if rerank else 10, rerank=rerank)
        t = time.perf_counter()
        response = col.search(request)
        latencies.append((time.perf_counter() - t) * 1000)
        public = [(h.chunk_id, h.score) for h in response.hits]
        vector = _query_vector(col, request) if mode != "bm25" else None
        deep = _ranked_chunks(col, text, mode, depth, vector)
        if rerank:
            # The product reranks its top 50; below that the first-stage order stands.
            head = {cid for cid, _ in public}
            ranked = public + [c for c in deep if c[0] not in head]
        else:
            ranked = deep
            if [c for c, _ in public] != [c for c, _ in deep[: len(public)]]:
                mismatches += 1
        ranking = documents_from_chunks(ranked, doc_of_chunk)[:depth]
        metrics = query_metrics(ranking, dataset.qrels[qid])
        per_query.append(
            {"query_id": qid, "query": text, **metrics, "latency_ms": round(latencies[-1], 3),
             "relevant": sum(1 for g in dataset.qrels[qid].values() if g > 0),
             "top_documents": ranking[:10]}
        )
    n = len(per_query)
    mean = {k: sum(q[k] for q in per_query) / n for k in ("ndcg_at_10", "recall_at_10", "recall_at_100", "mrr_at_10")}
    result = ModeResult(
        mode=mode, rerank=rerank, queries=n, **{k: round(v, 4) for k, v in mean.items()},
        latency_p50_ms=round(statistics.median(latencies), 3),
        latency_p95_ms=round(percentile(latencies, 0.95), 3),
        top10_mismatches=mismatches, per_query=per_query,
    )
    log(f"{mode}{' +rerank' if rerank else ''}: nDCG@10 {result.ndcg_at_10:.4f} over {n} queries")
    return result


# -- the runs database ----------------------------------------------------------

_RUNS_DDL = """
CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY,
    started_at TEXT NOT NULL,
    dataset TEXT NOT NULL,
    dataset_dir TEXT NOT NULL,
    collection TEXT NOT NULL,
    generation INTEGER NOT NULL,
    documents INTEGER NOT NULL,
    chunks INTEGER NOT NULL,
    embedder TEXT NOT NULL,
    mode TEXT NOT NULL,
    rerank INTEGER NOT NULL,
    reranker TEXT,
    depth INTEGER NOT NULL,
    queries INTEGER NOT NULL,
    ndcg_at_10 REAL NOT NULL,
    recall_at_10 REAL NOT NULL,
    recall_at_100 REAL NOT NULL,
    mrr_at_10 REAL NOT NULL,
    latency_p50_ms REAL NOT NULL,
    latency_p95_ms REAL NOT NULL,
    top10_mismatches INTEGER NOT NULL,
    ingest_seconds REAL NOT NULL,
    reused INTEGER NOT NULL,
    groundkit_version TEXT,
    settings TEXT,
    batch TEXT
);
CREATE TABLE IF NOT EXISTS query_results (
    run_id INTEGER NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    query_id TEXT NOT NULL,
    query TEXT NOT NULL,
    ndcg_at_10 REAL NOT NULL,
    recall_at_10 REAL NOT NULL,
    recall_at_100 REAL NOT NULL,
    mrr_at_10 REAL NOT NULL,
    latency_ms REAL NOT NULL,
    relevant INTEGER NOT NULL,
    top_documents TEXT NOT NULL,
    PRIMARY KEY (run_id, query_id)
);
"""


def store_runs(path: Path, report: EvalReport, reranker_name: str | None = None) -> list[int]:
    """Append one ``runs`` row per mode and its per-query rows; returns the new run ids."""
    from .. import __version__

    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    try:
        conn.executescript(_RUNS_DDL)
        # A runs file from before the settings were recorded gains the columns.
        have = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
        for column in ("settings", "batch"):
            if column not in have:
                conn.execute(f"ALTER TABLE runs ADD COLUMN {column} TEXT")
        ids = []
        with conn:
            for r in report.results:
                cur = conn.execute(
                    """INSERT INTO runs(started_at, dataset, dataset_dir, collection, generation,
                           documents, chunks, embedder, mode, rerank, reranker, depth, queries,
                           ndcg_at_10, recall_at_10, recall_at_100, mrr_at_10, latency_p50_ms,
                           latency_p95_ms, top10_mismatches, ingest_seconds, reused, groundkit_version,
                           settings, batch)
                       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                    (
                        report.started_at, report.dataset, report.dataset_dir, report.collection,
                        report.generation, report.documents, report.chunks, report.embedder, r.mode,
                        int(r.rerank), reranker_name if r.rerank else None, report.depth, r.queries,
                        r.ndcg_at_10, r.recall_at_10, r.recall_at_100, r.mrr_at_10, r.latency_p50_ms,
                        r.latency_p95_ms, r.top10_mismatches, report.ingest_seconds,
                        int(report.reused), __version__, json.dumps(report.settings, sort_keys=True),
                        report.batch,
                    ),
                )
                run_id = cur.lastrowid
                ids.append(run_id)
                conn.executemany(
                    """INSERT INTO query_results(run_id, query_id, query, ndcg_at_10, recall_at_10,
                           recall_at_100, mrr_at_10, latency_ms, relevant, top_documents)
                       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                    [
                        (run_id, q["query_id"], q["query"], q["ndcg_at_10"], q["recall_at_10"],
                         q["recall_at_100"], q["mrr_at_10"], q["latency_ms"], q["relevant"],
                         json.dumps(q["top_documents"]))
                        for q in r.per_query
                    ],
                )
        return ids
    finally:
        conn.close()


def format_table(report: EvalReport) -> str:
    lines = [
        f"{report.dataset}: collection '{report.collection}' generation {report.generation} "
        f"({report.documents} documents, {report.chunks} chunks, embedder {report.embedder}"
        f"{', reused' if report.reused else ''}); {report.results[0].queries if report.results else 0} "
        f"judged queries, depth {report.depth}",
        f"{'mode':<14}{'nDCG@10':>9}{'R@10':>9}{'R@100':>9}{'MRR@10':>9}{'p50 ms':>9}{'p95 ms':>9}",
    ]
    for r in report.results:
        label = r.mode + (" +rerank" if r.rerank else "")
        lines.append(
            f"{label:<14}{r.ndcg_at_10:>9.4f}{r.recall_at_10:>9.4f}{r.recall_at_100:>9.4f}"
            f"{r.mrr_at_10:>9.4f}{r.latency_p50_ms:>9.2f}{r.latency_p95_ms:>9.2f}"
        )
        if r.top10_mismatches:
            lines.append(f"  note: {r.top10_mismatches} queries' public top 10 differed from the depth-{report.depth} run")
    for mode, error in report.failures.items():
        lines.append(f"{mode:<14}failed: {error}")
    if report.run_ids:
        lines.append(f"stored as run ids {', '.join(map(str, report.run_ids))}")
    return "\n".join(lines)
