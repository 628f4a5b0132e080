import ipaddress

import pytest

from groundkit_datasette.security import outbound
from groundkit_datasette.errors import UnsafeEndpoint
from groundkit_datasette.security.outbound import (
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


# -- a private CA (ca_bundle) --------------------------------------------------------


def _make_ca_and_leaf(directory, name):
    """A CA and a server certificate for ``name`` signed by it, written as PEM files."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    valid = dict(not_valid_before=now - datetime.timedelta(hours=1),
                 not_valid_after=now + datetime.timedelta(days=1))

    def build(subject, issuer, public_key, signer, *extensions):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
             .public_key(public_key).serial_number(x509.random_serial_number())
             .not_valid_before(valid["not_valid_before"]).not_valid_after(valid["not_valid_after"]))
        for ext, critical in extensions:
            b = b.add_extension(ext, critical=critical)
        return b.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "groundkit test CA")])
    ca = build(ca_name, ca_name, ca_key.public_key(), ca_key,
               (x509.BasicConstraints(ca=True, path_length=None), True),
               (x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                              content_commitment=False, key_encipherment=False,
                              data_encipherment=False, key_agreement=False,
                              encipher_only=False, decipher_only=False), True),
               (x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = build(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]), ca_name,
                 key.public_key(), ca_key,
                 (x509.SubjectAlternativeName([x509.DNSName(name)]), False),
                 (x509.BasicConstraints(ca=False, path_length=None), True),
                 (x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), False),
                 (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False))
    pem = serialization.Encoding.PEM
    (directory / "ca.pem").write_bytes(ca.public_bytes(pem))
    (directory / "server.pem").write_bytes(leaf.public_bytes(pem) + key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return directory / "ca.pem", directory / "server.pem"


class _TLSServer:
    """A real HTTPS server on loopback, certified by a CA made in the test: an embedding
    and rerank endpoint behind a private CA (the remote service itself cannot run here)."""

    def __init__(self, cert_file):
        import json as _json
        import ssl
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.hits, self.sni = [], []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = _json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                outer.hits.append((self.path, self.headers.get("Host")))
                if self.path.startswith("/moved/"):
                    self.send_response(302)
                    self.send_header("Location", "https://169.254.169.254/latest")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path.endswith("/embeddings"):
                    reply = {"data": [{"index": i, "embedding": [1.0, float(i), 0.5]}
                                      for i in range(len(body["input"]))]}
                else:
                    reply = [{"index": i, "score": float(-i)} for i in range(len(body["texts"]))]
                data = _json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file)
        context.sni_callback = lambda sock, name, ctx: outer.sni.append(name)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def private_ca(tmp_path):
    ca, cert = _make_ca_and_leaf(tmp_path, "embed.internal.test")
    server = _TLSServer(cert)
    yield ca, server
    server.close()


def test_an_endpoint_behind_a_private_ca_is_reached_with_ca_bundle(private_ca):
    """Verified against the given CA and the endpoint's name, still pinned to the checked address."""
    from groundkit_datasette.embedding.embedders import get_embedder
    from groundkit_datasette.retrieval.rerankers import get_reranker

    ca, server = private_ca
    resolved = []

    def to_local(host, port):
        resolved.append(host)
        return ["127.0.0.1"]

    url = f"https://embed.internal.test:{server.port}/v1"
    embedder = get_embedder("openai", base_url=url, model="m", allow_private="true",
                            ca_bundle=str(ca), resolver=to_local)
    vectors = embedder.embed(["a", "b"])
    assert vectors.shape == (2, 3)
    assert server.hits == [("/v1/embeddings", f"embed.internal.test:{server.port}")]
    assert server.sni == ["embed.internal.test"] and resolved == ["embed.internal.test"]

    reranker = get_reranker("http", base_url=url, allow_private=True, ca_bundle=str(ca),
                            resolver=to_local)
    assert reranker.score("q", ["x", "y"]) == [0.0, -1.0]


def test_without_the_ca_or_for_another_name_the_certificate_is_refused(private_ca):
    from groundkit_datasette.embedding.embedders import OpenAICompatibleEmbedder
    from groundkit_datasette.errors import EmbedderError

    ca, server = private_ca
    to_local = resolver_for("127.0.0.1")
    trusting_nobody = OpenAICompatibleEmbedder(
        base_url=f"https://embed.internal.test:{server.port}/v1", model="m", allow_private=True,
        resolver=to_local)
    with pytest.raises(EmbedderError, match="request failed"):
        trusting_nobody.embed(["a"])
    # The connection goes to a pinned address, but the name checked is still the endpoint's.
    wrong_name = OpenAICompatibleEmbedder(
        base_url=f"https://other.internal.test:{server.port}/v1", model="m", allow_private=True,
        ca_bundle=str(ca), resolver=to_local)
    with pytest.raises(EmbedderError, match="request failed"):
        wrong_name.embed(["a"])
    assert server.hits == []


def test_a_redirect_is_still_refused_with_a_ca_bundle(private_ca):
    from groundkit_datasette.embedding.embedders import OpenAICompatibleEmbedder
    from groundkit_datasette.errors import RedirectRefused

    ca, server = private_ca
    embedder = OpenAICompatibleEmbedder(
        base_url=f"https://embed.internal.test:{server.port}/moved", model="m",
        allow_private=True, ca_bundle=str(ca), resolver=resolver_for("127.0.0.1"))
    with pytest.raises(RedirectRefused) as error:
        embedder.embed(["a"])
    assert "169.254" not in str(error.value)
    assert [path for path, _host in server.hits] == ["/moved/embeddings"]


def test_a_bad_ca_bundle_is_refused_when_configured(tmp_path):
    from groundkit_datasette.embedding.embedders import get_embedder
    from groundkit_datasette.errors import EmbedderError

    (tmp_path / "junk.pem").write_text("not a certificate")
    for bundle in (str(tmp_path / "junk.pem"), str(tmp_path / "missing.pem")):
        with pytest.raises(EmbedderError, match="ca_bundle could not be read") as error:
            get_embedder("openai", base_url="https://api.example.com/v1", model="m",
                         ca_bundle=bundle)
        assert str(tmp_path) not in str(error.value)


# IANA special-purpose blocks, some of which this Python's ``ipaddress`` calls global
# (192.0.0.192 is a cloud metadata address on SSRF lists; Python 3.11 says is_global).
SPECIAL_PURPOSE_REFUSED = [
    "192.0.0.192",
    "192.0.0.9",
    "192.0.0.170",
    "192.0.2.10",
    "198.18.0.1",
    "198.51.100.7",
    "203.0.113.9",
    "192.88.99.1",
    "192.31.196.1",
    "192.52.193.1",
    "192.175.48.1",
    "::ffff:192.0.0.192",
    "64:ff9b::c000:c0",      # NAT64 form of 192.0.0.192
    "2002:c000:00c0::1",     # 6to4 form of 192.0.0.192
    "64:ff9b:1::1",
    "100::1",
    "2001:db8::1",
    "2001:2::1",
    "3fff::1",
    "5f00::1",
    "2620:4f:8000::1",
    "fec0::1",
    "::192.0.0.192",         # IPv4-compatible: outside global unicast
]


@pytest.mark.parametrize("addr", SPECIAL_PURPOSE_REFUSED)
def test_special_purpose_ranges_refused_on_every_python(addr):
    for allow_private in (False, True):
        with pytest.raises(UnsafeEndpoint):
            check_resolved("h.example", 443, allow_private=allow_private, resolver=resolver_for(addr))


def test_the_deny_list_does_not_rest_on_ipaddress_is_global():
    # At least one refused address is "global" to this Python's ipaddress module: the list,
    # not the library's classification, decides.
    assert any(ipaddress.ip_address(a).is_global for a in ["192.0.0.192", "192.0.0.9", "192.31.196.1"])


def test_literal_special_purpose_endpoint_is_refused_before_any_connection():
    with pytest.raises(UnsafeEndpoint):
        validate_endpoint("https://192.0.0.192/v1")
