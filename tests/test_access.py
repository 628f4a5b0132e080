"""Who can reach groundkit: loopback by default, Host/Origin checks against DNS rebinding,
and "published means authenticated". Real requests through the Datasette app, crafted ASGI
scopes for the socket address, and a real uvicorn bound to a non-loopback interface."""

import ipaddress
import json
import logging
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from datasette.app import Datasette

from groundkit_datasette.security.boundary import (
    loopback_host_header,
    loopback_ip,
    loopback_origin,
    loopback_socket,
)
from groundkit_datasette.security.auth import hash_token
from groundkit_datasette.indexing.ingest import ingest

MCP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
MCP_LIST = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
ERROR_KEYS = {"ok", "error", "detail", "request_id"}


def teredo(client: str) -> str:
    """A Teredo address whose (obfuscated) client address is ``client``."""
    server = int(ipaddress.IPv4Address("65.54.227.120"))
    obfuscated = ~int(ipaddress.IPv4Address(client)) & 0xFFFFFFFF
    value = (0x20010000 << 96) | (server << 64) | (0xFFFF << 32) | obfuscated
    address = ipaddress.IPv6Address(value)
    assert address.teredo[1] == ipaddress.IPv4Address(client)
    return str(address)


LOOPBACK_SPELLINGS = [
    "127.0.0.1", "127.0.0.2", "127.255.255.254", "::1", "0:0:0:0:0:0:0:1", "0000::0001",
    "::ffff:127.0.0.1", "::ffff:7f00:1", "::FFFF:127.1.2.3",
]
ROUTABLE_SPELLINGS = [
    "192.0.2.2", "10.0.0.1", "0.0.0.0", "::", "fd00::2", "fe80::1", "::ffff:192.0.2.2",
    "::ffff:0.0.0.0",
    # Embedded 127.0.0.1 in forms that live on routable IPv6 interfaces: refused.
    "2002:7f00:1::1", "2002:7f00:0001::", teredo("127.0.0.1"), "64:ff9b::7f00:1", "::127.0.0.1",
    # Not literals at all.
    "2130706433", "0x7f.1", "0177.0.0.1", "127.1", "", "example.com",
]


@pytest.mark.parametrize("address", LOOPBACK_SPELLINGS)
def test_loopback_spellings_are_loopback(address):
    assert loopback_ip(address)
    assert loopback_socket((address, 8001))


@pytest.mark.parametrize("address", ROUTABLE_SPELLINGS)
def test_other_spellings_are_not(address):
    assert not loopback_ip(address)
    assert not loopback_socket((address, 8001))


def test_socket_without_an_address_is_not_loopback():
    assert not loopback_socket(None)  # a Unix socket: whoever its owner lets in
    assert not loopback_socket((None, None))
    assert loopback_socket(("localhost", None))  # in-process clients name the server


@pytest.mark.parametrize("host", [
    "localhost", "LOCALHOST", "localhost:8001", "localhost.", "127.0.0.1", "127.0.0.1:8001",
    "127.9.9.9:1", "[::1]", "[::1]:8001", "[::ffff:127.0.0.1]:8001",
])
def test_host_headers_naming_loopback(host):
    assert loopback_host_header(host)


@pytest.mark.parametrize("host", [
    "evil.example", "evil.example:8001", "localhost.evil.example", "127.0.0.1.nip.io",
    "evil.localhost", "2130706433", "0x7f.1", "0177.0.0.1", "::1", "[::1", "[::1]x", "[::1]:",
    "localhost:", "localhost:abc", "localhost:123456", "127.0.0.1:8001:1", "[2002:7f00:1::1]",
    "[fe80::1%25lo]", "192.0.2.2", "", "local host",
])
def test_host_headers_naming_anything_else(host):
    assert not loopback_host_header(host)


@pytest.mark.parametrize("origin,ok", [
    ("http://localhost:3000", True), ("http://127.0.0.1:8001", True), ("https://[::1]:6274", True),
    ("null", False), ("https://evil.example", False), ("http://localhost.evil.example", False),
    ("file://", False), ("http://127.0.0.1:8001/path", False), ("http://user@localhost", False),
    ("ftp://localhost", False),
])
def test_origins(origin, ok):
    assert loopback_origin(origin) is ok


# -- through the real app --------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from .conftest import write_corpus

    root = tmp_path_factory.mktemp("access")
    corpus = write_corpus(root / "corpus")
    index_dir = root / "index"
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    return corpus, index_dir


def make_ds(built, **config):
    corpus, index_dir = built
    return Datasette(
        files=[], immutables=[str(index_dir / "energy.sqlite3")], secret="access-test",
        metadata={"plugins": {"groundkit": {"base_dir": str(corpus), **config}}},
    )


