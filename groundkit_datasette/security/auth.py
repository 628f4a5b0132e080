"""Who the caller is: OIDC bearer tokens (JWT) and static API tokens.

Identity comes from a verified token and nothing else; see adr/0006. The
Datasette side (``actor_from_request``, the 401/503 answers) is in
``access.py``; this module only turns an ``Authorization`` header into an
actor, or says why it cannot.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urlsplit

import httpx
import jwt

log = logging.getLogger("groundkit.auth")

#: Algorithms a token may be signed with: asymmetric only, so a public key can never act as a secret.
ASYMMETRIC_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
DEFAULT_ALGORITHMS = ("RS256", "ES256")
KEY_LIFETIME = 300.0  # seconds the published keys are trusted before they are fetched again
UNKNOWN_KID_COOLDOWN = 30.0  # an unknown kid refetches the keys at most this often
FAILURE_BACKOFF = 5.0  # after a failed fetch, answer "unavailable" at once for this long
FETCH_TIMEOUT = 5.0
MAX_JWKS_BYTES = 1024 * 1024
MAX_TOKEN_CHARS = 16 * 1024

_KEY_FAMILIES = {
    "RSA": {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"},
    "EC": {"ES256", "ES384", "ES512"},
    "OKP": {"EdDSA"},
}
_EC_CURVES = {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}
_BEARER = re.compile(r"^[A-Za-z0-9\-._~+/]+=*$")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[^\x00-\x1f\x7f]{1,256}$")


class InvalidToken(Exception):
    """The token was presented but does not verify (answered 401; the reason is only logged)."""


class ProviderUnavailable(Exception):
    """The identity provider's keys could not be fetched (answered 503)."""


# -- settings -------------------------------------------------------------------


@dataclass(frozen=True)
class OIDCConfig:
    issuer: str
    audience: tuple[str, ...]
    jwks_url: str
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    groups_claim: str = "groups"
    tenant_claim: str | None = None
    ca_file: str | None = None
    leeway_seconds: float = 0.0


@dataclass(frozen=True)
class StaticToken:
    id: str
    sha256: str = field(repr=False)
    groups: tuple[str, ...] = ()
    tenant: str | None = None


def _strings(value, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(v, str) and _NAME.match(v) for v in value
    ):
        raise ValueError(f"{what} must be a list of non-empty strings")
    return tuple(value)


def check_https_url(url, what: str) -> str:
    """An operator-configured https URL: loopback and private hosts are fine, plain http is not."""
    if not isinstance(url, str) or re.search(r"[\x00-\x20\x7f\\]", url):
        raise ValueError(f"{what} must be an https URL")
    parts = urlsplit(url)
    if parts.scheme.lower() != "https" or not parts.hostname:
        raise ValueError(f"{what} must be an https URL")
    if "@" in parts.netloc or parts.fragment:
        raise ValueError(f"{what} must not contain credentials or a fragment")
    return url


def parse_oidc(config) -> OIDCConfig | None:
    if config is None:
        return None
    if not isinstance(config, dict):
        raise ValueError("groundkit setting oidc must be a mapping")
    known = set(OIDCConfig.__dataclass_fields__)
    unknown = set(config) - known
    if unknown:
        raise ValueError(f"unknown groundkit oidc settings: {', '.join(sorted(unknown))}")
    for key in ("issuer", "audience", "jwks_url"):
        if not config.get(key):
            raise ValueError(f"groundkit oidc setting {key} is required")
    if not isinstance(config["issuer"], str):
        raise ValueError("groundkit oidc issuer must be a string")
    algorithms = _strings(config.get("algorithms", DEFAULT_ALGORITHMS), "oidc algorithms")
    weak = [a for a in algorithms if a not in ASYMMETRIC_ALGORITHMS]
    if weak or not algorithms:
        raise ValueError(
            "groundkit oidc algorithms must be asymmetric (RS*, PS*, ES*, EdDSA); "
            "none and shared-secret algorithms are refused"
        )
    tenant = config.get("tenant_claim")
    if tenant is not None and not isinstance(tenant, str):
        raise ValueError("groundkit oidc tenant_claim must be a string")
    groups_claim = config.get("groups_claim", "groups")
    if not isinstance(groups_claim, str) or not groups_claim:
        raise ValueError("groundkit oidc groups_claim must be a string")
    leeway = config.get("leeway_seconds", 0)
    if not isinstance(leeway, (int, float)) or not 0 <= leeway <= 300:
        raise ValueError("groundkit oidc leeway_seconds must be between 0 and 300")
    ca_file = config.get("ca_file")
    if ca_file is not None:
        ca_file = str(ca_file)
        ssl.create_default_context(cafile=ca_file)  # fail at start-up, not on the first request
    return OIDCConfig(
        issuer=config["issuer"],
        audience=_strings(config["audience"], "oidc audience"),
        jwks_url=check_https_url(config["jwks_url"], "groundkit oidc jwks_url"),
        algorithms=algorithms,
        groups_claim=groups_claim,
        tenant_claim=tenant,
        ca_file=ca_file,
        leeway_seconds=float(leeway),
    )


