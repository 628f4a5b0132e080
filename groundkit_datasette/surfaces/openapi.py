"""The JSON API described as OpenAPI 3.1, generated from the tool table.

Nothing here is written by hand per operation: each tool contributes its route,
its method(s), its request model (as a JSON body for POST, as query parameters
for GET) and its response model. Pydantic's JSON Schema is draft 2020-12, the
dialect OpenAPI 3.1 uses, so the models' schemas go in unchanged.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from pydantic.json_schema import models_json_schema

from ..indexing.names import NAME_PATTERN
from .tools import Tool

REF = "#/components/schemas/{model}"

ERROR_SCHEMA = {
    "type": "object",
    "title": "Error",
    "description": "Every refusal has this shape; detail never repeats the caller's input.",
    "properties": {
        "ok": {"const": False},
        "error": {"type": "string", "description": "A stable error kind (see docs/api.md)."},
        "detail": {"type": "string"},
        "request_id": {"type": "string"},
    },
    "required": ["ok", "error", "detail", "request_id"],
}

_ERROR_STATUSES = {
    "400": "Invalid request (bad collection name, dense search unavailable, bad vector)",
    "404": "Collection or chunk not found (or not readable by this caller)",
    "405": "Method not allowed",
    "409": "The collection cannot answer (embedder mismatch, index inconsistent, schema mismatch)",
    "413": "Request body too large",
    "422": "The request does not match the model (unknown or ill-typed fields)",
    "501": "Reranking requested but no reranker is configured",
    "502": "An upstream model service failed",
    "503": "Too many searches at once; retry after the Retry-After seconds",
}


def _package_version() -> str:
    try:
        return version("groundkit-datasette")
    except PackageNotFoundError:
        return "0"


def openapi_path(route: str) -> str:
    return route  # the table's {param} syntax is OpenAPI's


def _schemas(tools) -> tuple[dict, dict]:
    """Component schemas and ``{(model, mode): schema-with-$ref}`` for every model in the table."""
    pairs = []
    for tool in tools:
        pairs.append((tool.request_model, "validation"))
        pairs.append((tool.response_model, "serialization"))
    refs, top = models_json_schema(list(dict.fromkeys(pairs)), ref_template=REF)
    components = dict(top.get("$defs", {}))
    components["Error"] = ERROR_SCHEMA
    return refs, components


def _responses(tool: Tool, refs: dict) -> dict:
    ok = refs[(tool.response_model, "serialization")]
    out = {"200": {"description": tool.summary, "content": {"application/json": {"schema": ok}}}}
    error = {"application/json": {"schema": {"$ref": REF.format(model="Error")}}}
    for status, text in _ERROR_STATUSES.items():
        out[status] = {"description": text, "content": error}
    out["503"]["headers"] = {"Retry-After": {"schema": {"type": "integer"}}}
    return out


def _path_parameters(tool: Tool, components: dict) -> list[dict]:
    params = []
    if tool.scope == "collection":
        params.append({
            "name": "collection", "in": "path", "required": True,
            "description": "Collection name (a Datasette database served by groundkit).",
            "schema": {"type": "string", "pattern": NAME_PATTERN.pattern},
        })
    model_schema = components.get(tool.request_model.__name__, {})
    for name in tool.path_params:
        schema = dict(model_schema.get("properties", {}).get(name, {"type": "string"}))
        params.append({"name": name, "in": "path", "required": True, "schema": schema})
    return params


def _query_parameters(tool: Tool, components: dict) -> list[dict]:
    model_schema = components.get(tool.request_model.__name__, {})
    required = set(model_schema.get("required", []))
    params = []
    for name, schema in model_schema.get("properties", {}).items():
        if name in tool.path_params:
            continue
        param = {"name": name, "in": "query", "required": name in required, "schema": schema}
        if schema.get("description"):
            param["description"] = schema["description"]
        if "array" in str(schema.get("type", "")) or any(
            s.get("type") == "array" for s in schema.get("anyOf", [])
        ):
            param.update(style="form", explode=True)  # vector=0.1&vector=0.2
        params.append(param)
    return params


def openapi_document(tools, settings=None) -> dict:
    """The OpenAPI 3.1 document for ``tools`` (the table this server serves)."""
    refs, components = _schemas(tools)
    paths: dict[str, dict] = {}
    for tool in tools:
        item = paths.setdefault(openapi_path(tool.json_route), {})
        item["parameters"] = _path_parameters(tool, components)
        get = {
            "operationId": tool.name if tool.method == "GET" else f"{tool.name}_get",
            "summary": tool.summary,
            "parameters": _query_parameters(tool, components),
            "responses": _responses(tool, refs),
        }
        item["get"] = get
        if tool.method == "POST":
            item["post"] = {
                "operationId": tool.name,
                "summary": tool.summary,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {
                        "schema": refs[(tool.request_model, "validation")]}},
                },
                "responses": _responses(tool, refs),
            }
    paths["/-/groundkit/health"] = {"get": {
        "operationId": "health",
        "summary": "Liveness probe: answers without reading any collection.",
        "responses": {"200": {"description": "The server is up", "content": {"application/json": {
            "schema": {"type": "object", "properties": {"ok": {"const": True}},
                       "required": ["ok"]}}}}},
    }}
    description = "The groundkit JSON API (see docs/api.md). Every operation is read-only."
    if settings is not None:
        description += (
            f" This server's limits: top_k at most {settings.max_top_k}, query at most "
            f"{settings.max_query_chars} characters, body at most {settings.max_body_bytes} bytes."
        )
    return {
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {"title": "groundkit", "version": _package_version(), "description": description},
        "paths": paths,
        "components": {"schemas": components},
    }
