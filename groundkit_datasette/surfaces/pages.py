"""HTML pages: each is a rendering of one tool-table operation.

Pages reach collections only through ``service.call_tool``, like the JSON API and
MCP, so permissions, validation and the error mapping are the same on every surface.
Everything here prepares display values; the templates only lay them out.
"""

from __future__ import annotations

import re
import urllib.parse

from datasette.utils import tilde_encode
from datasette.utils.asgi import Response
from markupsafe import Markup, escape

from ..retrieval.bm25 import STOP_WORDS, tokenize
from . import serialize
from .service import ToolContext, call_tool
from .static_files import static_url
from .tools import BUILTIN_TOOLS, Tool, all_tools

_FORM_FIELDS = {"q": "query", "mode": "mode", "top_k": "top_k", "rerank": "rerank",
                "source": "source", "offset": "offset", "group": "group_by_document",
                "min_score": "min_score"}
_FORM_FLAGS = ("rerank", "group_by_document")
SNIPPET_CHARS = 360
NO_RERANKER = "no reranker is configured on this server"
CONTEXT_CHARS = 400  # verify_citation's default context on each side


def _arguments(tool: Tool, request) -> tuple[dict, bool]:
    """Request arguments from the page's query string; ``False`` when the form was not submitted."""
    args = {}
    if tool.name == "search":
        for param, field in _FORM_FIELDS.items():
            value = request.args.get(param)
            if value not in (None, ""):
                args[field] = value
        # A submitted empty box is a validation error to show, not a blank form.
        submitted = "q" in request.args
        if submitted and "query" not in args:
            args["query"] = ""
        for flag in _FORM_FLAGS:
            if flag in args:
                args[flag] = args[flag] in ("1", "on", "true")
        return args, submitted
    if tool.name == "verify_quote":
        return _quote_arguments(request)
    if tool in BUILTIN_TOOLS:
        return args, True
    # A plugin's tool: its request fields, taken by name from the query string.
    fields = tool.request_model.model_fields
    for name in fields:
        if name in request.args and name not in tool.path_params:
            args[name] = request.args[name]
    required = [n for n, f in fields.items() if f.is_required() and n not in tool.path_params]
    return args, bool(args) or not required


def _quote_arguments(request) -> tuple[dict, bool]:
    """The quote page's form: one quote, optionally attributed to a source or a chunk."""
    if "quote" not in request.args:
        return {}, False
    quote = {"text": request.args.get("quote", "")}
    for field in ("source", "chunk_id"):
        if request.args.get(field):
            quote[field] = request.args[field]
    return {"quotes": [quote]}, True


def _tool_named(name: str) -> Tool:
    for tool in all_tools():
        if tool.name == name:
            return tool
    raise LookupError(name)


async def _status(ctx: ToolContext, collection: str):
    """``index_status`` through the table, so a page never reads a collection another way."""
    return await call_tool(_tool_named("index_status"), ctx, collection, {})


# -- highlighting -----------------------------------------------------------------

_WORD = re.compile(r"\w+")
_BLANK_LINES = re.compile(r"\n[ \t]*(?:\n[ \t]*)+")


class QueryTerms:
    """Which words of a text a query matches: its own words, or crudely, by stem prefix."""

    def __init__(self, query: str):
        self.words = {w for w in _WORD.findall(query.lower()) if w not in STOP_WORDS}
        self.stems = {s for s in tokenize(query) if s}
        self._cache: dict[str, bool] = {}

    def __bool__(self):
        return bool(self.words or self.stems)

    def matches(self, word: str) -> bool:
        lw = word.lower()
        hit = self._cache.get(lw)
        if hit is None:
            if lw in self.words:
                hit = True
            else:
                stem = tokenize(lw)
                hit = bool(stem) and any(
                    stem[0] == s or (len(s) >= 3 and stem[0].startswith(s)) for s in self.stems
                )
            self._cache[lw] = hit
        return hit


