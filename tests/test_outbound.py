import ipaddress

import pytest

from groundkit_datasette import outbound
from groundkit_datasette.errors import UnsafeEndpoint
from groundkit_datasette.outbound import (
    check_resolved,
    classify_address,
    is_loopback,
    redact_url,
    validate_endpoint,
)

SECRET_PARTS = ("s3cr3t-host", "hunter2", "alice", "tok3n", "fr4g", "p4th")


def assert_no_url(error, url):
    message = str(error.value)
    assert not url or url not in message
    for part in SECRET_PARTS:
        assert part not in message


@pytest.mark.parametrize(
    "url",
    [
        "ftp://s3cr3t-host.example/p4th",
        "file:///etc/p4th",
        "gopher://s3cr3t-host.example/p4th",
        "http://s3cr3t-host.example/p4th",  # http needs allow_private
        "https://alice:hunter2@s3cr3t-host.example/p4th",
        "https://alice@s3cr3t-host.example/p4th",
        "https://s3cr3t-host.example/p4th?key=tok3n",
        "https://s3cr3t-host.example/p4th?",
        "https://s3cr3t-host.example/p4th#fr4g",
        "https:///p4th",
        "https://:443/p4th",
        "https://s3cr3t-host.example:99999/p4th",
        "https://s3cr3t-host.example/p4th with space",
        "https://s3cr3t-host.example\\@evil.example/p4th",
        "https://s3cr3t-host\u00e9.example/p4th",
        "https://s3cr3t_host!.example/p4th",
        "s3cr3t-host.example/p4th",
        "",
    ],
)
def test_validate_refuses_without_echoing_url(url):
    with pytest.raises(UnsafeEndpoint) as error:
        validate_endpoint(url)
    assert_no_url(error, url)


def test_validate_refuses_with_allow_private_too():
    for url in (
        "ftp://s3cr3t-host.example/p4th",
        "http://alice:hunter2@s3cr3t-host.example/p4th",
        "http://s3cr3t-host.example/p4th?key=tok3n",
        "http://s3cr3t-host.example/p4th#fr4g",
        "http:///p4th",
    ):
        with pytest.raises(UnsafeEndpoint) as error:
            validate_endpoint(url, allow_private=True)
        assert_no_url(error, url)


def test_validate_accepts_and_normalises():
    ep = validate_endpoint("https://API.Example.com/v1/")
    assert (ep.scheme, ep.host, ep.port, ep.path) == ("https", "api.example.com", 443, "/v1")
    assert ep.url_for("embeddings") == "https://api.example.com/v1/embeddings"
    ep = validate_endpoint("http://localhost:11434", allow_private=True)
    assert (ep.scheme, ep.host, ep.port, ep.path) == ("http", "localhost", 11434, "")
    ep = validate_endpoint("http://[::1]:8080/v1", allow_private=True)
    assert ep.host == "::1" and ep.netloc == "[::1]:8080"


def test_validate_judges_literal_addresses_early():
    with pytest.raises(UnsafeEndpoint, match="loopback"):
        validate_endpoint("https://127.0.0.1/v1")
    with pytest.raises(UnsafeEndpoint, match="private"):
        validate_endpoint("https://[::ffff:10.0.0.1]/v1")
    assert validate_endpoint("http://127.0.0.1:8000/v1", allow_private=True).host == "127.0.0.1"
    # Cloud metadata is link-local: refused even for local-server providers.
    with pytest.raises(UnsafeEndpoint, match="link-local"):
        validate_endpoint("http://169.254.169.254/latest", allow_private=True)


def _teredo(client_ipv4):
    obfuscated = int(ipaddress.IPv4Address(client_ipv4)) ^ 0xFFFFFFFF
    server = int(ipaddress.IPv4Address("65.54.227.120"))
    value = (0x20010000 << 96) | (server << 64) | (0x8000 << 48) | (0x63BF << 32) | obfuscated
    return str(ipaddress.IPv6Address(value))


@pytest.mark.parametrize(
    "addr, unwrapped",
    [
        ("127.0.0.1", "127.0.0.1"),
        ("::1", "::1"),
        ("::ffff:127.0.0.1", "127.0.0.1"),
        ("::ffff:10.0.0.1", "10.0.0.1"),
        ("2002:7f00:0001::1", "127.0.0.1"),
        ("2002:0a00:0001::1", "10.0.0.1"),
        (_teredo("127.0.0.1"), "127.0.0.1"),
        (_teredo("10.1.2.3"), "10.1.2.3"),
        ("64:ff9b::7f00:1", "127.0.0.1"),
        ("8.8.8.8", "8.8.8.8"),
        ("2606:4700:4700::1111", "2606:4700:4700::1111"),
    ],
)
def test_classify_unwraps_embedded_ipv4(addr, unwrapped):
    assert classify_address(addr) == ipaddress.ip_address(unwrapped)


def test_teredo_helper_matches_known_example():
    # RFC 4380's layout: the last 32 bits are the client address XOR 0xffffffff.
    assert _teredo("127.0.0.1").endswith(":80ff:fffe")


@pytest.mark.parametrize(
    "addr",
    ["127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1", "2002:7f00:0001::1", _teredo("127.0.0.1")],
)
def test_is_loopback(addr):
    assert is_loopback(addr)


@pytest.mark.parametrize("addr", ["8.8.8.8", "10.0.0.1", "::ffff:8.8.8.8", "not an address"])
def test_is_not_loopback(addr):
    assert not is_loopback(addr)


def resolver_for(*addresses):
    calls = []

    def resolve(host, port):
        calls.append((host, port))
        return list(addresses)

    resolve.calls = calls
    return resolve


