"""The security boundary is the whole Datasette instance (adr/0011).

The routes are enumerated from a real Datasette with datasette-mcp installed, so a route
another plugin adds is probed without anyone listing it. Every route is asked, by GET and
by POST, as four attackers: a rebound Host, a forged Origin, an anonymous caller of a
published server, and a caller on a non-loopback socket of an unpublished one. No answer
may carry corpus text, a server path or a token hash. Positive controls show that the same
probes do read corpus text when they are allowed, so the test cannot pass vacuously.
"""

import json
import re

import httpx
import pytest
from datasette.app import Datasette

from groundkit_datasette.security.auth import hash_token
from groundkit_datasette.surfaces.datasette_compat import DATASETTE_1
from groundkit_datasette.indexing.ingest import ingest

from .conftest import write_corpus
from .test_datasette_mcp import mcp_client
from .test_mcp import Served

pytest.importorskip("datasette_mcp")

TOKEN = "boundary-test-token-0123456789"
CORPUS_WORDS = ("Photovoltaic", "Lithium-ion", "kinetic energy")
STATIC_ROUTE = re.compile(r"^\^?/(-/static|-/static-plugins|favicon)")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("boundary")
    corpus = write_corpus(root / "corpus")
    index_dir = root / "index"
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    chunk_id = json.loads(
        __import__("sqlite3").connect(index_dir / "energy.sqlite3")
        .execute("select json_group_array(chunk_id) from chunks").fetchone()[0]
    )[0]
    return {"corpus": corpus, "index_dir": index_dir, "chunk_id": chunk_id}


def make_ds(built, **config):
    return Datasette(
        files=[], immutables=[str(built["index_dir"] / "energy.sqlite3")], secret="boundary",
        metadata={"plugins": {"groundkit": {
            "base_dir": str(built["corpus"]), "index_dir": str(built["index_dir"]), **config}}},
    )


PUBLISHED = {
    "allow_remote_access": True,
    "tokens": [{"id": "alice", "sha256": hash_token(TOKEN), "groups": ["staff"]}],
}


# -- from route patterns to concrete paths -------------------------------------------------


def _groups(pattern: str):
    """(start, end, name, optional) for each top-level group of ``pattern``."""
    out, depth, start = [], 0, None
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = pattern.index("]", i + 1) + 1
            continue
        if c == "(":
            if depth == 0:
                start = i
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                end = i + 1
                optional = end < len(pattern) and pattern[end] == "?"
                m = re.match(r"\(\?P<(\w+)>", pattern[start:])
                out.append((start, end + (1 if optional else 0), m.group(1) if m else None, optional))
        i += 1
    return out


def _first_alternative(pattern: str) -> str:
    """``pattern`` up to its first ``|`` outside any group or class."""
    depth, i = 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = pattern.index("]", i + 1) + 1
            continue
        depth += {"(": 1, ")": -1}.get(c, 0)
        if c == "|" and depth == 0:
            return pattern[:i]
        i += 1
    return pattern


def example_path(pattern: str, values: dict, *, optional_groups: bool) -> str:
    """A path the route ``pattern`` matches, with named groups taken from ``values``;
    optional groups left out, or filled in."""
    text = pattern
    for start, end, name, optional in reversed(_groups(pattern)):
        if optional and not optional_groups:
            replacement = ""
        elif name is not None:
            replacement = values.get(name, "x")
        else:
            inner = text[start + 1 : end - (2 if optional else 1)]
            replacement = example_path(_first_alternative(inner), values,
                                       optional_groups=optional_groups)
        text = text[:start] + replacement + text[end:]
    text = text.lstrip("^").rstrip("$")
    text = re.sub(r"\\(.)", r"\1", text)
    return text


def instance_paths(ds, built) -> list[str]:
    values = {
        "database": "energy", "collection": "energy", "table": "chunks", "pks": "1",
        "path": "app.css", "rest": "", "chunk_id": built["chunk_id"],
        "document_id": "d_0", "as_format": ".json", "format": "json",
    }
    paths = []
    for regex, _view in ds._routes():
        for optional_groups in (False, True):
            path = example_path(regex.pattern, values, optional_groups=optional_groups)
            assert regex.match(path), (regex.pattern, path)
            paths.append(path)
    # The same pages by their query-string spellings and the other databases.
    paths += ["/energy.json?sql=select+content+from+chunks", "/_memory.json?sql=select+1",
              "/energy/chunks.csv?_search=wind", "/en~65rgy/chunks.json"]
    return sorted(set(paths))


