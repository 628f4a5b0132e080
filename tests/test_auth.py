"""Who the caller is: OIDC bearer tokens verified against a real JWKS endpoint served over
HTTPS (a CA made here is the only trust root), static API tokens, and no request field that
could name a caller."""

import base64
import datetime
import hashlib
import hmac
import http.server
import json
import re
import socket
import ssl
import threading
import time

import httpx
import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from datasette.app import Datasette

from groundkit_datasette.security import auth as gk_auth
from groundkit_datasette.security.boundary import authenticator_for
from groundkit_datasette.surfaces.service import settings_for
from groundkit_datasette.security.auth import hash_token
from groundkit_datasette.indexing.ingest import ingest
from groundkit_datasette.surfaces.mcp_schema import input_schema
from groundkit_datasette.surfaces.tools import all_tools

ISSUER = "https://login.test/realms/acme"
AUDIENCE = "groundkit"
PUBLISHED = "http://192.0.2.7"  # a non-loopback server address: published mode


# -- a real HTTPS JWKS endpoint ------------------------------------------------------------


def _name(cn):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_pki(directory):
    """A CA, and a server certificate for 127.0.0.1 signed by it. Returns file paths."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("groundkit test CA")).issuer_name(_name("groundkit test CA"))
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1")).issuer_name(ca.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {name: directory / f"{name}.pem" for name in ("ca", "cert", "key")}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


class JWKSServer:
    """Serves ``self.jwks`` at /jwks.json over TLS; ``mode`` is ok, error or hang."""

    def __init__(self, pki):
        self.jwks = {"keys": []}
        self.hits = 0
        self.mode = "ok"
        self.held = threading.Event()  # a "hang" request is being held
        self.release = threading.Event()  # ends the hold (at most 60 s)
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                owner.hits += 1
                if owner.mode == "hang":
                    owner.held.set()
                    owner.release.wait(60)
                if owner.mode == "error":
                    self.send_response(500)
                    self.end_headers()
                    return
                body = json.dumps(owner.jwks).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki["cert"], pki["key"])
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.url = f"https://127.0.0.1:{self.port}/jwks.json"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def public_jwk(private_key, kid, **extra):
    if isinstance(private_key, rsa.RSAPrivateKey):
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private_key.public_key()))
    else:
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(private_key.public_key()))
    jwk.update(kid=kid, **extra)
    return jwk


@pytest.fixture(scope="module")
def keys():
    return {
        "rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "ec": ec.generate_private_key(ec.SECP256R1()),
        "attacker": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "rotated": rsa.generate_private_key(public_exponent=65537, key_size=2048),
    }


HMAC_SECRET = b"a-shared-secret-published-by-mistake"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def jwks(pki, keys):
    server = JWKSServer(pki)
    server.jwks = {"keys": [
        public_jwk(keys["rsa"], "rsa-1", alg="RS256", use="sig"),
        public_jwk(keys["ec"], "ec-1"),  # no "alg": ES256 follows from the P-256 curve
        # A symmetric key in the set must never be used, whatever a token says.
        {"kty": "oct", "kid": "hmac-1", "k": base64.urlsafe_b64encode(HMAC_SECRET).decode().rstrip("=")},
    ]}
    yield server
    server.stop()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from .conftest import write_corpus

    root = tmp_path_factory.mktemp("auth")
    corpus = write_corpus(root / "corpus")
    index_dir = root / "index"
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    return corpus, index_dir


def oidc_config(jwks, pki, **overrides):
    config = {"issuer": ISSUER, "audience": AUDIENCE, "jwks_url": jwks.url, "ca_file": str(pki["ca"]),
              "groups_claim": "groups", "tenant_claim": "tid"}
    config.update(overrides)
    return config


def make_ds(built, **config):
    corpus, index_dir = built
    return Datasette(files=[], immutables=[str(index_dir / "energy.sqlite3")], metadata={
        "plugins": {"groundkit": {"base_dir": str(corpus), "allow_remote_access": True, **config}}})


def client_for(ds, url=PUBLISHED):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=ds.app()), base_url=url)


def token(key, kid="rsa-1", alg="RS256", **claims):
    now = int(time.time())
    payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": "user-1", "iat": now, "exp": now + 300,
               "groups": ["hr", "/acme/ops"], "tid": "acme"}
    payload.update(claims)
    payload = {k: v for k, v in payload.items() if v is not None}
    headers = {"kid": kid} if kid else {}
    return jwt.encode(payload, key, algorithm=alg, headers=headers)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def forged(header: dict, payload: dict, sign) -> str:
    signing_input = b64(json.dumps(header).encode()) + "." + b64(json.dumps(payload).encode())
    return signing_input + "." + b64(sign(signing_input.encode()))


def claims(**extra):
    now = int(time.time())
    return {"iss": ISSUER, "aud": AUDIENCE, "sub": "mallory", "iat": now, "exp": now + 300,
            "groups": ["admins"], **extra}


async def get(client, path, bearer=None):
    headers = {"authorization": f"Bearer {bearer}"} if bearer is not None else {}
    return await client.get(path, headers=headers)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


# -- OIDC ------------------------------------------------------------------------------------


async def test_valid_tokens_become_the_actor(built, jwks, pki, keys):
    ds = make_ds(built, oidc=oidc_config(jwks, pki))
    async with client_for(ds) as client:
        for bearer in (token(keys["rsa"]), token(keys["ec"], kid="ec-1", alg="ES256")):
            r = await get(client, "/-/groundkit/collections.json", bearer)
            assert r.status_code == 200 and r.json() == {"collections": ["energy"]}
            r = await get(client, "/-/actor.json", bearer)
            assert r.json()["actor"] == {"id": "user-1", "groups": ["hr", "/acme/ops"],
                                         "tenant": "acme", "auth": "oidc"}
        r = await get(client, "/-/groundkit/collections.json")
        assert r.status_code == 401 and r.json()["error"] == "authentication_required"
    assert jwks.hits == 1  # both keys came from one fetch


def test_nested_group_claims_and_a_missing_tenant(built, jwks, pki, keys):
    config = gk_auth.parse_oidc(oidc_config(jwks, pki, groups_claim="realm_access.roles"))
    verifier = gk_auth.OIDCVerifier(config)
    actor = verifier.verify(token(keys["rsa"], groups=None, tid=None,
                                  realm_access={"roles": ["reader"]}))
    assert actor == {"id": "user-1", "groups": ["reader"], "auth": "oidc"}


def bad_tokens(keys):
    public_pem = keys["rsa"].public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    now = int(time.time())
    return {
        "expired": token(keys["rsa"], exp=now - 3600, iat=now - 7200),
        "wrong audience": token(keys["rsa"], aud="another-api"),
        "wrong issuer": token(keys["rsa"], iss="https://evil.test/"),
        "no expiry": token(keys["rsa"], exp=None),
        "no subject": token(keys["rsa"], sub=None),
        "groups not a list": token(keys["rsa"], groups={"admin": True}),
        "missing kid": token(keys["rsa"], kid=None),
        "signed by another key under a known kid": token(keys["attacker"]),
        "alg none": forged({"alg": "none", "typ": "JWT", "kid": "rsa-1"}, claims(), lambda m: b""),
        "HS256 with the public key as secret": forged(
            {"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}, claims(),
            lambda m: hmac.new(public_pem, m, hashlib.sha256).digest()),
        "HS256 with a symmetric key from the set": forged(
            {"alg": "HS256", "typ": "JWT", "kid": "hmac-1"}, claims(),
            lambda m: hmac.new(HMAC_SECRET, m, hashlib.sha256).digest()),
        "RS256 header on the EC key": forged(
            {"alg": "RS256", "typ": "JWT", "kid": "ec-1"}, claims(),
            lambda m: keys["ec"].sign(m, ec.ECDSA(hashes.SHA256()))),
        "garbage": "abc.def.ghi",
        "not a JWT": "definitely-not-a-token",
    }


async def test_tokens_that_fail_verification_answer_401(built, jwks, pki, keys):
    ds = make_ds(built, oidc=oidc_config(jwks, pki))
    async with client_for(ds) as client:
        for name, bearer in bad_tokens(keys).items():
            r = await get(client, "/energy/-/groundkit/status.json", bearer)
            assert r.status_code == 401, (name, r.text)
            assert r.json()["error"] == "invalid_token", name
            assert 'error="invalid_token"' in r.headers["www-authenticate"]
            assert bearer[:20] not in r.text and "documents" not in r.text
            # The boundary is the whole instance: Datasette's own pages refuse it alike.
            r = await get(client, "/-/actor.json", bearer)
            assert r.status_code == 401 and r.json()["error"] == "invalid_token", name


async def test_an_invalid_token_is_refused_on_loopback_too(built, jwks, pki, keys):
    ds = make_ds(built, oidc=oidc_config(jwks, pki), allow_remote_access=False)
    assert (await ds.client.get("/-/groundkit/collections.json")).status_code == 200  # anonymous
    r = await ds.client.get("/-/groundkit/collections.json",
                            headers={"authorization": "Bearer " + bad_tokens(keys)["expired"]})
    assert r.status_code == 401
    r = await ds.client.get("/-/groundkit/collections.json",
                            headers={"authorization": "Bearer " + token(keys["rsa"])})
    assert r.status_code == 200


async def test_unknown_kid_refetches_at_most_every_30_seconds(built, jwks, pki, keys):
    ds = make_ds(built, oidc=oidc_config(jwks, pki))
    clock = Clock()
    authenticator_for(ds, settings_for(ds)).oidc.clock = clock
    rotated = token(keys["rotated"], kid="rsa-2")
    async with client_for(ds) as client:
        assert (await get(client, "/-/groundkit/collections.json", token(keys["rsa"]))).status_code == 200
        assert jwks.hits == 1
        for step in range(5):  # a flood of made-up key ids inside the cooldown fetches nothing
            clock.now += 5
            r = await get(client, "/-/groundkit/collections.json", token(keys["rsa"], kid=f"made-up-{step}"))
            assert r.status_code == 401
        assert jwks.hits == 1
        clock.now += 6  # 31 s after the last fetch
        assert (await get(client, "/-/groundkit/collections.json", rotated)).status_code == 401
        assert jwks.hits == 2
        # The provider rotates in a new key; it is picked up after the cooldown, not before.
        jwks.jwks = {"keys": jwks.jwks["keys"] + [public_jwk(keys["rotated"], "rsa-2", alg="RS256")]}
        clock.now += 10
        assert (await get(client, "/-/groundkit/collections.json", rotated)).status_code == 401
        assert jwks.hits == 2
        clock.now += 21
        assert (await get(client, "/-/groundkit/collections.json", rotated)).status_code == 200
        assert jwks.hits == 3


async def test_keys_are_kept_300_seconds(built, jwks, pki, keys):
    ds = make_ds(built, oidc=oidc_config(jwks, pki))
    clock = Clock()
    authenticator_for(ds, settings_for(ds)).oidc.clock = clock
    async with client_for(ds) as client:
        for _ in range(3):
            assert (await get(client, "/-/groundkit/collections.json", token(keys["rsa"]))).status_code == 200
            clock.now += 99
        assert jwks.hits == 1
        clock.now += 4  # 301 s
        # The provider dropped the key: past the lifetime it stops verifying.
        jwks.jwks = {"keys": [public_jwk(keys["ec"], "ec-1")]}
        assert (await get(client, "/-/groundkit/collections.json", token(keys["rsa"]))).status_code == 401
        assert jwks.hits == 2


async def test_provider_unreachable_answers_503_with_nothing(built, jwks, pki, keys):
    ds = make_ds(built, oidc=oidc_config(jwks, pki),
                 tokens=[{"id": "ci-bot", "sha256": hash_token("static-token-1")}])
    clock = Clock()
    authenticator_for(ds, settings_for(ds)).oidc.clock = clock
    async with client_for(ds) as client:
        assert (await get(client, "/energy/-/groundkit/status.json", token(keys["rsa"]))).status_code == 200
        jwks.mode = "error"
        clock.now += 301
        r = await client.post("/energy/-/groundkit/search.json", content=json.dumps({"query": "wind"}),
                              headers={"authorization": "Bearer " + token(keys["rsa"]),
                                       "content-type": "application/json"})
        assert r.status_code == 503 and r.json()["error"] == "authentication_unavailable"
        assert set(r.json()) == {"ok", "error", "detail", "request_id"} and "wind" not in r.text
        # Static tokens do not depend on the provider.
        assert (await get(client, "/energy/-/groundkit/status.json", "static-token-1")).status_code == 200
        jwks.mode = "ok"
        clock.now += 6  # past the failure back-off
        assert (await get(client, "/energy/-/groundkit/status.json", token(keys["rsa"]))).status_code == 200


async def test_provider_down_hanging_or_untrusted_answers_503(built, jwks, pki, keys):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    closed_port = sock.getsockname()[1]
    sock.close()
    cases = {
        "refused": oidc_config(jwks, pki, jwks_url=f"https://127.0.0.1:{closed_port}/jwks.json"),
        "untrusted certificate": {k: v for k, v in oidc_config(jwks, pki).items() if k != "ca_file"},
        "hangs": oidc_config(jwks, pki),
    }
    for name, config in cases.items():
        ds = make_ds(built, oidc=config)
        if name == "hangs":
            jwks.mode = "hang"
            authenticator_for(ds, settings_for(ds)).oidc.timeout = 0.5
        async with client_for(ds) as client:
            r = await get(client, "/-/groundkit/collections.json", token(keys["rsa"]))
        assert r.status_code == 503, (name, r.text)
        assert r.json()["error"] == "authentication_unavailable" and "energy" not in r.text
        if name == "hangs":
            # The answer came while the provider still held the request: the fetch gave up on its
            # own timeout (no wall-clock bound here: a loaded machine stretches any).
            assert jwks.held.is_set() and not jwks.release.is_set()
            jwks.release.set()
    jwks.mode = "ok"


async def test_the_fetch_timeout_is_five_seconds(built, jwks, pki, keys, monkeypatch):
    """The server's own key fetch (not a constant) bounds connect, read, write and pool waits by 5 s."""
    timeouts = []
    real_client = httpx.Client

    def recording_client(*args, **kwargs):
        timeouts.append(httpx.Timeout(kwargs.get("timeout")))
        return real_client(*args, **kwargs)

    monkeypatch.setattr(gk_auth.httpx, "Client", recording_client)
    ds = make_ds(built, oidc=oidc_config(jwks, pki))
    async with client_for(ds) as client:
        assert (await get(client, "/-/groundkit/collections.json", token(keys["rsa"]))).status_code == 200
    assert jwks.hits == 1 and timeouts == [httpx.Timeout(5.0)]