def parse_tokens(config) -> tuple[StaticToken, ...]:
    if config is None:
        return ()
    if not isinstance(config, list):
        raise ValueError("groundkit setting tokens must be a list")
    tokens, ids = [], set()
    for entry in config:
        if not isinstance(entry, dict) or set(entry) - {"id", "sha256", "groups", "tenant"}:
            raise ValueError("each groundkit token is {id, sha256, groups, tenant}")
        token_id, digest = entry.get("id"), entry.get("sha256")
        if not isinstance(token_id, str) or not _NAME.match(token_id):
            raise ValueError("each groundkit token needs an id")
        if not isinstance(digest, str) or not _SHA256_HEX.match(digest.lower()):
            # The message names the token's id, never the configured value.
            raise ValueError(f"groundkit token {token_id}: sha256 must be 64 hex digits")
        if token_id in ids:
            raise ValueError(f"groundkit token id {token_id} appears twice")
        ids.add(token_id)
        tenant = entry.get("tenant")
        if tenant is not None and not isinstance(tenant, str):
            raise ValueError(f"groundkit token {token_id}: tenant must be a string")
        tokens.append(
            StaticToken(
                id=token_id,
                sha256=digest.lower(),
                groups=_strings(entry.get("groups", []), "token groups"),
                tenant=tenant,
            )
        )
    return tuple(tokens)