MCP_CALL = json.dumps({
    "jsonrpc": "2.0", "id": 1, "method": "tools/call",
    "params": {"name": "execute_sql", "arguments": {
        "database": "energy", "sql": "select content from chunks"}},
})
MCP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


async def probe(client, paths, headers=None):
    """GET and POST every path; returns [(method, path, response)]."""
    out = []
    for path in paths:
        h = dict(headers or {})
        out.append(("GET", path, await client.get(path, headers=h)))
        body = MCP_CALL if path.endswith("mcp") else "{}"
        out.append(("POST", path, await client.post(path, content=body, headers={**MCP_HEADERS, **h})))
    return out


def assert_nothing_leaks(results, built, *, statuses, static_ok=False):
    secrets = [*CORPUS_WORDS, str(built["index_dir"]), str(built["corpus"]), hash_token(TOKEN)]
    for method, path, r in results:
        text = r.text + str(r.headers)
        for secret in secrets:
            assert secret not in text, (method, path, r.status_code, secret)
        if static_ok and STATIC_ROUTE.match(path):
            continue
        assert r.status_code in statuses, (method, path, r.status_code, r.text[:200])


def client_for(ds, url="http://localhost", **kwargs):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=ds.app()), base_url=url, **kwargs)


# Routes only one Datasette line has: each must be among the probed paths on its line.
LINE_ROUTES = ("/energy/-/query.json", "/-/schema.json", "/-/config.json") if DATASETTE_1 else (
    "/-/metadata.json",)


async def test_the_routes_include_other_plugins_and_datasettes_own(built):
    paths = instance_paths(make_ds(built), built)
    for expected in ("/-/mcp", "/-/groundkit/mcp", "/energy/chunks.json", "/energy.db",
                     "/-/static/app.css", *LINE_ROUTES):
        assert expected in paths


async def test_a_rebound_host_is_refused_on_every_route(built):
    ds = make_ds(built)
    async with client_for(ds) as client:
        results = await probe(client, instance_paths(ds, built), {"host": "evil.example"})
    assert_nothing_leaks(results, built, statuses={403})
    for _m, _p, r in results:
        assert r.json()["error"] == "host_not_allowed"


async def test_a_forged_origin_is_refused_on_every_route(built):
    ds = make_ds(built)
    async with client_for(ds) as client:
        results = await probe(client, instance_paths(ds, built), {"origin": "https://evil.example"})
    assert_nothing_leaks(results, built, statuses={403})


async def test_a_non_loopback_socket_without_allow_remote_access_is_refused(built):
    ds = make_ds(built)
    async with client_for(ds, "http://192.0.2.7") as client:
        results = await probe(client, instance_paths(ds, built), {"host": "192.0.2.7"})
    assert_nothing_leaks(results, built, statuses={403})
    for _m, _p, r in results:
        assert r.json()["error"] == "remote_access_disabled"


async def test_an_anonymous_caller_of_a_published_server_gets_401_except_static_assets(built):
    ds = make_ds(built, **PUBLISHED)
    server = Served(ds.app())  # a real server, so datasette-mcp's session manager runs
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            paths = instance_paths(ds, built)
            results = await probe(client, paths)
            assert_nothing_leaks(results, built, statuses={401}, static_ok=True)
            static = [r for m, p, r in results if m == "GET" and p == "/-/static/app.css"]
            assert static and static[0].status_code == 200  # assets stay open

            # Positive control: the same MCP probe with a token reads corpus text, so the
            # refusals above are the boundary's doing.
            auth = {"authorization": f"Bearer {TOKEN}"}
            http_client, mcp = mcp_client(server, headers=auth)
            async with http_client, mcp:
                result = await mcp.call_tool(
                    "execute_sql", {"database": "energy", "sql": "select content from chunks"})
            assert not result.is_error and "Photovoltaic" in json.dumps(result.structured_content)
            r = await client.get("/energy/chunks.json?_shape=array", headers=auth)
            assert r.status_code == 200 and "Photovoltaic" in r.text
    finally:
        server.stop()


