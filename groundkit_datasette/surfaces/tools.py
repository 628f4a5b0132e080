"""The one tool table: every operation, declared once, rendered as JSON routes, HTML pages and MCP tools.

Nothing registers a route or an MCP tool by hand; ``plugin.py`` and
``mcp_server.py`` iterate over :func:`all_tools`. Other plugins add operations
with the ``register_tools`` hook.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Literal

from pydantic import BaseModel

from ..retrieval.models import (
    ChunkResponse,
    CollectionsResponse,
    DocumentResponse,
    FetchChunkRequest,
    FetchDocumentRequest,
    IndexStatus,
    ListCollectionsRequest,
    PlainResponse,
    SearchRequest,
    SearchResponse,
    StatusRequest,
)

from ..retrieval.quotes import VerifyQuoteRequest, VerifyQuoteResponse

_PARAM = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class PageAsset:
    """A file one tool's page shows (a PDF page image on the chunk page), served beside the
    page under its own route. Not an operation: it has no JSON or MCP form, but it is listed
    in the table so that every route the plugin serves is (adr/0027)."""

    route: str
    view: Callable[["Tool"], Callable]
    # ``{param}`` -> the regex it must match (default: one path segment).
    patterns: tuple[tuple[str, str], ...] = ()

    def regex(self) -> str:
        patterns = dict(self.patterns)
        out, pos = "^", 0
        for m in _PARAM.finditer(self.route):
            pattern = patterns.get(m.group(1), "[^/]+?")
            out += re.escape(self.route[pos : m.start()]) + f"(?P<{m.group(1)}>{pattern})"
            pos = m.end()
        return out + re.escape(self.route[pos:]) + "$"


@dataclass(frozen=True)
class Tool:
    name: str
    summary: str
    request_model: type[BaseModel]
    response_model: type[BaseModel]
    # A response model, or a PlainResponse (its JSON values; the built-in search: adr/0038).
    handler: Callable[..., Awaitable[BaseModel | PlainResponse]]
    scope: Literal["instance", "collection"]
    json_route: str
    html_route: str | None = None
    method: Literal["GET", "POST"] = "GET"
    # Read-only is a type, not a flag: the table refuses any other value.
    read_only: Literal[True] = True
    template: str | None = None
    page_assets: tuple[PageAsset, ...] = ()
    path_params: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self):
        if self.read_only is not True:
            raise ValueError(f"tool {self.name!r}: every groundkit operation is read-only")
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", self.name):
            raise ValueError(f"tool name {self.name!r} must be snake_case")
        params = tuple(_PARAM.findall(self.json_route))
        if (self.scope == "collection") != ("collection" in params):
            raise ValueError(f"tool {self.name!r}: collection tools route on {{collection}}")
        fields = set(self.request_model.model_fields)
        for p in params:
            if p != "collection" and p not in fields:
                raise ValueError(f"tool {self.name!r}: path parameter {p!r} is not a request field")
        object.__setattr__(self, "path_params", tuple(p for p in params if p != "collection"))

    @staticmethod
    def route_regex(route: str) -> str:
        """``/{collection}/x/{chunk_id}.json`` -> an anchored regex with named groups."""
        out, pos = "^", 0
        for m in _PARAM.finditer(route):
            out += re.escape(route[pos : m.start()]) + f"(?P<{m.group(1)}>[^/]+?)"
            pos = m.end()
        return out + re.escape(route[pos:]) + "$"

    def path(self, route: str | None = None, **params) -> str:
        route = route or self.json_route
        return _PARAM.sub(lambda m: str(params[m.group(1)]), route)

    def path_for_html(self, **params) -> str:
        return self.path(self.html_route, **params)


# -- the built-in operations --------------------------------------------------


def _page_image_view(tool):
    from .page_images import page_image_view

    return page_image_view(tool)


# The page image of a PDF citation (surfaces/page_images.py; the view checks the page number).
PAGE_IMAGE = PageAsset("/{collection}/-/groundkit/chunks/{chunk_id}/pages/{page}.png",
                       _page_image_view)


async def _list_collections(ctx, collection, request):
    return CollectionsResponse(collections=await ctx.visible_collections())


async def _index_status(ctx, collection, request):
    col = await ctx.collection(collection)
    return await ctx.run(ctx.scoped(col).status)


async def _search(ctx, collection, request):
    """The response as plain values (a ``PlainResponse``): the JSON API and MCP write them as
    they are; the HTML page asks for the model (surfaces/serialize.py)."""
    from ..retrieval.search import search_plain

    col = await ctx.collection(collection)
    scoped = ctx.scoped(col)
    # In a worker thread like every call: the event loop was no faster (adr/0058).
    return await ctx.run(lambda: search_plain(col, request, scoped.access()))


async def _verify_quote(ctx, collection, request):
    from ..retrieval.quotes import verify_quotes

    col = await ctx.collection(collection)
    return await ctx.run(verify_quotes, col, ctx.scoped(col), request)


async def _fetch_chunk(ctx, collection, request):
    col = await ctx.collection(collection)
    return await ctx.run(ctx.scoped(col).fetch_chunk, request.chunk_id)


async def _fetch_document(ctx, collection, request):
    from ..retrieval.documents import fetch_document

    col = await ctx.collection(collection)
    scoped = ctx.scoped(col)

    def read():
        access = scoped.access()  # a document the caller may not read is not found
        return fetch_document(col, request.document_id,
                              access.hidden_documents if access is not None else ())

    return await ctx.run(read)


BUILTIN_TOOLS = (
    Tool(
        name="list_collections",
        summary="List the document collections this caller may read.",
        request_model=ListCollectionsRequest,
        response_model=CollectionsResponse,
        handler=_list_collections,
        scope="instance",
        json_route="/-/groundkit/collections.json",
        html_route="/-/groundkit",
        template="groundkit_collections.html",
    ),
    Tool(
        name="index_status",
        summary="Counts, embedding model, dense availability and generation of one collection.",
        request_model=StatusRequest,
        response_model=IndexStatus,
        handler=_index_status,
        scope="collection",
        json_route="/{collection}/-/groundkit/status.json",
        html_route="/{collection}/-/groundkit",
        template="groundkit_status.html",
    ),
    Tool(
        name="search",
        summary="Search a collection (bm25, dense or hybrid, optional rerank); hits carry exact citations.",
        request_model=SearchRequest,
        response_model=SearchResponse,
        handler=_search,
        scope="collection",
        method="POST",
        json_route="/{collection}/-/groundkit/search.json",
        html_route="/{collection}/-/groundkit/search",
        template="groundkit_search.html",
    ),
    Tool(
        name="fetch_chunk",
        summary="Fetch a chunk by id and verify its citation against the current source.",
        request_model=FetchChunkRequest,
        response_model=ChunkResponse,
        handler=_fetch_chunk,
        scope="collection",
        json_route="/{collection}/-/groundkit/chunks/{chunk_id}.json",
        html_route="/{collection}/-/groundkit/chunks/{chunk_id}",
        template="groundkit_chunk.html",
        page_assets=(PAGE_IMAGE,),
    ),
    Tool(
        name="fetch_document",
        summary="Fetch a whole document by id: its chunks in order, its headings, and whether "
                "its source file changed since ingest.",
        request_model=FetchDocumentRequest,
        response_model=DocumentResponse,
        handler=_fetch_document,
        scope="collection",
        json_route="/{collection}/-/groundkit/documents/{document_id}.json",
        html_route="/{collection}/-/groundkit/documents/{document_id}",
        template="groundkit_document.html",
    ),
    Tool(
        name="verify_quote",
        summary="Check quotes against the current sources: verbatim, after normalising, or "
                "approximately; each answer gives the source, offsets, lines, pages and context.",
        request_model=VerifyQuoteRequest,
        response_model=VerifyQuoteResponse,
        handler=_verify_quote,
        scope="collection",
        method="POST",
        json_route="/{collection}/-/groundkit/verify-quote.json",
        html_route="/{collection}/-/groundkit/verify-quote",
        template="groundkit_verify_quote.html",
    ),
)


def all_tools() -> tuple[Tool, ...]:
    """The built-ins plus every tool added through the ``register_tools`` hook."""
    from ..registry import pm, _load_builtins

    _load_builtins()
    tools = list(BUILTIN_TOOLS)

    def register(tool):
        if not isinstance(tool, Tool):
            raise TypeError("register_tools: register() takes a groundkit_datasette.surfaces.tools.Tool")
        tools.append(tool)

    pm.hook.register_tools(register=register)
    seen_names, seen_routes = set(), set()
    for tool in tools:
        routes = {tool.json_route, tool.html_route, *(a.route for a in tool.page_assets)} - {None}
        if tool.name in seen_names or routes & seen_routes:
            raise ValueError(f"tool {tool.name!r} duplicates a name or route already in the table")
        seen_names.add(tool.name)
        seen_routes |= routes
    return tuple(tools)