def hash_token(token: str) -> str:
    """What goes in a ``tokens`` entry's ``sha256``."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


# -- OIDC -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Key:
    key: object
    algorithms: tuple[str, ...]


class OIDCVerifier:
    """Verifies JWT access tokens against a provider's published keys (JWKS).

    Synchronous on purpose: it runs in a worker thread, so a slow provider
    holds up only the requests waiting for it. ``clock`` is injectable for tests.
    """

    def __init__(self, config: OIDCConfig, *, clock: Callable[[], float] = time.monotonic,
                 timeout: float = FETCH_TIMEOUT):
        self.config = config
        self.clock = clock
        self.timeout = timeout
        self._keys: dict[str, _Key] = {}
        self._fetched_at: float | None = None
        self._attempted_at: float | None = None
        self._failed_at: float | None = None
        self._lock = threading.Lock()
        self.fetches = 0  # for operators' metrics and tests

    # keys

    def _usable(self, jwk: dict) -> tuple[str, _Key] | None:
        kid = jwk.get("kid")
        if not isinstance(kid, str) or not kid:
            return None  # a token must name its key, so a key without a name is unreachable
        if jwk.get("use") not in (None, "sig"):
            return None
        kty = jwk.get("kty")
        family = _KEY_FAMILIES.get(kty)
        if family is None:  # "oct" (shared secrets) and unknown types
            return None
        allowed = [a for a in self.config.algorithms if a in family]
        declared = jwk.get("alg")
        if declared is not None:
            allowed = [a for a in allowed if a == declared]
        elif kty == "EC":
            allowed = [a for a in allowed if a == _EC_CURVES.get(jwk.get("crv"))]
        if not allowed:
            return None
        try:
            key = jwt.PyJWK(jwk, algorithm=allowed[0]).key
        except Exception:  # a malformed key is skipped, like an unusable one
            return None
        return kid, _Key(key, tuple(allowed))

    def _fetch(self) -> None:
        """Replace the key set; raise ProviderUnavailable on any failure (the old set is dropped)."""
        now = self.clock()
        self._attempted_at = now
        self.fetches += 1
        verify: ssl.SSLContext | bool = True
        if self.config.ca_file:
            verify = ssl.create_default_context(cafile=self.config.ca_file)
        try:
            with httpx.Client(timeout=self.timeout, verify=verify, follow_redirects=False) as client:
                with client.stream("GET", self.config.jwks_url,
                                   headers={"Accept": "application/json"}) as response:
                    if response.status_code != 200:
                        raise ProviderUnavailable(f"JWKS endpoint answered HTTP {response.status_code}")
                    body = bytearray()
                    for chunk in response.iter_bytes():
                        body += chunk
                        if len(body) > MAX_JWKS_BYTES:
                            raise ProviderUnavailable("JWKS document is too large")
            document = json.loads(bytes(body))
            raw_keys = document.get("keys") if isinstance(document, dict) else None
            if not isinstance(raw_keys, list):
                raise ProviderUnavailable("JWKS document has no keys list")
            keys = dict(k for k in map(self._usable, (j for j in raw_keys if isinstance(j, dict))) if k)
            if not keys:
                raise ProviderUnavailable("JWKS document has no usable signing keys")
        except ProviderUnavailable as exc:
            self._fail(str(exc))
        except Exception as exc:  # network, TLS, JSON: all mean "no keys now"
            self._fail(type(exc).__name__)
        self._keys = keys
        self._fetched_at = now
        self._failed_at = None
        log.info("fetched %d signing keys from the OIDC provider", len(keys))

    def _fail(self, reason: str):
        self._keys = {}
        self._fetched_at = None
        self._failed_at = self.clock()
        log.warning("could not fetch the OIDC provider's keys: %s", reason)
        raise ProviderUnavailable("identity provider unavailable") from None

    def _key_for(self, kid: str) -> _Key:
        with self._lock:
            now = self.clock()
            if self._failed_at is not None and now - self._failed_at < FAILURE_BACKOFF:
                raise ProviderUnavailable("identity provider unavailable")
            if self._fetched_at is None or now - self._fetched_at >= KEY_LIFETIME:
                self._fetch()
            key = self._keys.get(kid)
            if key is None and (
                self._attempted_at is None or now - self._attempted_at >= UNKNOWN_KID_COOLDOWN
            ):
                self._fetch()  # maybe the provider rotated its keys
                key = self._keys.get(kid)
        if key is None:
            raise InvalidToken("unknown key id")
        return key

    # tokens

    def verify(self, token: str) -> dict:
        """The actor for a valid token; raises InvalidToken or ProviderUnavailable."""
        cfg = self.config
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise InvalidToken("malformed token") from None
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise InvalidToken("token names no key (kid)")
        if header.get("alg") not in cfg.algorithms:
            # Refused before any key is fetched; the key's own algorithm decides below anyway.
            raise InvalidToken("token algorithm not allowed")
        key = self._key_for(kid)
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=list(key.algorithms),
                audience=list(cfg.audience),
                issuer=cfg.issuer,
                leeway=cfg.leeway_seconds,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise InvalidToken(type(exc).__name__) from None
        return self.actor(claims)

    def actor(self, claims: dict) -> dict:
        cfg = self.config
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub:
            raise InvalidToken("token has no subject")
        groups = _claim(claims, cfg.groups_claim)
        if groups is None:
            groups = []
        elif isinstance(groups, str):
            groups = [groups]
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise InvalidToken("groups claim is not a list of strings")
        actor = {"id": sub, "groups": groups, "auth": "oidc"}
        if cfg.tenant_claim:
            tenant = _claim(claims, cfg.tenant_claim)
            if tenant is not None:
                if not isinstance(tenant, str):
                    raise InvalidToken("tenant claim is not a string")
                actor["tenant"] = tenant
        return actor


def _claim(claims: dict, path: str):
    """A claim by name, or by dotted path into nested objects (Keycloak's ``realm_access.roles``)."""
    if path in claims:
        return claims[path]
    value = claims
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


# -- static tokens and the combined authenticator -----------------------------------


def match_static(tokens: tuple[StaticToken, ...], presented: str) -> dict | None:
    """Constant-time comparison of the presented token's hash with every configured hash."""
    digest = hash_token(presented)
    found = None
    for entry in tokens:  # no early exit: every entry is compared
        if hmac.compare_digest(digest, entry.sha256):
            found = entry
    if found is None:
        return None
    actor = {"id": found.id, "groups": list(found.groups), "auth": "token"}
    if found.tenant is not None:
        actor["tenant"] = found.tenant
    return actor


@dataclass(frozen=True)
class Outcome:
    """``state`` is ``absent`` (no bearer token for us), ``ok``, ``invalid`` or ``unavailable``."""

    state: str
    actor: dict | None = None


ABSENT = Outcome("absent")


class Authenticator:
    """Static tokens first (a hash compare), then OIDC for anything shaped like a JWT."""

    def __init__(self, tokens: tuple[StaticToken, ...] = (), oidc: OIDCConfig | None = None):
        self.tokens = tokens
        self.oidc = OIDCVerifier(oidc) if oidc is not None else None

    @property
    def configured(self) -> bool:
        return bool(self.tokens) or self.oidc is not None

    @staticmethod
    def bearer(authorization: list[str]) -> str | None:
        """The bearer token, ``""`` for a malformed one, None when there is none."""
        bearers = [v for v in authorization if v[:7].lower() == "bearer "]
        if not bearers:
            return None
        if len(bearers) > 1:
            return ""
        token = bearers[0][7:].strip()
        if not token or len(token) > MAX_TOKEN_CHARS or not _BEARER.match(token):
            return ""
        return token

    def authenticate(self, authorization: list[str]) -> Outcome:
        """Blocking (OIDC may fetch keys): call it from a worker thread."""
        if not self.configured:
            return ABSENT  # the header belongs to some other authentication plugin, if any
        token = self.bearer(authorization)
        if token is None:
            return ABSENT
        if not token:
            return Outcome("invalid")
        actor = match_static(self.tokens, token)
        if actor is not None:
            return Outcome("ok", actor)
        if self.oidc is not None and token.count(".") == 2:
            try:
                return Outcome("ok", self.oidc.verify(token))
            except InvalidToken as exc:
                log.info("bearer token refused: %s", exc)
                return Outcome("invalid")
            except ProviderUnavailable:
                return Outcome("unavailable")
            except Exception:  # a verifier fault refuses the token rather than failing open
                log.exception("bearer token verification failed unexpectedly")
                return Outcome("invalid")
        return Outcome("invalid")