async def test_loopback_callers_still_reach_every_page(built):
    ds = make_ds(built)
    async with client_for(ds) as client:
        r = await client.get("/energy/chunks.json?_shape=array")
        assert r.status_code == 200 and "Photovoltaic" in r.text
        assert (await client.get("/-/versions.json")).status_code == 200
        assert (await client.get("/-/static/app.css")).status_code == 200


async def test_public_paths_open_only_what_the_operator_listed(built):
    ds = make_ds(built, **PUBLISHED, public_paths=["/-/versions.json"])
    async with client_for(ds, "http://192.0.2.7") as client:
        assert (await client.get("/-/versions.json")).status_code == 200
        assert (await client.get("/-/versions")).status_code == 401
        assert (await client.get("/energy/chunks.json")).status_code == 401
        # Host and Origin rules are not relaxed by public_paths on an unpublished server.
    ds = make_ds(built, public_paths=["/-/versions.json"])
    async with client_for(ds) as client:
        r = await client.get("/-/versions.json", headers={"host": "evil.example"})
        assert r.status_code == 403


def test_public_paths_are_validated():
    from groundkit_datasette.surfaces.service import Settings

    for bad in ("/-/login", ["relative"], ["/a/../b"]):
        with pytest.raises(ValueError, match="public_paths"):
            Settings.from_config({"public_paths": bad})
    assert Settings.from_config({"public_paths": ["/-/login"]}).public_paths == ("/-/login",)


async def test_encoded_paths_do_not_pass_as_static_assets(built):
    ds = make_ds(built, **PUBLISHED)
    async with client_for(ds, "http://192.0.2.7") as client:
        for path in ("/-/static/..%2f..%2fenergy/chunks.json", "/-/static/%2e%2e/energy.json"):
            r = await client.get(path)
            assert r.status_code == 401, path


class RoguePlugin:
    """Another plugin answering a path from its own ASGI wrapper, before any route."""

    __name__ = "rogue_test_plugin"

    @staticmethod
    def asgi_wrapper(datasette):
        def wrap(app):
            async def rogue(scope, receive, send):
                if scope.get("type") == "http" and scope.get("path") == "/-/rogue":
                    await send({"type": "http.response.start", "status": 200,
                                "headers": [(b"content-type", b"text/plain")]})
                    await send({"type": "http.response.body", "body": b"Photovoltaic"})
                    return
                await app(scope, receive, send)

            return rogue

        return wrap


async def test_the_boundary_wraps_other_plugins_wrappers(built):
    from datasette import hookimpl
    from datasette.plugins import pm

    RoguePlugin.asgi_wrapper = staticmethod(hookimpl(RoguePlugin.asgi_wrapper))
    pm.register(RoguePlugin, name="rogue_test_plugin")
    try:
        ds = make_ds(built)
        async with client_for(ds) as client:
            assert (await client.get("/-/rogue")).text == "Photovoltaic"  # it answers locally
            r = await client.get("/-/rogue", headers={"host": "evil.example"})
            assert r.status_code == 403 and "Photovoltaic" not in r.text
    finally:
        pm.unregister(name="rogue_test_plugin")


async def test_security_headers_on_every_answer(built):
    ds = make_ds(built)
    async with client_for(ds) as client:
        for path in ("/-/groundkit", "/energy/chunks", "/-/versions.json", "/-/static/app.css"):
            r = await client.get(path)
            assert r.headers["x-content-type-options"] == "nosniff", path
            assert r.headers["referrer-policy"] == "no-referrer", path
            assert r.headers["x-frame-options"] == "DENY", path
            assert "frame-ancestors 'none'" in r.headers["content-security-policy"], path
        r = await client.get("/-/groundkit")
        policy = r.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "'unsafe-inline'" not in policy
        r = await client.get("/-/groundkit", headers={"host": "evil.example"})  # refusals too
        assert r.status_code == 403 and r.headers["x-frame-options"] == "DENY"


# The pages that show the instance's configuration on this line: file paths, plugin settings.
CONFIGURATION_PAGES = ("/-/databases.json", "/-/databases") + (
    ("/-/config.json", "/-/config") if DATASETTE_1 else ("/-/metadata.json", "/-/metadata"))


