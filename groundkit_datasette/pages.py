"""HTML pages: each is a rendering of one tool-table operation."""

from __future__ import annotations

from datasette.utils.asgi import Response

from .service import ToolContext, call_tool
from .tools import Tool

_FORM_FIELDS = {"q": "query", "mode": "mode", "top_k": "top_k", "rerank": "rerank",
                "source": "source"}


def _arguments(tool: Tool, request) -> tuple[dict, bool]:
    """Request arguments from the page's query string; ``False`` when the form was not submitted."""
    args = {}
    if tool.name == "search":
        for param, field in _FORM_FIELDS.items():
            value = request.args.get(param)
            if value not in (None, ""):
                args[field] = value
        if "rerank" in args:
            args["rerank"] = args["rerank"] in ("1", "on", "true")
        if "top_k" in args:
            try:
                args["top_k"] = int(args["top_k"])
            except ValueError:
                pass
        return args, "query" in args
    return args, True


def html_view(tool: Tool):
    async def view(datasette, request):
        from .plugin import registry_for

        registry = registry_for(datasette)
        ctx = ToolContext(registry, request.actor, "html")
        collection = request.url_vars.get("collection")
        arguments, submitted = _arguments(tool, request)
        for param in tool.path_params:
            arguments[param] = request.url_vars[param]
        response = error = None
        if submitted:
            response, error = await call_tool(tool, ctx, collection, arguments)
        context = {
            "tool": tool,
            "collection": collection,
            "result": response,
            "error": error,
            "request_id": ctx.request_id,
            "arguments": arguments,
            "reranker_configured": registry.reranker_configured,
        }
        if tool.scope == "collection" and error is None and collection:
            context["status"] = None
        html = await datasette.render_template(
            [tool.template or "groundkit_tool.html"], context, request=request
        )
        status = error.status if error is not None else 200
        out = Response.html(html, status=status)
        out.headers["X-Request-ID"] = ctx.request_id
        return out

    view.__name__ = f"groundkit_{tool.name}_html"
    return view