def client_for(ds, url="http://localhost", **kwargs):
    """What ``ds.client`` does, at any URL: httpx's ASGI transport reports the URL's host
    as the server (socket) address."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=ds.app()), base_url=url, **kwargs)


async def guarded_requests(ds, url="http://localhost", headers=None, cookies=None):
    """One request to every guarded surface; returns ``[(name, response)]``."""
    headers = dict(headers or {})
    async with client_for(ds, url, cookies=cookies) as client:
        search = await client.post(
            "/energy/-/groundkit/search.json", content=json.dumps({"query": "wind"}),
            headers={"content-type": "application/json", **headers})
        return [
            ("collections", await client.get("/-/groundkit/collections.json", headers=headers)),
            ("status", await client.get("/energy/-/groundkit/status.json", headers=headers)),
            ("search", search),
            ("chunk", await client.get(
                "/energy/-/groundkit/chunks/c_000000000000000000000000.json", headers=headers)),
            ("html", await client.get("/-/groundkit", headers=headers)),
            ("mcp", await client.post("/-/groundkit/mcp", content=MCP_LIST,
                                      headers={**MCP_HEADERS, **headers})),
            # Datasette's own pages of a collection database serve the same corpus.
            ("table", await client.get("/energy/chunks.json", headers=headers)),
            # Datasette 1.0 redirects ?sql= to /energy/-/query.json: the answer is where it lands.
            ("sql", await client.get("/energy.json?sql=select+content+from+chunks", headers=headers,
                                     follow_redirects=True)),
            ("tilde", await client.get("/en~65rgy/chunks.json", headers=headers)),
        ]


def assert_refused(responses, status, kind, *, not_echoing=()):
    for name, r in responses:
        assert r.status_code == status, (name, r.status_code, r.text[:300])
        body = r.json()
        assert set(body) == ERROR_KEYS and body["error"] == kind, name
        assert body["request_id"] == r.headers["x-request-id"]
        for text in not_echoing:
            assert text not in r.text and text not in str(r.headers), name


async def test_loopback_requests_are_answered(built):
    ds = make_ds(built)
    for host in ("localhost", "localhost:8001", "127.0.0.1:8001", "[::1]:8001"):
        for name, r in await guarded_requests(ds, headers={"host": host}):
            expected = 404 if name == "chunk" else 200
            assert r.status_code == expected, (host, name, r.text[:200])


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8001", "localhost.evil.example",
                                  "2130706433:8001", "[2002:7f00:1::1]:8001"])
async def test_a_forged_host_is_refused_on_every_guarded_route(built, host):
    ds = make_ds(built)
    responses = await guarded_requests(ds, headers={"host": host})
    assert_refused(responses, 403, "host_not_allowed", not_echoing=[host])
    assert "allow_remote_access" in responses[0][1].json()["detail"]


async def test_a_foreign_origin_is_refused_and_a_local_one_is_not(built):
    ds = make_ds(built)
    responses = await guarded_requests(ds, headers={"origin": "https://evil.example"})
    assert_refused(responses, 403, "origin_not_allowed", not_echoing=["evil.example"])
    r = await ds.client.post("/-/groundkit/mcp", content=MCP_LIST,
                             headers={**MCP_HEADERS, "origin": "http://localhost:6274"})
    assert r.status_code == 200 and r.json()["result"]["tools"]
    r = await ds.client.post("/-/groundkit/mcp", content=MCP_LIST,
                             headers={**MCP_HEADERS, "origin": "null"})
    assert r.status_code == 403


async def test_other_datasette_pages_are_guarded_too(built):
    # The boundary is the whole instance (adr/0011); tests/test_boundary.py probes every route.
    ds = make_ds(built)
    r = await ds.client.get("/-/versions.json", headers={"host": "evil.example"})
    assert r.status_code == 403
    async with client_for(ds, "http://192.0.2.7") as client:
        assert (await client.get("/-/versions.json")).status_code == 403
    assert (await ds.client.get("/-/versions.json")).status_code == 200


async def test_a_non_loopback_server_address_is_refused_naming_the_setting(built):
    ds = make_ds(built)
    # httpx's ASGI transport reports the URL's host as the server address.
    responses = await guarded_requests(ds, url="http://192.0.2.7")
    assert_refused(responses, 403, "remote_access_disabled")
    assert "allow_remote_access: true" in responses[0][1].json()["detail"]


async def asgi_get(app, path, server, headers=(("host", "localhost"),)):
    """One request through the raw ASGI app with a crafted ``scope["server"]``."""
    messages = []
    received = False

    async def receive():
        nonlocal received
        if received:
            return {"type": "http.disconnect"}
        received = True
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        messages.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("203.0.113.9", 50000), "server": server,
        "headers": [(k.encode(), v.encode()) for k, v in headers],
    }
    await app(scope, receive, send)
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return start["status"], body


@pytest.mark.parametrize("address", LOOPBACK_SPELLINGS)
async def test_crafted_loopback_server_addresses_are_served(built, address):
    app = make_ds(built).app()
    status, body = await asgi_get(app, "/-/groundkit/collections.json", (address, 8001))
    assert status == 200 and json.loads(body) == {"collections": ["energy"]}


@pytest.mark.parametrize("address", [a for a in ROUTABLE_SPELLINGS if a] + [None])
async def test_crafted_routable_server_addresses_are_refused(built, address):
    app = make_ds(built).app()
    server = (address, 8001) if address is not None else None
    status, body = await asgi_get(app, "/-/groundkit/collections.json", server)
    assert status == 403 and json.loads(body)["error"] == "remote_access_disabled"
    status, _ = await asgi_get(app, "/energy/chunks.json", server)
    assert status == 403


async def test_published_server_needs_an_actor(built):
    ds = make_ds(built, allow_remote_access=True)
    responses = await guarded_requests(ds, url="http://192.0.2.7", headers={"host": "search.example"})
    assert_refused(responses, 401, "authentication_required")
    assert responses[0][1].headers["www-authenticate"].startswith("Bearer")
    # An actor from any Datasette authentication (here its signed cookie) is enough.
    cookies = {"ds_actor": ds.sign({"a": {"id": "alice"}}, "actor")}
    async with client_for(ds, "http://192.0.2.7", cookies=cookies) as client:
        r = await client.get("/-/groundkit/collections.json", headers={"host": "search.example"})
        assert r.status_code == 200 and r.json() == {"collections": ["energy"]}
    async with client_for(ds, "http://192.0.2.7") as client:
        # Datasette's own pages are behind the same boundary (adr/0011).
        assert (await client.get("/-/versions.json")).status_code == 401


async def test_published_server_with_a_token_and_any_host(built):
    ds = make_ds(built, allow_remote_access=True,
                 tokens=[{"id": "ci-bot", "sha256": hash_token("s3cret-token-value")}])
    auth = {"authorization": "Bearer s3cret-token-value", "host": "search.example:443"}
    for name, r in await guarded_requests(ds, url="http://192.0.2.7", headers=auth):
        if name in ("table", "sql", "tilde"):
            assert r.status_code == 200, name
        else:
            assert r.status_code == (404 if name == "chunk" else 200), (name, r.text[:200])


def database_list(r) -> list:
    body = r.json()  # Datasette 1.0 wraps the list: {"ok": true, "databases": [...]}
    return body["databases"] if isinstance(body, dict) else body


async def test_the_database_list_with_its_file_paths_is_guarded(built):
    path = str(built[1] / "energy.sqlite3")
    # Loopback: the local user sees it.
    r = await make_ds(built).client.get("/-/databases.json")
    assert r.status_code == 200 and any(d["path"] == path for d in database_list(r))
    # Loopback only, but reached from outside or under a rebound name: refused like our routes.
    async with client_for(make_ds(built), "http://192.0.2.7") as client:
        r = await client.get("/-/databases.json")
        assert r.status_code == 403 and r.json()["error"] == "remote_access_disabled"
    r = await make_ds(built).client.get("/-/databases.json", headers={"host": "evil.example"})
    assert r.status_code == 403 and r.json()["error"] == "host_not_allowed"

    # Published: an authenticated actor is not enough; Datasette's root actor is.
    ds = make_ds(built, allow_remote_access=True,
                 tokens=[{"id": "ci-bot", "sha256": hash_token("s3cret-token-value")}])
    async with client_for(ds, "http://192.0.2.7") as client:
        for page in ("/-/databases.json", "/-/databases"):
            r = await client.get(page, headers={"authorization": "Bearer s3cret-token-value"})
            assert r.status_code == 403 and path not in r.text
            assert r.json()["error"] == "forbidden"
        assert (await client.get("/-/databases.json")).status_code == 401
        root = {"ds_actor": ds.sign({"a": {"id": "root"}}, "actor")}
        r = await client.get("/-/databases.json", cookies=root)
        assert r.status_code == 200 and any(d["path"] == path for d in database_list(r))
        # Datasette's other instance pages need an actor, any actor (adr/0011).
        assert (await client.get("/-/versions.json")).status_code == 401
        r = await client.get("/-/versions.json", headers={"authorization": "Bearer s3cret-token-value"})
        assert r.status_code == 200


async def test_anonymous_publishing_is_explicit_and_logged(built, caplog):
    ds = make_ds(built, allow_remote_access=True, allow_anonymous=True)
    with caplog.at_level(logging.WARNING, logger="groundkit"):
        await ds.invoke_startup()
    assert any("PUBLIC" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    responses = await guarded_requests(ds, url="http://192.0.2.7", headers={"host": "anything.example"})
    for name, r in responses:
        assert r.status_code == (404 if name == "chunk" else 200), name


@pytest.mark.parametrize("config", [
    {"allow_remote_access": "false"}, {"allow_anonymous": 1}, {"allow_remote_acess": True},
])
async def test_settings_that_would_publish_by_accident_fail_start_up(built, config):
    ds = make_ds(built, **config)
    with pytest.raises(ValueError):
        await ds.invoke_startup()


# -- real sockets ------------------------------------------------------------------------


def outside_address() -> str | None:
    """This machine's address on a non-loopback interface, if it has one."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.200", 9))  # no packet is sent: this only picks the route
        address = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return None if loopback_ip(address) else address


