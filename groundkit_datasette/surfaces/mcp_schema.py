"""What MCP clients are told about the tool table: one MCP tool definition per row of
``tools.all_tools()``, its argument model and its schemas.

Shared by our own server (``mcp_server.build_server``) and the datasette-mcp bridge, so a
tool looks the same on ``groundkit mcp``, ``/-/groundkit/mcp`` and ``/-/mcp``.
"""

from __future__ import annotations

import mcp_types as types
from pydantic import BaseModel, ConfigDict, Field, create_model

from ..indexing.names import NAME_PATTERN
from .tools import Tool

READ_ONLY = types.ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)

INSTRUCTIONS = (
    "Search private document collections and cite them. Call list_collections, then search "
    "with a collection name; every hit carries source, line range and chunk_id. Cite hits as "
    "source:line_start-line_end and use fetch_chunk to re-verify a citation against the source."
)

_COLLECTION_FIELD = Field(
    description="Collection name, from list_collections.",
    min_length=1,
    max_length=64,
    pattern=NAME_PATTERN.pattern,
)


def arguments_model(tool: Tool) -> type[BaseModel]:
    """The model an MCP caller's arguments follow: the request model, plus ``collection``
    for collection tools (the JSON API takes it from the URL instead)."""
    if tool.scope != "collection":
        return tool.request_model
    return create_model(
        f"{tool.request_model.__name__}Arguments",
        __base__=tool.request_model,
        collection=(str, _COLLECTION_FIELD),
    )


class CollectionArgument(BaseModel):
    """Only to word a missing or non-string ``collection`` the way pydantic words any other field."""

    model_config = ConfigDict(strict=True)
    collection: str


def input_schema(tool: Tool) -> dict:
    schema = arguments_model(tool).model_json_schema()
    schema["additionalProperties"] = False  # the table's request models forbid extra fields
    return schema


def output_schema(tool: Tool) -> dict:
    return tool.response_model.model_json_schema(mode="serialization")


def mcp_tool(tool: Tool) -> types.Tool:
    return types.Tool(
        name=tool.name,
        description=tool.summary,
        input_schema=input_schema(tool),
        output_schema=output_schema(tool),
        annotations=READ_ONLY,
    )
