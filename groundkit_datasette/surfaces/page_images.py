"""The chunk page's PDF page images: ``/<collection>/-/groundkit/chunks/<chunk_id>/pages/<n>.png``.

A page asset of the ``fetch_chunk`` tool (adr/0027), reached like the page itself: behind the
instance boundary (Host, Origin, authentication), the collection through the registry
(Datasette's view permissions), the chunk through the caller's document permissions (a
hidden chunk answers as a missing one). Errors are the one error body, as JSON, or as a
small HTML page when a person opened the image's address in a tab.
"""

from __future__ import annotations

import logging
import re
import time

from datasette.utils.asgi import Response

from .service import BUSY_RETRY_AFTER, RequestRejected, ToolContext, log_call, map_exception
from .static_files import static_url

ASSET_NAME = "fetch_chunk_page_image"  # its name in the access log
log = logging.getLogger("groundkit")
PAGE_NUMBER = re.compile(r"[1-9][0-9]{0,5}")


def _wants_html(request) -> bool:
    accept = request.headers.get("accept", "")
    return "text/html" in accept and not accept.startswith("image/")


async def _error_response(datasette, request, ctx, tool, error):
    headers = {"X-Request-ID": ctx.request_id, "Cache-Control": "no-store"}
    if error.status == 503:
        headers["Retry-After"] = str(BUSY_RETRY_AFTER)
    if _wants_html(request):
        html = await datasette.render_template(["groundkit_page_image_error.html"], {
            "error": error, "request_id": ctx.request_id,
            "collection": request.url_vars.get("collection"),
            "groundkit_css": static_url(datasette, "groundkit.css"),
            "groundkit_js": static_url(datasette, "groundkit.js"),
            "chunk_url": datasette.urls.path(tool.path_for_html(
                collection=request.url_vars["collection"],
                chunk_id=request.url_vars["chunk_id"])) if error.status != 400 else None,
        }, request=request)
        html = html.replace("<html>", '<html lang="en">', 1)
        return Response.html(html, status=error.status, headers=headers)
    return Response.json(error.body(ctx.request_id), status=error.status, headers=headers)


def page_image_view(tool):
    async def view(datasette, request):
        from ..indexing.names import validate_name
        from ..retrieval.page_render import RenderBusy, chunk_page_image, render_bounded
        from .service import registry_for

        ctx = ToolContext(registry_for(datasette), request.actor, "html")
        started = time.perf_counter()
        name = request.url_vars["collection"]
        try:
            if request.method != "GET":
                raise RequestRejected(405, "method_not_allowed", "use GET for page images")
            validate_name(name)
            page = request.url_vars["page"]
            if not PAGE_NUMBER.fullmatch(page):
                raise RequestRejected(422, "malformed_request",
                                      "page: must be a page number from 1 to 999999")
            col = await ctx.collection(name)
            scoped = ctx.scoped(col)

            def render(deadline):
                access = scoped.access()
                hidden = access.hidden_documents if access is not None else ()
                return chunk_page_image(col, request.url_vars["chunk_id"],
                                        int(page), hidden, deadline)

            try:
                image = await render_bounded(render)
            except RenderBusy as exc:
                raise RequestRejected(503, "server_busy", str(exc)) from None
        except Exception as exc:
            error = map_exception(exc)
            if error.status == 500:  # a defect: server log only (pdfium failing is a 404)
                log.error("request %s: page image failed", ctx.request_id, exc_info=exc)
            log_call(ctx, ASSET_NAME, error.status, started)
            return await _error_response(datasette, request, ctx, tool, error)
        log_call(ctx, ASSET_NAME, 200, started, 1)
        return Response(image.png, status=200, content_type="image/png", headers={
            "X-Request-ID": ctx.request_id,
            # Corpus content: a browser keeps it for this reader only, and asks again.
            "Cache-Control": "private, no-cache",
        })

    view.__name__ = f"groundkit_{tool.name}_page_image"
    return view