@pytest.mark.parametrize("change,message", [
    ({"jwks_url": "http://127.0.0.1/jwks.json"}, "https"),
    ({"jwks_url": "https://user:pw@login.test/jwks.json"}, "credentials"),
    ({"algorithms": ["RS256", "HS256"]}, "asymmetric"),
    ({"algorithms": ["none"]}, "asymmetric"),
    ({"audience": None}, "audience"),
    ({"issuer": None}, "issuer"),
    ({"jwks_uri": "https://x"}, "jwks_uri"),
])
async def test_unsafe_oidc_settings_fail_start_up(built, jwks, pki, change, message):
    config = oidc_config(jwks, pki)
    config.update(change)
    config = {k: v for k, v in config.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        await make_ds(built, oidc=config).invoke_startup()


# -- static tokens ---------------------------------------------------------------------------


async def test_static_tokens(built, monkeypatch):
    tokens = [
        {"id": "ci-bot", "sha256": hash_token("first-secret-token"), "groups": ["ci"]},
        {"id": "report-bot", "sha256": hash_token("second-secret-token").upper(), "tenant": "acme"},
    ]
    ds = make_ds(built, tokens=tokens)
    compared = []
    real = hmac.compare_digest
    monkeypatch.setattr(gk_auth.hmac, "compare_digest", lambda a, b: compared.append(1) or real(a, b))
    async with client_for(ds) as client:
        r = await get(client, "/-/actor.json", "first-secret-token")
        assert r.json()["actor"] == {"id": "ci-bot", "groups": ["ci"], "auth": "token"}
        assert len(compared) == 2  # every configured token is compared, even after a match
        r = await get(client, "/-/actor.json", "second-secret-token")
        assert r.json()["actor"] == {"id": "report-bot", "groups": [], "tenant": "acme", "auth": "token"}
        for wrong in ("first-secret-token2", "first-secret-tokeN", "", "a" * 20000, "x y"):
            r = await client.get("/-/groundkit/collections.json",
                                 headers={"authorization": f"Bearer {wrong}"})
            assert r.status_code == 401 and "secret" not in r.text, repr(wrong[:30])
        r = await client.get("/-/groundkit/collections.json",
                             headers={"authorization": "Basic Zmlyc3Q6c2Vjb25k"})
        assert r.status_code == 401 and r.json()["error"] == "authentication_required"


@pytest.mark.parametrize("tokens", [
    [{"id": "a", "sha256": "not-hex"}],
    [{"id": "a", "sha256": hash_token("x")[:-1]}],
    [{"id": "a", "sha256": hash_token("x")}, {"id": "a", "sha256": hash_token("y")}],
    [{"id": "a", "sha256": hash_token("x"), "user": "root"}],
    [{"sha256": hash_token("x")}],
])
async def test_bad_token_settings_fail_start_up_without_echoing(built, tokens):
    with pytest.raises(ValueError) as info:
        await make_ds(built, tokens=tokens).invoke_startup()
    assert "not-hex" not in str(info.value) and hash_token("x")[:16] not in str(info.value)


# -- identity comes from the token only -------------------------------------------------------

# ``group_by_document`` groups hits, not callers: the one "group" a request may name.
FORBIDDEN = re.compile(
    r"user|group(?!_by_document$)|tenant|actor|principal|role|subject|identity|auth|token|endpoint|url|uri|host"
    r"|dir|path|model|embedder|reranker|base_|api_key", re.I)


def property_names(schema):
    """Every property name anywhere in a JSON schema, $defs included."""
    names = set()
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "properties" and isinstance(value, dict):
                names |= set(value)
            names |= property_names(value)
    elif isinstance(schema, list):
        for value in schema:
            names |= property_names(value)
    return names


def test_no_request_field_names_a_caller_an_endpoint_a_directory_or_a_model():
    tools = all_tools()
    assert {t.name for t in tools} >= {"list_collections", "index_status", "search", "fetch_chunk"}
    seen = set()
    for tool in tools:
        for schema in (tool.request_model.model_json_schema(), input_schema(tool)):
            names = property_names(schema)
            seen |= names
            assert not [n for n in names if FORBIDDEN.search(n)], (tool.name, names)
            assert schema.get("additionalProperties", False) is False or tool.request_model.model_config.get("extra") == "forbid"
        assert tool.request_model.model_config.get("extra") == "forbid", tool.name
    assert {"query", "top_k", "collection", "chunk_id"} <= seen  # the walk did see fields


async def test_a_body_cannot_claim_an_identity(built):
    ds = make_ds(built, allow_remote_access=False)
    for field in ("user", "groups", "tenant", "actor", "embedder", "index_dir", "base_url"):
        r = await ds.client.post("/energy/-/groundkit/search.json",
                                 content=json.dumps({"query": "wind", field: "root"}),
                                 headers={"content-type": "application/json"})
        assert r.status_code == 422 and r.json()["detail"] == "unknown fields are not allowed"
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "search", "arguments": {"collection": "energy", "query": "wind", field: "root"}}}
        r = await ds.client.post("/-/groundkit/mcp", content=json.dumps(body), headers={
            "content-type": "application/json", "accept": "application/json, text/event-stream"})
        result = r.json()["result"]
        assert result["isError"] and result["_meta"]["groundkit/error"]["error"] == "malformed_request"
