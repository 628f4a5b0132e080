"""Issue 37, items 1-3: the CLI and the API tell the truth in a new user's first hour.

Junk queries are flagged or refused alike on every surface, ``serve`` binds before it
announces a URL, and error messages say what is actually wrong.
"""

import json
import socket
import sqlite3
import subprocess
import sys

import pytest
from click.testing import CliRunner
from datasette.app import Datasette
from pydantic import ValidationError

from groundkit_datasette.cli import cli
from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.retrieval.models import SearchRequest, readable_message
from groundkit_datasette.surfaces.service import map_exception


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def groundkit(*args):
    return [sys.executable, "-m", "groundkit_datasette.cli", *map(str, args)]


@pytest.fixture
def collection(corpus, index_dir):
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    return index_dir / "energy.sqlite3"


@pytest.fixture
def ds(collection, corpus):
    return Datasette(files=[], immutables=[str(collection)],
                     metadata={"plugins": {"groundkit": {"base_dir": str(corpus)}}})


# -- 1. junk queries ------------------------------------------------------------------


def test_the_cli_says_when_no_chunk_holds_a_query_word(collection):
    index = collection.parent
    plain = run("search", "energy", "quokka xylophonist", "--index-dir", index)
    assert plain.exit_code == 0
    assert plain.stderr.startswith("Note: No chunk you can read contains any of the query's words")
    assert "Note:" not in plain.stdout
    as_json = json.loads(run("search", "energy", "quokka xylophonist", "--index-dir", index,
                             "--json").stdout)
    assert as_json["lexical_match"] is False and as_json["note"]
    found = run("search", "energy", "solar", "--index-dir", index)
    assert found.exit_code == 0 and "Note:" not in found.stderr


@pytest.mark.parametrize("text", [" ", "   ", "\t\n "])
def test_a_query_of_only_whitespace_is_refused_by_the_cli(collection, text):
    result = run("search", "energy", text, "--index-dir", collection.parent)
    assert result.exit_code == 2
    assert "Error: QUERY must not be empty" in result.stderr
    assert "Value error" not in result.stderr and "Traceback" not in result.stderr


async def test_a_query_of_only_whitespace_is_a_422_on_the_json_api(ds):
    r = await ds.client.get("/energy/-/groundkit/search.json?query=%20%20%20")
    assert r.status_code == 422
    assert r.json()["detail"] == "query: must not be empty"
    r = await ds.client.post("/energy/-/groundkit/search.json", content=json.dumps({"query": "  "}),
                             headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"] == "query: must not be empty"


def test_the_shared_error_mapping_used_by_json_and_mcp_refuses_whitespace():
    with pytest.raises(ValidationError) as caught:
        SearchRequest(query="   ")
    error = map_exception(caught.value)
    assert (error.status, error.detail) == (422, "query: must not be empty")


# -- 2. serve binds before it announces -------------------------------------------------


def test_serve_on_a_busy_port_is_one_line_and_exit_2_without_a_url(collection):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(groundkit("serve", collection, "--port", port),
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"Error: port {port} on 127.0.0.1 is in use\n"
    assert "Serving" not in result.stdout and "http://" not in result.stdout


# -- 3. messages that say what is wrong -------------------------------------------------


def test_serve_on_a_missing_directory_says_it_is_missing(tmp_path):
    missing = tmp_path / "nowhere"
    for args in ([missing], ["--index-dir", missing]):
        result = subprocess.run(groundkit("serve", *args, "--port", 1),
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 2
        assert f"Error: {missing}: no such file or directory" in result.stderr
        assert "invalid collection name" not in result.stderr


def test_search_on_a_plain_sqlite_file_says_it_is_not_a_collection(tmp_path):
    plain = tmp_path / "plain.sqlite3"
    sqlite3.connect(plain).execute("CREATE TABLE t (x)").connection.close()
    for args in ([plain], ["plain", "--index-dir", tmp_path]):
        result = run("search", *args[:1], "x", *args[1:])
        assert result.exit_code == 1
        assert result.stderr == f"Error: {plain} is not a groundkit collection (no groundkit tables in it)\n"


def test_collections_in_a_missing_directory_is_an_error(tmp_path):
    missing = tmp_path / "nonexistent"
    for extra in ([], ["--json"]):
        result = run("collections", "--index-dir", missing, *extra)
        assert result.exit_code == 1
        assert result.stderr == f"Error: index directory not found: {missing}\n"
        assert result.stdout == ""


async def test_an_unknown_query_parameter_is_named_with_a_suggestion(ds):
    r = await ds.client.get("/energy/-/groundkit/search.json?q=solar")
    assert r.status_code == 422
    assert r.json()["detail"] == "unknown query parameter: q (did you mean query?)"
    r = await ds.client.get("/energy/-/groundkit/search.json?query=solar&topk=3")
    assert r.json()["detail"] == "unknown query parameter: topk (did you mean top_k?)"
    r = await ds.client.get("/energy/-/groundkit/search.json?query=solar&zzz=1")
    detail = r.json()["detail"]
    # A name that is no likely slip is not repeated back: the route's parameters are named.
    assert detail.startswith("unknown query parameter: the parameters are query, mode, top_k")
    assert "zzz" not in detail
    r = await ds.client.get("/energy/-/groundkit/status.json?zzz=1")
    assert r.json()["detail"] == "unknown query parameter: this route takes none"
    r = await ds.client.get(
        "/energy/-/groundkit/chunks/c_000000000000000000000000.json?chunk_id=x")
    assert r.json()["detail"] == "chunk_id is part of the path, not a query parameter"


async def test_validator_text_reaches_users_without_pydantics_prefix(ds, collection):
    r = await ds.client.get("/energy/-/groundkit/search.json?query=solar&mode=nope")
    assert r.status_code == 422
    assert r.json()["detail"] == "mode: mode must be one of: bm25, dense, hybrid"
    assert readable_message({"msg": "Value error, mode must be one of: bm25"}) == \
        "mode must be one of: bm25"
    assert readable_message({"msg": "String should have at least 1 character"}) == \
        "String should have at least 1 character"
