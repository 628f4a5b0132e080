"""The tool table inside the ``datasette-mcp`` plugin's ``/-/mcp`` server.

datasette-mcp calls the ``register_mcp_tools(datasette, mcp)`` hook with its
``MCPServer``; every row of ``all_tools()`` is added there as
``groundkit_<name>``, with the schemas (``mcp_schema.py``), results and errors
(``mcp_server.py``) of our own MCP server. Without datasette-mcp nobody calls the hook:
pluggy keeps an implementation that has no spec and never runs it, and nothing here
imports the SDK.
"""

# No ``from __future__ import annotations``: the SDK reads the handler's annotations,
# and ``Context`` is only imported inside the function that defines it.

import functools
import logging
import uuid
from typing import Any

from datasette import hookimpl

log = logging.getLogger("groundkit.mcp")

PREFIX = "groundkit_"
SURFACE = "datasette-mcp"


@functools.cache
def _pass_through_model():
    """An SDK argument model that takes any arguments and hands them on untouched.

    The SDK would otherwise validate them first and answer a mistake in its own
    words; validation belongs to ``service.call_tool`` and the shared mapping.
    """
    from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase
    from pydantic import ConfigDict

    class PassThroughArguments(ArgModelBase):
        model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)

        def model_dump_one_level(self) -> dict[str, Any]:
            return {"arguments": dict(self.model_extra or {})}

    return PassThroughArguments


def _request_scope(ctx) -> dict | None:
    """The ASGI scope of the HTTP request carrying this call, or None (no HTTP request)."""
    try:
        request = ctx.request_context.request
    except (AttributeError, ValueError):  # called in-process, outside any request
        return None
    scope = getattr(request, "scope", None)
    return scope if isinstance(scope, dict) else None


async def _refused(datasette, scope: dict):
    """The instance boundary's rules, asked again for a call through ``/-/mcp`` (the ASGI
    guard already decided the request; a tool call re-checks, in case a session outlives a
    settings change). ErrorInfo or None."""
    from ..security.boundary import refusal
    from .service import ErrorInfo, settings_for

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    refused, _ = await refusal(datasette, settings_for(datasette), scope, receive)
    return None if refused is None else ErrorInfo(*refused)


def _handler(datasette, tool):
    from mcp.server.mcpserver import Context

    from .mcp_server import answer_call, error_result
    from .service import ErrorInfo

    async def call(arguments: dict, ctx: Context):
        scope = _request_scope(ctx)
        actor = None
        if scope is not None:
            try:
                error = await _refused(datasette, scope)
            except Exception as exc:  # a fixed text for the caller; details only in the log
                log.error("datasette-mcp %s: access check failed", tool.name, exc_info=exc)
                error = ErrorInfo(500, "internal_error", "internal error")
            if error is not None:
                return error_result(error, uuid.uuid4().hex)
            actor = scope.get("actor")  # Datasette sets it on every request's scope
            actor = actor if isinstance(actor, dict) else None
        return await answer_call(datasette, tool, arguments, actor, SURFACE)

    return call


def add_tool(mcp, datasette, tool) -> None:
    """Add one table tool to datasette-mcp's ``MCPServer`` as ``groundkit_<name>``."""
    from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata

    from .mcp_schema import READ_ONLY, input_schema, output_schema

    name = PREFIX + tool.name
    # Private, and pinned to the minor tested (pyproject.toml): in mcp 2.3 no public MCPServer
    # API takes a ready-made schema or hands back a registered tool (adr/0058).
    manager = mcp._tool_manager
    if manager.get_tool(name) is not None:
        log.warning("datasette-mcp already has a tool %r; groundkit's is not added", name)
        return
    mcp.add_tool(
        _handler(datasette, tool), name=name, description=tool.summary,
        annotations=READ_ONLY, structured_output=False,
    )
    registered = manager.get_tool(name)
    # The schemas our own server lists. No output model: results pass as answer_call built them.
    registered.parameters = input_schema(tool)
    registered.fn_metadata = FuncMetadata(
        arg_model=_pass_through_model(), output_schema=output_schema(tool)
    )


@hookimpl
def register_mcp_tools(datasette, mcp):
    """datasette-mcp's hook: every groundkit tool on its server."""
    from .tools import all_tools

    for tool in all_tools():
        add_tool(mcp, datasette, tool)