class Served:
    def __init__(self, app, host):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.02)

    def url(self, host):
        return f"http://{host}:{self.port}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)


async def test_real_socket_on_an_outside_interface(built):
    outside = outside_address()
    if outside is None:
        pytest.skip("no non-loopback interface on this machine")
    served = Served(make_ds(built).app(), outside)
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            r = await client.get(served.url(outside) + "/-/groundkit/collections.json")
            assert r.status_code == 403 and r.json()["error"] == "remote_access_disabled"
            r = await client.post(served.url(outside) + "/-/groundkit/mcp", content=MCP_LIST,
                                  headers=MCP_HEADERS)
            assert r.status_code == 403 and r.json()["error"] == "remote_access_disabled"
    finally:
        served.stop()
    # Bound to every interface: reached through loopback it answers, from outside it does not.
    served = Served(make_ds(built).app(), "0.0.0.0")
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            r = await client.get(served.url("127.0.0.1") + "/-/groundkit/collections.json")
            assert r.status_code == 200
            r = await client.get(served.url(outside) + "/-/groundkit/collections.json")
            assert r.status_code == 403
    finally:
        served.stop()
    served = Served(make_ds(built, allow_remote_access=True, allow_anonymous=True).app(), outside)
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            r = await client.get(served.url(outside) + "/-/groundkit/collections.json")
            assert r.status_code == 200 and r.json() == {"collections": ["energy"]}
    finally:
        served.stop()


