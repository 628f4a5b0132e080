"""``verify_quote``: find quotations in the current sources, read-only.

Each quote is looked for in the documents it is attributed to (a chunk's document, or
the sources matching a source filter) or, when it names none, in the documents BM25
ranks best for it. Every candidate is re-read and re-extracted exactly as ingest did
(``citations.current_source``), so offsets point into the text a citation points into.
The search goes from strict to loose and stops at the first level that finds it:

1. exact: the quote occurs verbatim;
2. normalised: equal after case folding, collapsing whitespace and unifying quote marks,
   dashes and ellipses (the offsets still point into the original text);
3. approximate: the best-aligned span scores at least ``min_similarity`` (rapidfuzz's
   normalised Indel similarity of the quote against that span, 0..1).

Only documents the caller may read are searched: every candidate query carries the
reader's predicate. Bounds are in the request model (422 past them) and
``MAX_DOCUMENTS_SCANNED`` (413); see docs/api.md.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, field_validator

from .citations import SourceUnavailable, current_source, line_of
from ..errors import TooManyDocuments
from ..indexing.extract import page_for_offset
from .models import CHUNK_ID_PATTERN, MAX_QUERY_CHARS, Request, Response
from .rows import ChunkSpan, SourceRow

MAX_QUOTES = 20
MAX_QUOTE_CHARS = 2000
MAX_DOCUMENTS_SCANNED = 200  # distinct documents re-read per call
CANDIDATES_PER_QUOTE = 10  # documents BM25 proposes for a quote with no attribution
DEFAULT_MIN_SIMILARITY = 0.9
MIN_FUZZY_CHARS = 8  # shorter quotes are verified exactly or not at all
DEFAULT_CONTEXT_CHARS = 200

Verdict = Literal["verified", "verified_normalised", "approximate", "not_found"]


class Quote(Request):
    text: str = Field(min_length=1, max_length=MAX_QUOTE_CHARS,
                      description=f"The quoted text, up to {MAX_QUOTE_CHARS} characters.")
    chunk_id: str | None = Field(
        default=None, pattern=CHUNK_ID_PATTERN,
        description="The chunk the quote is attributed to: only its document is searched.")
    source: str | None = Field(
        default=None, max_length=1000,
        description="The source the quote is attributed to: an exact source, a prefix, or a "
                    "glob if it has * ? or [. Only matching documents are searched.")


QuoteText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_QUOTE_CHARS)]


class VerifyQuoteRequest(Request):
    quotes: list[Quote | QuoteText] = Field(
        min_length=1, max_length=MAX_QUOTES,
        description=f"1 to {MAX_QUOTES} quotes, each a string or an object attributing it to a "
                    "chunk or source (a GET repeats quotes=, one string each).")
    min_similarity: float = Field(
        default=DEFAULT_MIN_SIMILARITY, ge=0.5, le=1.0,
        description="Lowest similarity (0.5 to 1) an approximate match may have "
                    f"(default {DEFAULT_MIN_SIMILARITY}).")
    context_chars: int = Field(
        default=DEFAULT_CONTEXT_CHARS, ge=0, le=1000,
        description="Characters of surrounding source text returned on each side (0 to 1000).")

    @field_validator("quotes")
    @classmethod
    def _as_objects(cls, v):
        return [Quote(text=q) if isinstance(q, str) else q for q in v]


class QuoteMatch(Response):
    document_id: str
    source: str
    title: str | None
    start_offset: int
    end_offset: int
    line_start: int
    line_end: int
    page_start: int | None = None
    page_end: int | None = None
    matched_text: str
    context_before: str
    context_after: str
    within_chunk: bool | None = None  # for a quote attributed to a chunk: inside its indexed span


class QuoteResult(Response):
    index: int
    verdict: Verdict
    score: float | None = None  # 1.0 for exact and normalised matches
    reason: str
    match: QuoteMatch | None = None
    documents_searched: int


class VerifyQuoteResponse(Response):
    collection: str
    generation: int
    min_similarity: float
    documents_scanned: int
    results: list[QuoteResult]


# -- normalisation -----------------------------------------------------------------------

_MARKS = {
    **dict.fromkeys("\u2018\u2019\u201a\u201b\u2032\u0060\u00b4", "'"),
    **dict.fromkeys("\u201c\u201d\u201e\u201f\u2033\u00ab\u00bb", '"'),
    **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
    "\u2026": "...",
    "\u00ad": "",  # soft hyphen
}


def _normal_char(c: str) -> str:
    if c in _MARKS:
        return _MARKS[c]
    return unicodedata.normalize("NFKC", c).casefold()


def normalise(text: str) -> tuple[str, list[int]]:
    """``text`` normalised, and for each of its characters the offset in ``text`` it came from.

    Whitespace runs become one space; quote marks, dashes and ellipses are unified; case is
    folded (NFKC per character, so a mapping back is exact).
    """
    out: list[str] = []
    origin: list[int] = []
    space = False
    for i, c in enumerate(text):
        if c.isspace():
            if not space and out:
                out.append(" ")
                origin.append(i)
            space = True
            continue
        space = False
        for n in _normal_char(c):
            out.append(n)
            origin.append(i)
    if out and out[-1] == " ":
        out.pop()
        origin.pop()
    return "".join(out), origin


def _back(origin: list[int], start: int, end: int) -> tuple[int, int]:
    """A span of the normalised text -> the span of the original text it covers."""
    return origin[start], origin[end - 1] + 1


# -- candidates --------------------------------------------------------------------------


_DOC_COLUMNS = ("d.document_id, d.source, d.title, d.source_class, d.extractor, "
                "d.extractor_version, {encoding}")


def _documents(collection, reader, where: str, params: list, limit: int) -> list[tuple]:
    sql, rparams = reader.readable_sql("d")
    cols = _DOC_COLUMNS.format(encoding="d.encoding" if collection.has_encoding else "NULL")
    return collection.query(
        f"SELECT {cols} FROM documents d WHERE ({where}) AND {sql} ORDER BY d.source LIMIT ?",
        [*params, *rparams, limit], row=SourceRow,
    )


def _candidates(collection, scoped, reader, quote: Quote):
    """(documents to search in order, the attributed chunk's (document, start, end) or None)."""
    if quote.chunk_id is not None:
        rows = collection.query(
            "SELECT document_id, start_offset, end_offset FROM chunks WHERE chunk_id = ?",
            (quote.chunk_id,), row=ChunkSpan,
        )
        if not rows:
            return [], None
        docs = _documents(collection, reader, "d.document_id = ?", [rows[0].document_id], 1)
        return docs, (rows[0] if docs else None)
    if quote.source is not None:
        from .search import filter_sql
        from .models import SearchRequest

        clauses, params = filter_sql(SearchRequest(query="x", source=quote.source))
        docs = _documents(collection, reader, " AND ".join(clauses), params,
                          MAX_DOCUMENTS_SCANNED + 1)
        if len(docs) > MAX_DOCUMENTS_SCANNED:
            raise TooManyDocuments(
                f"a quote's source matches more than {MAX_DOCUMENTS_SCANNED} documents; "
                "name a narrower source")
        return docs, None
    # No attribution: the documents BM25 ranks best for the quote (the reader's view only).
    response = scoped.search(query=quote.text[:MAX_QUERY_CHARS], mode="bm25", top_k=50)
    order = list(dict.fromkeys(h.document_id for h in response.hits))[:CANDIDATES_PER_QUOTE]
    if not order:
        return [], None
    rows = _documents(collection, reader, "d.document_id IN (SELECT value FROM json_each(?))",
                      [json.dumps(order)], len(order))
    by_id = {r.document_id: r for r in rows}
    return [by_id[d] for d in order if d in by_id], None


# -- matching ----------------------------------------------------------------------------


class _Text:
    """One document's current text, normalised lazily."""

    def __init__(self, row, extracted):
        self.row = row
        self.text = extracted.text
        self.pages = extracted.page_starts
        self._norm = None

    @property
    def norm(self):
        if self._norm is None:
            self._norm = normalise(self.text)
        return self._norm


def _nearest(text: str, needle: str, anchor: int | None) -> int:
    first = text.find(needle)
    if anchor is None or first < 0:
        return first
    best, pos = first, first
    while pos >= 0 and pos <= anchor:  # occurrences up to the anchor, then the first after it
        best = pos
        pos = text.find(needle, pos + 1)
    if pos >= 0 and abs(pos - anchor) < abs(best - anchor):
        best = pos
    return best


def _find(doc: _Text, quote: str, qnorm: str, anchor, min_similarity: float):
    """(level, score, start, end) of the best find in ``doc`` at the strictest level, or None."""
    pos = _nearest(doc.text, quote, anchor)
    if pos >= 0:
        return 0, 1.0, pos, pos + len(quote)
    if not qnorm:
        return None
    norm, origin = doc.norm
    npos = norm.find(qnorm)
    if npos >= 0:
        return (1, 1.0, *_back(origin, npos, npos + len(qnorm)))
    if len(qnorm) < MIN_FUZZY_CHARS or not norm:
        return None
    from rapidfuzz import fuzz

    found = fuzz.partial_ratio_alignment(qnorm, norm, score_cutoff=min_similarity * 100)
    if found is None or found.dest_end <= found.dest_start:
        return None
    score, a, b = _tighten(qnorm, norm, found.dest_start, found.dest_end)
    start, end = _back(origin, a, b)
    text = doc.text
    while start < end and text[start].isspace():  # the alignment may take in a line break
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return 2, round(score / 100, 4), start, end


def _tighten(qnorm: str, norm: str, start: int, end: int) -> tuple[float, int, int]:
    """The alignment window moved to word boundaries near its ends where that scores higher.

    rapidfuzz aligns a window as long as the quote, which can take in a neighbouring word's
    tail; the span reported is the best-scoring one starting and ending at word boundaries
    within a few words of the window's ends, with its similarity (0..100).
    """
    from rapidfuzz import fuzz

    reach = max(4, min(40, len(qnorm) // 4))
    starts = {start} | {i + 1 for i in range(max(0, start - reach), min(len(norm), start + reach))
                        if norm[i] == " "}
    ends = {end} | {i for i in range(max(0, end - reach), min(len(norm), end + reach) + 1)
                    if i == len(norm) or norm[i] == " "}
    best = (fuzz.ratio(qnorm, norm[start:end]), start, end)
    for s in starts:
        for e in ends:
            if e - s > 0:
                score = fuzz.ratio(qnorm, norm[s:e])
                if score > best[0]:
                    best = (score, s, e)
    return best


_VERDICTS = {0: "verified", 1: "verified_normalised", 2: "approximate"}
_REASONS = {
    0: "the quote occurs verbatim in the current source",
    1: "the quote occurs in the current source after normalising whitespace, case and "
       "quote marks",
    2: "a span of the current source is similar to the quote",
}


def verify_quotes(collection, scoped, request: VerifyQuoteRequest) -> VerifyQuoteResponse:
    """Answer ``request`` over ``collection`` as ``scoped``'s reader sees it."""
    reader = scoped.reader
    plans = [_candidates(collection, scoped, reader, q) for q in request.quotes]
    distinct = {row.document_id for docs, _a in plans for row in docs}
    if len(distinct) > MAX_DOCUMENTS_SCANNED:
        raise TooManyDocuments(
            f"these quotes would search more than {MAX_DOCUMENTS_SCANNED} documents; "
            "send fewer quotes or narrower sources")
    texts: dict[str, _Text | str] = {}  # document_id -> its text, or why it cannot be read

    def text_of(row):
        if row.document_id not in texts:
            try:
                extracted = current_source(
                    source=row.source, source_class=row.source_class, extractor=row.extractor,
                    extractor_version=row.extractor_version, base_dir=collection.base_dir,
                    encoding=row.encoding)
                texts[row.document_id] = _Text(row, extracted)
            except SourceUnavailable as exc:
                texts[row.document_id] = exc.reason
        return texts[row.document_id]

    results = []
    for index, (quote, (docs, attributed)) in enumerate(zip(request.quotes, plans)):
        qnorm = normalise(quote.text)[0]
        anchor = attributed.start_offset if attributed else None
        best = None  # (level, -score, order, doc, start, end)
        unreadable = []
        for order, row in enumerate(docs):
            doc = text_of(row)
            if isinstance(doc, str):
                unreadable.append(doc)
                continue
            found = _find(doc, quote.text, qnorm, anchor, request.min_similarity)
            if found is None:
                continue
            level, score, start, end = found
            key = (level, -score, order)
            if best is None or key < best[0]:
                best = (key, doc, start, end)
            if level == 0:
                break  # verbatim in the best-ranked document: nothing beats it
        if best is None:
            results.append(QuoteResult(
                index=index, verdict="not_found", reason=_not_found_reason(quote, docs, unreadable),
                documents_searched=len(docs) - len(unreadable)))
            continue
        (level, neg_score, _o), doc, start, end = best
        within = None
        if attributed is not None:
            within = attributed.start_offset <= start and end <= attributed.end_offset
        results.append(QuoteResult(
            index=index, verdict=_VERDICTS[level], score=-neg_score, reason=_REASONS[level],
            match=_match(doc, start, end, request.context_chars, within),
            documents_searched=len(docs) - len(unreadable)))
    return VerifyQuoteResponse(
        collection=collection.name, generation=collection.generation,
        min_similarity=request.min_similarity,
        documents_scanned=sum(1 for t in texts.values() if not isinstance(t, str)),
        results=results)


def _not_found_reason(quote: Quote, docs, unreadable) -> str:
    if not docs:
        if quote.chunk_id is not None:
            return "the attributed chunk was not found"
        if quote.source is not None:
            return "no document matches the attributed source"
        return "no document shares words with the quote"
    if len(unreadable) == len(docs):
        return "the candidate sources could not be read: " + unreadable[0]
    where = "the attributed source" if quote.chunk_id or quote.source else "the candidate sources"
    return f"the quote is not in {where}, not even approximately"


def _match(doc: _Text, start: int, end: int, context_chars: int, within) -> QuoteMatch:
    text, row = doc.text, doc.row
    return QuoteMatch(
        document_id=row.document_id, source=row.source, title=row.title, start_offset=start,
        end_offset=end,
        line_start=line_of(text, start), line_end=line_of(text, max(start, end - 1)),
        page_start=page_for_offset(doc.pages, start),
        page_end=page_for_offset(doc.pages, max(start, end - 1)),
        matched_text=text[start:end],
        context_before=text[max(0, start - context_chars) : start],
        context_after=text[end : end + context_chars],
        within_chunk=within,
    )