async def test_configuration_pages_are_root_only_on_a_published_server(built):
    """Datasette serves the plugin settings as written (token hashes, the OIDC provider,
    directories) on /-/metadata (0.65) and /-/config (1.0), and file paths on /-/databases:
    on a published server only the root actor sees them (adr/0053)."""
    oidc = {"issuer": "https://idp.internal.example", "audience": "groundkit",
            "jwks_url": "https://idp.internal.example/jwks.json"}
    root_token = "boundary-root-token-0123456789"
    settings = {"base_dir": str(built["corpus"]), "index_dir": str(built["index_dir"]),
                **PUBLISHED, "oidc": oidc}
    settings["tokens"] = [*PUBLISHED["tokens"], {"id": "root", "sha256": hash_token(root_token)}]
    metadata_in = {"title": "Energy", "plugins": {"groundkit": settings}}
    ds = Datasette(files=[], immutables=[str(built["index_dir"] / "energy.sqlite3")],
                   secret="boundary", metadata=metadata_in)
    alice = {"authorization": f"Bearer {TOKEN}"}
    root = {"authorization": f"Bearer {root_token}"}
    async with client_for(ds, "http://192.0.2.7") as client:
        for page in CONFIGURATION_PAGES:
            for path in (page, page + "/"):
                r = await client.get(path, headers=alice)
                assert r.status_code == 403 and r.json()["error"] == "forbidden", path
                for secret in (hash_token(TOKEN), "idp.internal.example", str(built["index_dir"]),
                               str(built["corpus"])):
                    assert secret not in r.text, (path, secret)
            assert (await client.get(page, headers=root)).status_code == 200, page
        # The settings still work: the token authenticates, the collection answers.
        r = await client.get("/energy/-/groundkit/status.json", headers=alice)
        assert r.status_code == 200
        assert (await client.get("/-/versions.json", headers=alice)).status_code == 200
    # On loopback, where every caller may read every collection, the pages stay open.
    ds = make_ds(built)
    async with client_for(ds) as client:
        for page in CONFIGURATION_PAGES:
            assert (await client.get(page)).status_code == 200, page


async def test_every_inline_script_of_a_groundkit_page_is_allowed_by_its_hash(built):
    """The CSP of groundkit's pages allows the inline scripts Datasette's base template adds
    on this line (1.0's carries the running version) by their hashes, never 'unsafe-inline'."""
    import base64
    import hashlib

    ds = make_ds(built)
    async with client_for(ds) as client:
        for path in ("/-/groundkit", "/energy/-/groundkit/search?q=wind",
                     f"/energy/-/groundkit/chunks/{built['chunk_id']}"):
            r = await client.get(path)
            assert r.status_code == 200, path
            policy = r.headers["content-security-policy"]
            script_src = next(d for d in policy.split(";") if d.strip().startswith("script-src"))
            assert "'unsafe-inline'" not in policy
            inline = re.findall(r"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", r.text, flags=re.S)
            for body in inline:
                digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
                assert f"'sha256-{digest}'" in script_src, (path, body[:60])
            if DATASETTE_1:
                assert any("datasetteVersion" in body for body in inline)


async def test_another_authentication_plugin_s_actor_passes_a_published_boundary(built):
    """datasette-auth-tokens (0.3 on Datasette 0.65, 0.4 on 1.0) names the actor of a published
    server: the boundary lets it in, and the raw views and groundkit's tools answer it."""
    pytest.importorskip("datasette_auth_tokens")
    ds = Datasette(
        files=[], immutables=[str(built["index_dir"] / "energy.sqlite3")], secret="boundary",
        metadata={"plugins": {
            "groundkit": {"base_dir": str(built["corpus"]), "allow_remote_access": True},
            "datasette-auth-tokens": {"tokens": [
                {"token": "other-plugin-token", "actor": {"id": "bot"}}]},
        }},
    )
    bot = {"authorization": "Bearer other-plugin-token"}
    async with client_for(ds, "http://192.0.2.7") as client:
        for path in ("/-/groundkit/collections.json", "/energy/chunks.json?_shape=array",
                     "/-/actor.json"):
            assert (await client.get(path)).status_code == 401, path
            r = await client.get(path, headers=bot)
            assert r.status_code == 200, (path, r.text[:200])
        assert (await client.get("/-/actor.json", headers=bot)).json()["actor"] == {"id": "bot"}
        r = await client.get("/energy/chunks.json?_shape=array", headers=bot)
        assert "Photovoltaic" in r.text
        r = await client.get("/-/groundkit/collections.json",
                             headers={"authorization": "Bearer not-a-token"})
        assert r.status_code == 401
