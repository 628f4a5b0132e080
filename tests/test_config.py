"""Configuration is checked when Datasette starts, and the server says truly what it can do."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from datasette.app import Datasette

from groundkit_datasette import registry as gk_registry
from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.surfaces.service import ConfigurationError, Settings

sys.path.insert(0, str(Path(__file__).parent / "plugins"))
from fixed_vectors import Embedders  # noqa: E402

PYTHON = sys.executable


def started(config, immutables=()):
    return Datasette(files=[], immutables=[str(p) for p in immutables],
                     metadata={"plugins": {"groundkit": config}})


@pytest.mark.parametrize(
    "config,words",
    [
        ({"reranker": "cross-encodr"}, "unknown reranker 'cross-encodr'; known rerankers:"),
        ({"embedder": "minilmm"}, "unknown embedder 'minilmm'; known embedders:"),
        ({"embedder": "minilm", "embedder_options": {"max_lenght": 64}},
         "unknown option(s): max_lenght"),
        ({"index_dri": "."}, "unknown groundkit plugin settings: index_dri"),
        ({"max_top_k": "10"}, "max_top_k must be an integer between 1 and 50"),
        ({"max_concurrent_searches": 0}, "max_concurrent_searches must be an integer at least 1"),
        ({"max_top_k": 51}, "max_top_k must be an integer between 1 and 50"),
        ({"allow_remote_access": "false"}, "allow_remote_access must be true or false"),
        ({"embedder_options": ["a"]}, "embedder_options must be a mapping"),
        ({"embedder": "minilm", "embedder_options": {"batch_size": "many"}},
         "batch_size must be an integer"),
        # The string "false" is false: plain http stays refused without allow_private.
        ({"embedder": "openai", "embedder_options": {
            "base_url": "http://127.0.0.1:9/v1", "model": "m", "allow_private": "false"}},
         "endpoint URL must use https"),
        ({"embedder": "openai", "embedder_options": {
            "base_url": "http://127.0.0.1:9/v1", "model": "m", "allow_private": "nope"}},
         "allow_private must be true or false"),
    ],
)
async def test_a_bad_setting_stops_startup_with_one_clear_message(config, words):
    ds = started(config)
    with pytest.raises(ConfigurationError) as error:
        await ds.invoke_startup()
    assert words in str(error.value)
    assert "Traceback" not in str(error.value)


async def test_a_missing_index_dir_stops_startup(tmp_path):
    ds = started({"index_dir": str(tmp_path / "idnex")})
    with pytest.raises(ConfigurationError, match="index_dir: directory not found"):
        await ds.invoke_startup()


async def test_typed_options_reach_the_embedder_as_booleans_and_numbers():
    ds = started({"embedder": "openai", "embedder_options": {
        "base_url": "http://127.0.0.1:9/v1", "model": "m", "allow_private": "true",
        "timeout": "12", "dimensions": "8"}})
    await ds.invoke_startup()
    embedder = ds._groundkit_registry._models()[0]
    assert embedder._endpoint.allow_private is True and embedder.timeout == 12.0
    assert embedder._dimensions == 8


def test_settings_default_to_todays_limits():
    s = Settings.from_config({})
    assert (s.max_body_bytes, s.max_top_k, s.max_query_chars) == (256 * 1024, 50, 4000)
    assert s.max_concurrent_searches == 8


def test_datasette_serve_exits_non_zero_with_the_message_and_no_traceback(tmp_path):
    """The real ``datasette`` command line: the start-up hook's error is one line."""
    meta = tmp_path / "metadata.json"
    meta.write_text(json.dumps({"plugins": {"groundkit": {"reranker": "cross-encodr"}}}))
    result = subprocess.run(
        [PYTHON, "-m", "datasette", "serve", "--memory", "-m", str(meta), "--get", "/"],
        capture_output=True, text=True, timeout=120, env={**os.environ},
    )
    assert result.returncode == 1, result.stderr
    assert "Error: groundkit plugin settings: unknown reranker 'cross-encodr'" in result.stderr
    assert "Traceback" not in result.stderr


# -- dense_available: what this server can do ------------------------------------------


@pytest.fixture
def vec_collection(tmp_path, corpus):
    gk_registry.pm.register(Embedders, name="fixed-embedders")
    index = tmp_path / "vec-index"
    ingest([corpus], collection="energy", index_dir=index, embedder="vec-a")
    yield index / "energy.sqlite3"
    gk_registry.pm.unregister(name="fixed-embedders")


async def test_dense_is_offered_only_when_this_server_can_embed(vec_collection, corpus):
    matching = started({"embedder": "vec-a", "base_dir": str(corpus)}, [vec_collection])
    status = (await matching.client.get("/energy/-/groundkit/status.json")).json()
    assert status["dense_available"] is True and status["dense_unavailable_reason"] is None

    other = started({"embedder": "vec-b", "base_dir": str(corpus)}, [vec_collection])
    status = (await other.client.get("/energy/-/groundkit/status.json")).json()
    assert status["dense_available"] is False
    assert "does not match" in status["dense_unavailable_reason"]
    assert status["embedding"]["model"] == "hash-a"  # the manifest is still reported

    # The page offers only BM25, and a bookmark without a mode answers with it.
    page = await other.client.get("/energy/-/groundkit/search?q=wind")
    assert page.status_code == 200, page.text
    assert '<option value="bm25" selected>' in page.text
    assert '<option value="hybrid" disabled>' in page.text
    assert '<option value="dense" disabled>' in page.text


async def test_an_embedder_this_server_does_not_have_is_not_offered(tmp_path, corpus):
    class Gone:
        @staticmethod
        @gk_registry.hookspecs.hookimpl
        def register_embedders(register):
            from fixed_vectors import HashEmbedder

            register("vec-gone", lambda: HashEmbedder("hash-gone"))

    gk_registry.pm.register(Gone, name="gone")
    try:
        ingest([corpus], collection="energy", index_dir=tmp_path / "i", embedder="vec-gone")
    finally:
        gk_registry.pm.unregister(name="gone")
    ds = started({"base_dir": str(corpus)}, [tmp_path / "i" / "energy.sqlite3"])
    status = (await ds.client.get("/energy/-/groundkit/status.json")).json()
    assert status["dense_available"] is False
    assert "no embedder 'vec-gone'" in status["dense_unavailable_reason"]