REFUSED_ALWAYS = [
    "169.254.169.254",
    "fe80::1",
    "224.0.0.1",
    "ff02::1",
    "0.0.0.0",
    "0.1.2.3",
    "::",
    "240.0.0.1",
    "255.255.255.255",
    "::ffff:169.254.169.254",
]
REFUSED_UNLESS_PRIVATE = [
    "127.0.0.1",
    "::1",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "2002:7f00:0001::1",
    _teredo("127.0.0.1"),
    _teredo("10.20.30.40"),
    "10.0.0.1",
    "172.16.5.4",
    "192.168.1.1",
    "fc00::1",
    "100.64.0.1",
]


@pytest.mark.parametrize("addr", REFUSED_ALWAYS + REFUSED_UNLESS_PRIVATE)
def test_check_resolved_refuses(addr):
    with pytest.raises(UnsafeEndpoint) as error:
        check_resolved("s3cr3t-host.example", 443, resolver=resolver_for(addr))
    assert "s3cr3t-host" not in str(error.value)


@pytest.mark.parametrize("addr", REFUSED_ALWAYS)
def test_allow_private_still_refuses_link_local_multicast_reserved(addr):
    with pytest.raises(UnsafeEndpoint):
        check_resolved("h.example", 80, allow_private=True, resolver=resolver_for(addr))


@pytest.mark.parametrize("addr", REFUSED_UNLESS_PRIVATE)
def test_allow_private_permits_loopback_and_private(addr):
    assert check_resolved("h.example", 80, allow_private=True, resolver=resolver_for(addr))


def test_public_addresses_allowed():
    resolve = resolver_for("8.8.8.8", "2606:4700:4700::1111", "::ffff:1.1.1.1")
    assert check_resolved("api.example", 443, resolver=resolve) == [
        "8.8.8.8",
        "2606:4700:4700::1111",
        "::ffff:101:101",
    ]
    assert resolve.calls == [("api.example", 443)]


def test_any_private_address_in_the_answer_refuses():
    with pytest.raises(UnsafeEndpoint, match="private"):
        check_resolved("mixed.example", 443, resolver=resolver_for("8.8.8.8", "10.0.0.5", "1.1.1.1"))


def test_resolution_failure_and_garbage_are_refused():
    def fails(host, port):
        raise OSError("Name or service not known: s3cr3t-host.example")

    with pytest.raises(UnsafeEndpoint) as error:
        check_resolved("s3cr3t-host.example", 443, resolver=fails)
    assert "s3cr3t-host" not in str(error.value)
    with pytest.raises(UnsafeEndpoint):
        check_resolved("h.example", 443, resolver=resolver_for())
    with pytest.raises(UnsafeEndpoint):
        check_resolved("h.example", 443, resolver=resolver_for("not-an-ip"))


def test_default_resolver_resolves_localhost():
    with pytest.raises(UnsafeEndpoint, match="loopback"):
        check_resolved("localhost", 443)
    assert check_resolved("localhost", 443, allow_private=True)


@pytest.mark.parametrize(
    "url, expected",
    [
        ("https://alice:hunter2@API.example:8443/v1/embeddings?key=tok3n#fr4g", "https://api.example:8443/v1/embeddings"),
        ("http://[::1]:11434/api?x=1", "http://[::1]:11434/api"),
        ("https://api.example", "https://api.example"),
    ],
)
def test_redact_url(url, expected):
    assert redact_url(url) == expected


def test_redact_url_unparseable():
    assert "hunter2" not in redact_url("https://alice:hunter2@host:notaport/x")


def test_guarded_client_never_follows_redirects():
    with outbound.guarded_client(5) as client:
        assert client.follow_redirects is False
        assert client.trust_env is False


def test_pinned_request_keeps_name_for_host_and_sni():
    ep = validate_endpoint("https://api.example:8443/v1")
    with outbound.guarded_client(5) as client:
        request = outbound._pinned_request(client, "POST", ep, "embeddings", "203.0.113.9", json={}, headers=None)
        assert str(request.url) == "https://203.0.113.9:8443/v1/embeddings"
        assert request.headers["Host"] == "api.example:8443"
        assert request.extensions["sni_hostname"] == "api.example"
        request = outbound._pinned_request(client, "POST", ep, "embeddings", "2606:4700::1", json={}, headers=None)
        assert str(request.url).startswith("https://[2606:4700::1]:8443/")


class _Server:
    # A local HTTP server standing in for a remote endpoint.
    def __init__(self, status, location=None):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.hits = []
        server_self = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                server_self.hits.append((self.path, self.headers.get("Host")))
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                body = b'{"ok": true}'
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_guarded_send_sync_and_redirect():
    from groundkit_datasette.errors import RedirectRefused

    ok, redirect = _Server(200), _Server(307, location="http://169.254.169.254/latest")
    try:
        to_local = resolver_for("127.0.0.1")
        ep = validate_endpoint(f"http://svc.example:{ok.port}/api", allow_private=True)
        with outbound.guarded_client(5) as client:
            response = outbound.guarded_send(client, "POST", ep, "rerank", json={}, resolver=to_local)
            assert response.json() == {"ok": True}
            assert ok.hits == [("/api/rerank", f"svc.example:{ok.port}")]
            ep = validate_endpoint(f"http://svc.example:{redirect.port}", allow_private=True)
            with pytest.raises(RedirectRefused) as error:
                outbound.guarded_send(client, "POST", ep, "rerank", json={}, resolver=to_local)
            assert "169.254" not in str(error.value)
            ep = validate_endpoint(f"https://svc.example:{ok.port}")
            with pytest.raises(UnsafeEndpoint):
                outbound.guarded_send(client, "POST", ep, "rerank", json={}, resolver=to_local)
            assert len(ok.hits) == 1
    finally:
        ok.close()
        redirect.close()