async def test_real_loopback_socket_refuses_a_rebound_host(built):
    served = Served(make_ds(built).app(), "127.0.0.1")
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            base = served.url("127.0.0.1")
            r = await client.get(base + "/-/groundkit/collections.json",
                                 headers={"host": f"attacker.example:{served.port}"})
            assert r.status_code == 403 and r.json()["error"] == "host_not_allowed"
            r = await client.post(base + "/-/groundkit/mcp", content=MCP_LIST,
                                  headers={**MCP_HEADERS, "host": f"attacker.example:{served.port}"})
            assert r.status_code == 403 and "attacker" not in r.text
            r = await client.post(base + "/-/groundkit/mcp", content=MCP_LIST,
                                  headers={**MCP_HEADERS, "origin": "https://attacker.example"})
            assert r.status_code == 403 and r.json()["error"] == "origin_not_allowed"
            r = await client.post(base + "/-/groundkit/mcp", content=MCP_LIST, headers=MCP_HEADERS)
            assert r.status_code == 200 and r.json()["result"]["tools"]
    finally:
        served.stop()


def ipv6_loopback_configured() -> bool:
    """Whether the kernel lists ::1 on an interface: asked directly, not inferred from a failed bind."""
    try:
        with open("/proc/net/if_inet6") as f:
            return any(line.split()[0] == "0" * 31 + "1" for line in f if line.strip())
    except FileNotFoundError:
        return False


async def test_real_ipv6_loopback_socket_is_served_and_checks_the_host(built):
    """[::1] is loopback like 127.0.0.1: served, and a rebound Host is still refused."""
    if not ipv6_loopback_configured():
        pytest.xfail("this machine has no ::1 (no IPv6 loopback configured)")
    served = Served(make_ds(built).app(), "::1")  # a failure to bind ::1 here fails the test
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            base = f"http://[::1]:{served.port}"
            r = await client.get(base + "/-/groundkit/collections.json")
            assert r.status_code == 200 and r.json() == {"collections": ["energy"]}
            r = await client.get(base + "/-/groundkit/collections.json",
                                 headers={"host": f"attacker.example:{served.port}"})
            assert r.status_code == 403 and r.json()["error"] == "host_not_allowed"
    finally:
        served.stop()
