"""The OpenAPI 3.1 document is generated from the tool table and agrees with the routes."""

import json
import sys
from pathlib import Path

import pytest
from datasette.app import Datasette
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from groundkit_datasette import registry as gk_registry
from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.surfaces.tools import all_tools

sys.path.insert(0, str(Path(__file__).parent / "plugins"))
import word_count  # noqa: E402

DOC = "urn:groundkit-openapi"


@pytest.fixture
def collection(corpus, index_dir):
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    return index_dir / "energy.sqlite3"


def make_ds(collection, corpus):
    return Datasette(files=[], immutables=[str(collection)],
                     metadata={"plugins": {"groundkit": {"base_dir": str(corpus)}}})


def validator(doc, component):
    """A JSON Schema validator for one component, its $refs resolved inside the document."""
    registry = Registry().with_resource(DOC, Resource.from_contents(
        doc, default_specification=DRAFT202012))
    schema = doc["components"]["schemas"][component]
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator({"$ref": f"{DOC}#/components/schemas/{component}"},
                                registry=registry)


def ref_name(schema):
    return schema["$ref"].rsplit("/", 1)[1]


async def fetch_doc(ds):
    r = await ds.client.get("/-/groundkit/openapi.json")
    assert r.status_code == 200
    return r.json()


async def test_every_operation_of_the_table_is_in_the_document(collection, corpus):
    gk_registry.pm.register(word_count, name="word_count")
    try:
        tools = all_tools()
        doc = await fetch_doc(make_ds(collection, corpus))
    finally:
        gk_registry.pm.unregister(name="word_count")
    assert doc["openapi"] == "3.1.0"
    ids = [op["operationId"] for item in doc["paths"].values() for k, op in item.items()
           if k in ("get", "post")]
    assert len(ids) == len(set(ids))
    for tool in tools:
        item = doc["paths"][tool.json_route]
        assert "get" in item  # GET everywhere; POST tools also take a JSON body
        if tool.method == "POST":
            body = item["post"]["requestBody"]["content"]["application/json"]["schema"]
            assert ref_name(body) == tool.request_model.__name__
            assert item["post"]["operationId"] == tool.name
        else:
            assert "post" not in item and item["get"]["operationId"] == tool.name
        ok = item["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert ref_name(ok) == tool.response_model.__name__
        names = {p["name"] for p in item["parameters"]}
        assert names == ({"collection"} if tool.scope == "collection" else set()) | set(
            tool.path_params)
    assert "word_count" in ids
    for tool in tools:
        validator(doc, tool.request_model.__name__)
        validator(doc, tool.response_model.__name__)


SEARCH_EXAMPLES_VALID = [
    {"query": "batteries"},
    {"query": "batteries", "mode": "bm25", "top_k": 3, "source": "solar"},
    {"query": "wind", "top_k": 50, "rerank": False, "document_id": "d"},
]
SEARCH_EXAMPLES_INVALID = [
    {},
    {"query": ""},
    {"query": "x", "top_k": 0},
    {"query": "x", "top_k": 51},
    {"query": "x", "mode": "semantic"},
    {"query": "x", "unknown": 1},
    {"query": "x", "vector": ["a"]},
]


async def test_example_requests_agree_with_the_schema_and_the_route(collection, corpus):
    ds = make_ds(collection, corpus)
    doc = await fetch_doc(ds)
    request_schema = validator(doc, "SearchRequest")
    response_schema = validator(doc, "SearchResponse")
    for example in SEARCH_EXAMPLES_VALID:
        request_schema.validate(example)
        r = await ds.client.post("/energy/-/groundkit/search.json", content=json.dumps(example),
                                 headers={"content-type": "application/json"})
        assert r.status_code == 200, (example, r.text)
        response_schema.validate(r.json())
    for example in SEARCH_EXAMPLES_INVALID:
        with pytest.raises(ValidationError):
            request_schema.validate(example)
        r = await ds.client.post("/energy/-/groundkit/search.json", content=json.dumps(example),
                                 headers={"content-type": "application/json"})
        assert r.status_code == 422, (example, r.text)
        validator(doc, "Error").validate(r.json())


async def test_every_documented_operation_answers(collection, corpus):
    """Each path and method in the document, called with its required parameters, answers 200
    with a body matching the documented response."""
    ds = make_ds(collection, corpus)
    doc = await fetch_doc(ds)
    hit = (await ds.client.get("/energy/-/groundkit/search.json?query=wind")).json()["hits"][0]
    values = {"collection": "energy", "chunk_id": hit["chunk_id"], "query": "wind",
              "document_id": hit["document_id"],
              "quotes": ["wind"]}
    for route, item in doc["paths"].items():
        path = route.format(**values)
        for method in ("get", "post"):
            op = item.get(method)
            if op is None:
                continue
            required = {p["name"]: values[p["name"]] for p in op.get("parameters", [])
                        if p["required"]}
            if method == "get":
                r = await ds.client.get(path, params=required)
            else:
                # The body holds the required fields, as the GET's query parameters do.
                fields = {p["name"]: values[p["name"]] for p in item["get"]["parameters"]
                          if p["required"]}
                r = await ds.client.post(path, content=json.dumps(fields),
                                         headers={"content-type": "application/json"})
            assert r.status_code == 200, (method, route, r.text)
            schema = op["responses"]["200"]["content"]["application/json"]["schema"]
            if "$ref" in schema:
                validator(doc, ref_name(schema)).validate(r.json())
            else:
                Draft202012Validator(schema).validate(r.json())


async def test_get_query_parameters_are_documented_as_the_request_fields(collection, corpus):
    doc = await fetch_doc(make_ds(collection, corpus))
    params = {p["name"]: p for p in doc["paths"]["/{collection}/-/groundkit/search.json"]
              ["get"]["parameters"]}
    assert set(params) == {"query", "mode", "top_k", "rerank", "source", "document_id", "vector",
                           "offset", "group_by_document", "min_score"}
    assert params["query"]["required"] is True and params["top_k"]["required"] is False
    assert params["vector"]["explode"] is True and params["top_k"]["schema"]["maximum"] == 50
    chunk = doc["paths"]["/{collection}/-/groundkit/chunks/{chunk_id}.json"]["get"]
    assert chunk["parameters"] == []  # chunk_id is a path parameter, not a query one


async def test_health_answers_without_opening_any_collection(collection, corpus):
    ds = make_ds(collection, corpus)
    r = await ds.client.get("/-/groundkit/health")
    assert r.status_code == 200 and r.json() == {"ok": True}
    assert ds._groundkit_registry._open == {}
    collection.unlink()  # nothing read: it still answers
    assert (await ds.client.get("/-/groundkit/health")).json() == {"ok": True}
    assert (await ds.client.post("/-/groundkit/health")).status_code in (403, 405)


async def test_health_and_openapi_sit_behind_the_instance_boundary(collection, corpus):
    """A probe on loopback answers; a rebound Host is refused like every other route."""
    ds = make_ds(collection, corpus)
    for path in ("/-/groundkit/health", "/-/groundkit/openapi.json"):
        assert (await ds.client.get(path, headers={"host": "localhost:8001"})).status_code == 200
        refused = await ds.client.get(path, headers={"host": "evil.example"})
        assert refused.status_code == 403 and "ok\": true" not in refused.text