def highlight(text: str, terms: QueryTerms | None, limit: int | None = None) -> Markup:
    """``text`` escaped, matching words wrapped in <mark>; cut to ``limit`` chars around the first match."""
    text = text or ""
    spans = [m.span() for m in _WORD.finditer(text) if terms and terms.matches(m.group())]
    start, end = 0, len(text)
    if limit and len(text) > limit:
        first = spans[0][0] if spans else 0
        start = max(0, first - limit // 3)
        if start:
            space = text.rfind(" ", 0, start)
            start = space + 1 if space > start - 40 else start
        end = min(len(text), start + limit)
        if end < len(text):
            space = text.find(" ", end)
            end = space if 0 <= space < end + 40 else end
    out = [Markup("…")] if start else []
    pos = start
    for s, e in spans:
        if s < start or e > end:
            continue
        out += [escape(text[pos:s]), Markup("<mark>"), escape(text[s:e]), Markup("</mark>")]
        pos = e
    out.append(escape(text[pos:end]))
    if end < len(text):
        out.append(Markup("…"))
    return Markup("").join(out)


# -- snippets as text --------------------------------------------------------------

_MD_LINE = [
    (re.compile(r"^\s{0,3}(?:`{3,}|~{3,}).*$", re.M), ""),          # code fences
    (re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", re.M), r"\1"),  # ATX headings
    (re.compile(r"^\s{0,3}(?:[-*_]\s*){3,}$", re.M), ""),             # thematic breaks
    (re.compile(r"^\s{0,3}(?:>\s?)+", re.M), ""),                     # block quotes
    (re.compile(r"^(\s*)(?:[-*+]|\d{1,9}[.)])\s+(?:\[[ xX]\]\s+)?", re.M), r"\1"),  # list markers
    (re.compile(r"^\s*\|?(?:\s*:?-{3,}:?\s*\|)+\s*:?-*:?\s*$", re.M), ""),  # table rules
]
_MD_INLINE = [
    (re.compile(r"!\[([^\]]*)\]\([^)]*\)"), r"\1"),       # images: their alt text
    (re.compile(r"\[([^\]]+)\]\([^)]*\)"), r"\1"),        # links: their text
    (re.compile(r"\[([^\]]+)\]\[[^\]]*\]"), r"\1"),      # reference links
    (re.compile(r"^\s{0,3}\[[^\]]+\]:\s+\S+.*$", re.M), ""),  # link definitions
    (re.compile(r"`+([^`]*)`+"), r"\1"),                   # inline code
    (re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1"), r"\2"),  # strong
    (re.compile(r"(?<![\w*])\*(?=\S)([^*\n]+?)(?<=\S)\*(?![\w*])"), r"\1"),  # emphasis
    (re.compile(r"(?<!\w)_(?=\S)([^_\n]+?)(?<=\S)_(?!\w)"), r"\1"),
]
_MARKDOWN_SUFFIXES = (".md", ".markdown", ".mdown", ".mkd")


def plain_text(text: str, source: str = "") -> str:
    """A chunk's text as a person reads it: Markdown syntax dropped from Markdown sources.

    Only the markup goes (heading hashes, list markers, backticks, link syntax, emphasis);
    every word stays, and HTML in the text is left as text for the template to escape.
    """
    text = text or ""
    if source.lower().endswith(_MARKDOWN_SUFFIXES):
        for pattern, repl in _MD_LINE + _MD_INLINE:
            text = pattern.sub(repl, text)
    return _BLANK_LINES.sub("\n", text).strip("\n")


# -- weak hits ----------------------------------------------------------------------

# A BM25 hit scoring under this share of the ranking's first hit is shown as weak.
WEAK_SCORE_RATIO = 0.25


def weak_reason(hit, response) -> str | None:
    """Why a hit is a weak match, or None. Two rules, documented in docs/api.md:
    a fused or dense hit holding none of the query's words (empty ``matched_terms``), or,
    in BM25 without reranking, a score under WEAK_SCORE_RATIO of the ranking's first hit."""
    if response.mode != "bm25" and not hit.matched_terms:
        return "no keyword match"
    if (response.mode == "bm25" and not response.reranked and response.top_score
            and hit.score < WEAK_SCORE_RATIO * response.top_score):
        return "score far below the best hit"
    return None


# -- display helpers ----------------------------------------------------------------


def span_label(kind: str, start, end) -> str:
    if start is None:
        return ""
    if end is None or end == start:
        return f"{kind} {start}"
    return f"{kind}s {start}–{end}"


def citation_text(chunk) -> str:
    """One line a person can paste: where the text is, which chunk, under which heading."""
    where = f"{chunk.source}:{chunk.line_start}"
    if chunk.line_end != chunk.line_start:
        where += f"-{chunk.line_end}"
    parts = [where]
    if chunk.page_start is not None:
        parts.append(f"(p. {chunk.page_start}" + (
            f"-{chunk.page_end})" if chunk.page_end not in (None, chunk.page_start) else ")"))
    parts.append(f"[{chunk.chunk_id}]")
    if chunk.heading:
        parts.append(f'"{chunk.heading}"')
    return " ".join(parts)


def _components(hit) -> list[dict]:
    return [
        {"name": name, "rank": c.rank, "score": f"{c.score:.4g}"}
        for name, c in hit.components.items()
    ]


def _mode_options(status, selected: str | None) -> list[dict]:
    """Every registered mode; those this server cannot run here are shown disabled."""
    from ..retrieval.modes import registered_modes

    available = set(status.modes) if status is not None else {"bm25"}
    reason = (status.dense_unavailable_reason if status else None) or "dense search is unavailable"
    return [
        {"value": m.name, "label": m.name, "selected": m.name == selected,
         "disabled": m.name not in available,
         "reason": reason if m.name not in available else None}
        for m in registered_modes().values()
    ]


def _search_form(datasette, collection: str, status, arguments: dict, response, reranker: bool):
    """Values for the search form: echo the request, default the mode like the service does."""
    from ..retrieval.modes import mode_names

    mode = arguments.get("mode")
    if mode not in mode_names():
        mode = response.mode if response else (
            "hybrid" if status and status.dense_available else "bm25")
    options = _mode_options(status, mode)
    top_k = arguments.get("top_k", "")
    group = bool(arguments.get("group_by_document"))
    return {
        "action": datasette.urls.path(_tool_named("search").path_for_html(collection=collection)),
        "q": arguments.get("query", ""),
        "mode": mode,
        "modes": options,
        "dense_reason": next((o["reason"] for o in options if o["disabled"]), None),
        "top_k": top_k,
        "max_top_k": _settings(datasette).max_top_k,
        "max_query_chars": _settings(datasette).max_query_chars,
        "source": arguments.get("source", ""),
        "rerank": bool(arguments.get("rerank")),
        "group": group,
        "min_score": arguments.get("min_score", ""),
        "rerank_available": reranker,
        "rerank_reason": None if reranker else NO_RERANKER,
    }


def _settings(datasette):
    from .service import settings_for

    return settings_for(datasette)


def _chunk_url(datasette, collection: str, chunk_id: str) -> str:
    path = _tool_named("fetch_chunk").path_for_html(
        collection=collection, chunk_id=urllib.parse.quote(chunk_id, safe=""))
    return datasette.urls.path(path)


# -- per-page context -----------------------------------------------------------------


async def _collections_context(datasette, request, ctx, response, arguments, status=None):
    rows = []
    for name in (response.collections if response else []):
        status, error = await _status(ctx, name)
        rows.append({
            "name": name,
            "status": status,
            "error": error,
            "status_url": datasette.urls.path(
                _tool_named("index_status").path_for_html(collection=name)),
            "search_url": datasette.urls.path(
                _tool_named("search").path_for_html(collection=name)),
            "database_url": datasette.urls.database(name),
        })
    return {"rows": rows}


async def _status_context(datasette, request, ctx, response, arguments, status=None):
    collection = request.url_vars["collection"]
    reranker = ctx.registry.reranker_configured
    return {
        "status": response,
        "form": _search_form(datasette, collection, response, {}, None, reranker),
        "database_url": datasette.urls.database(collection),
        "documents_url": datasette.urls.table(collection, "documents"),
        "chunks_url": datasette.urls.table(collection, "chunks"),
    }


def _page_url(request, offset: int) -> str:
    """This search page's URL with another ``offset``: every other field as the request had it."""
    pairs = [(k, v) for k, v in urllib.parse.parse_qsl(request.query_string, keep_blank_values=True)
             if k != "offset"]
    if offset:
        pairs.append(("offset", str(offset)))
    return request.path + "?" + urllib.parse.urlencode(pairs)


async def _search_context(datasette, request, ctx, response, arguments, status=None):
    collection = request.url_vars["collection"]
    terms = QueryTerms(arguments.get("query") or "")
    hits = []
    for hit in (response.hits if response else []):
        document = hit.title or hit.source
        hits.append({
            "hit": hit,
            # Titled by the section: one document's hits differ by their headings (a PDF's,
            # which has none, by their pages).
            "title": hit.heading or (f"{document}, {span_label('page', hit.page_start, hit.page_end)}"
                                     if hit.page_start is not None else document),
            "document": document,
            "url": _chunk_url(datasette, collection, hit.chunk_id),
            "document_url": _document_url(datasette, collection, hit.document_id, hit.chunk_id),
            "lines": span_label("line", hit.line_start, hit.line_end),
            "pages": span_label("page", hit.page_start, hit.page_end),
            "score": f"{hit.score:.4g}",
            "components": _components(hit),
            "weak": weak_reason(hit, response),
            # Readable text, blank lines collapsed: it keeps line breaks but stays short.
            "snippet": highlight(plain_text(hit.content, hit.source), terms, SNIPPET_CHARS),
        })
    groups = None
    if response is not None and response.groups is not None:
        by_id = {h["hit"].chunk_id: h for h in hits}
        groups = [{"group": g, "first": by_id[g.chunk_ids[0]],
                   "more": [by_id[c] for c in g.chunk_ids[1:]]} for g in response.groups]
    pages = {}
    if response is not None:
        if response.next_offset is not None:
            pages["next"] = _page_url(request, response.next_offset)
        if response.offset:
            pages["previous"] = _page_url(request, max(0, response.offset - response.top_k))
    return {
        "status": status,
        "hits": hits,
        "groups": groups,
        "pages": pages,
        "form": _search_form(datasette, collection, status, arguments, response,
                             ctx.registry.reranker_configured),
    }


async def _chunk_context(datasette, request, ctx, response, arguments, status=None):
    if response is None:
        return {}
    collection = request.url_vars["collection"]
    chunk = response.chunk
    v = response.verification
    own = _chunk_url(datasette, collection, chunk.chunk_id)
    context_before = v.context_before or ""
    page_images, page_image_note = _page_images(datasette, collection, chunk, v)
    return {
        "page_images": page_images,
        "page_image_note": page_image_note,
        "chunk": chunk,
        "verification": v,
        "lines": span_label("line", chunk.line_start, chunk.line_end),
        "pages": span_label("page", chunk.page_start, chunk.page_end),
        "permalink": datasette.absolute_url(request, own),
        "citation": citation_text(chunk),
        # Context is cut at a fixed width: mark the cut unless it reached the file's start.
        "before_cut": len(context_before) >= CONTEXT_CHARS
        and chunk.start_offset > len(context_before),
        "after_cut": len(v.context_after or "") >= CONTEXT_CHARS,
        "relocated_lines": span_label("line", v.relocated.line_start, v.relocated.line_end)
        if v.relocated else None,
        "chunk_row_url": datasette.urls.table(collection, "chunks")
        + "?" + urllib.parse.urlencode({"chunk_id": chunk.chunk_id}),
        "document_url": datasette.urls.row(collection, "documents", tilde_encode(chunk.document_id)),
        "document_page_url": _document_url(datasette, collection, chunk.document_id, chunk.chunk_id),
        "search_url": datasette.urls.path(_tool_named("search").path_for_html(collection=collection)),
    }


def _page_images(datasette, collection: str, chunk, verification):
    """The PDF pages a chunk page shows, or why it shows none: a page is drawn on only while
    the source is the one ingest read (the image route checks again, by hash)."""
    from ..retrieval.page_render import MAX_PAGES_SHOWN, cited_pages

    pages = cited_pages(chunk)
    if not pages:
        return [], None
    if verification.status != "verified":
        return [], ("The page is not shown: the source file is not the one that was ingested "
                    f"({verification.status}), so the cited offsets may point at other text.")
    images = []
    own = _chunk_url(datasette, collection, chunk.chunk_id)
    for n in pages:
        images.append({"page": n, "url": f"{own}/pages/{n}.png",
                       "alt": f"Page {n} of {chunk.source}, the cited text highlighted"})
    last = chunk.page_end or chunk.page_start
    more = last - pages[-1]
    note = (f"The first {MAX_PAGES_SHOWN} of the cited pages are shown ({more} more)."
            if more > 0 else None)
    return images, note


def _document_url(datasette, collection: str, document_id: str, chunk_id: str | None = None) -> str:
    path = datasette.urls.path(_tool_named("fetch_document").path_for_html(
        collection=collection, document_id=urllib.parse.quote(document_id, safe="")))
    if chunk_id:
        path += "?" + urllib.parse.urlencode({"chunk": chunk_id}) + "#" + chunk_id
    return path


_DOCUMENT_STATUS_MARK = {"unchanged": "✓", "changed": "!", "missing": "?", "unresolvable": "?"}
MAX_TOC_DEPTH = 5


async def _document_context(datasette, request, ctx, response, arguments, status=None):
    if response is None:
        return {}
    collection = request.url_vars["collection"]
    known = {c.chunk_id for c in response.chunks}
    cited = request.args.get("chunk")
    cited = cited if cited in known else None  # anything else is ignored, never echoed
    blocks = [{
        "chunk": c,
        "text": c.content[c.shown_from:],
        "cited": c.chunk_id == cited,
        "url": _chunk_url(datasette, collection, c.chunk_id),
        "lines": span_label("line", c.line_start, c.line_end),
        "pages": span_label("page", c.page_start, c.page_end),
    } for c in response.chunks]
    toc = [{"label": h.heading.split(" > ")[-1], "path": h.heading, "href": "#" + h.chunk_id,
            "depth": min(h.depth, MAX_TOC_DEPTH)} for h in response.headings]
    v = response.verification
    return {
        "document": response,
        "blocks": blocks,
        "toc": toc,
        "cited": cited,
        "status_mark": _DOCUMENT_STATUS_MARK[v.status],
        "document_row_url": datasette.urls.row(collection, "documents",
                                               tilde_encode(response.document_id)),
        "chunks_rows_url": datasette.urls.table(collection, "chunks")
        + "?" + urllib.parse.urlencode({"document_id": response.document_id,
                                        "_sort": "chunk_index"}),
        "search_url": datasette.urls.path(_tool_named("search").path_for_html(collection=collection)),
    }


_CONTEXT = {
    "list_collections": _collections_context,
    "index_status": _status_context,
    "search": _search_context,
    "fetch_chunk": _chunk_context,
    "fetch_document": _document_context,
}


def html_view(tool: Tool):
    async def view(datasette, request):
        from .service import registry_for

        registry = registry_for(datasette)
        ctx = ToolContext(registry, request.actor, "html")
        collection = request.url_vars.get("collection")
        arguments, submitted = _arguments(tool, request)
        for param in tool.path_params:
            arguments[param] = request.url_vars[param]
        response = error = status = None
        extra = {}
        if tool.name == "search" and collection is not None:
            # The form needs dense availability; a missing collection fails here, as a 404.
            status, error = await _status(ctx, collection)
            if status is not None and not status.dense_available and "mode" not in arguments:
                arguments["mode"] = "bm25"  # the one mode that works here (the form shows it)
        if error is None and submitted:
            response, error = await call_tool(tool, ctx, collection, arguments)
            response = serialize.model(response)  # a search's plain values: the model
        builder = _CONTEXT.get(tool.name) if tool in BUILTIN_TOOLS else None
        # The search form stays up beside its error, to correct the request.
        if builder is not None and (error is None or tool.name == "search"):
            extra = await builder(datasette, request, ctx, response, arguments, status)
        context = {
            "tool": tool,
            "collection": collection,
            "result": response,
            "error": error,
            "request_id": ctx.request_id,
            "arguments": arguments,
            "submitted": submitted,
            "reranker_configured": registry.reranker_configured,
            "status": status,
            "groundkit_css": static_url(datasette, "groundkit.css"),
            "groundkit_js": static_url(datasette, "groundkit.js"),
            "collections_url": datasette.urls.path(
                _tool_named("list_collections").path_for_html()),
            **extra,
        }
        html = await datasette.render_template(
            [tool.template or "groundkit_tool.html"], context, request=request
        )
        # Datasette's base template names no language; screen readers need one (WCAG 3.1.1).
        html = html.replace("<html>", '<html lang="en">', 1)
        code = error.status if error is not None else 200
        out = Response.html(html, status=code)
        out.headers["X-Request-ID"] = ctx.request_id
        if code == 503:
            from .service import BUSY_RETRY_AFTER

            out.headers["Retry-After"] = str(BUSY_RETRY_AFTER)
        return out

    view.__name__ = f"groundkit_{tool.name}_html"
    return view
