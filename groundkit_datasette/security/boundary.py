"""Who may reach groundkit at all: loopback by default, Host/Origin checks, and
"published means authenticated".

One ASGI wrapper around the whole Datasette app decides, before any view runs,
for every *guarded* request: the groundkit routes (``/-/groundkit`` anywhere in
the path, MCP included) and Datasette's own pages of a collection database
(``/energy/chunks`` would otherwise serve the same corpus). Other databases and
Datasette's own pages are left to Datasette.

Polarity note: ``outbound.py`` refuses loopback because reaching it from a
provider call is SSRF; this module requires loopback because an inbound socket
anywhere else publishes the corpus. Same ``ipaddress`` classification, opposite
verdict; they are not to be merged.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
import uuid
from urllib.parse import urlsplit


from .auth import ABSENT, Authenticator, Outcome
from ..logs import REQUEST_LINE
from .outbound import classify_address
from ..errors import ErrorInfo

log = logging.getLogger("groundkit")
access_log = logging.getLogger("groundkit.access")

GUARD_MARK = "/-/groundkit"
# Per-request authentication result, so the token is verified once per request
# although both this wrapper and Datasette's own actor lookup ask for it.
AUTH_SCOPE_KEY = "groundkit.auth"
# The route shape of this request for log lines (never its query string).
ROUTE_SCOPE_KEY = "groundkit.route"
LOOPBACK_NAMES = frozenset({"localhost", "localhost."})
_PORT = re.compile(r"^:[0-9]{1,5}$")
# Datasette actions that read a collection's tables directly, bypassing document permissions.
RAW_READ_ACTIONS = frozenset({"view-table", "view-query", "execute-sql", "view-database-download"})


# -- classification -------------------------------------------------------------


def loopback_ip(text: str) -> bool:
    """True for an IPv4 127/8 or IPv6 ``::1`` literal, IPv4-mapped spellings included.

    6to4, Teredo and NAT64 addresses are unwrapped only to be *refused*: such an
    address lives on a routable IPv6 interface whatever IPv4 address it embeds,
    so an embedded 127.0.0.1 does not make the socket local. Classification never
    depends on the interpreter's own ``is_loopback`` treatment of mapped forms.
    """
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return False
    if ip.version == 6:
        if getattr(ip, "scope_id", None):
            return False
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped.is_loopback
        if classify_address(ip) != ip:  # 6to4, Teredo, NAT64
            return False
        return ip == ipaddress.IPv6Address("::1")
    return ip.is_loopback


def loopback_socket(server) -> bool:
    """Whether the ASGI ``server`` (this connection's local address) is loopback.

    A missing address (a Unix socket, for one) is not loopback: the caller is
    whoever the socket's owner lets in, typically a reverse proxy, so it is
    treated as published and needs ``allow_remote_access``.
    """
    if not server or not isinstance(server[0], str):
        return False
    host = server[0].strip().lower()
    if host in LOOPBACK_NAMES:  # in-process clients (httpx's ASGITransport) name the server
        return True
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return loopback_ip(host)


def loopback_host_header(value: str) -> bool:
    """Whether a ``Host`` value names this machine's loopback, with or without a port."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return False
        host, rest = value[1:end], value[end + 1 :]
        if rest and not _PORT.match(rest):
            return False
        return ":" in host and "%" not in host and loopback_ip(host)
    host, colon, port = value.partition(":")
    if colon and not _PORT.match(colon + port):
        return False
    if host in LOOPBACK_NAMES:
        return True
    return "." in host and loopback_ip(host)  # dotted-quad only: no "2130706433" spellings


def loopback_origin(value: str) -> bool:
    """Whether an ``Origin`` is a page served from this machine's loopback."""
    try:
        parts = urlsplit(value.strip())
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or parts.path not in ("", "/"):
        return False
    if parts.query or parts.fragment or "@" in parts.netloc:
        return False
    return loopback_host_header(parts.netloc)


# -- which requests are open ----------------------------------------------------------
#
# The boundary is the whole Datasette instance (adr/0011): every HTTP path, Datasette's own
# and any plugin's, is refused off loopback, under a foreign Host or Origin, and without an
# actor on a published server. The only paths that skip *authentication* are static assets:
# files shipped in Datasette's and plugins' packages, the same for every installation, which
# hold no corpus data. Loopback, Host and Origin apply to them too.

STATIC_PREFIXES = ("/-/static/", "/-/static-plugins/")
STATIC_PATHS = frozenset({"/favicon.ico"})


def _paths(scope) -> list[str]:
    out = [scope.get("path") or ""]
    raw = scope.get("raw_path")
    if raw:
        out.append(raw.decode("latin-1"))
    return [p.partition("?")[0] for p in out]


# Datasette's pages that show how the instance is configured: the database list names each
# database's file path on the server; /-/metadata (0.65) and /-/config (1.0) show the plugin
# settings (token hashes, the OIDC provider, directories).
_CONFIGURATION_PAGES = re.compile(r"/-/(databases|metadata|config)(\.json)?/?")


def _strip_base_url(datasette, path: str) -> str:
    base_url = datasette.setting("base_url") or "/"
    if base_url != "/" and path.startswith(base_url):
        return "/" + path[len(base_url) :]
    return path


def is_configuration_page(datasette, scope) -> bool:
    return any(_CONFIGURATION_PAGES.fullmatch(_strip_base_url(datasette, p)) for p in _paths(scope))


def _is_asset(path: str) -> bool:
    if path in STATIC_PATHS:
        return True
    if not path.startswith(STATIC_PREFIXES):
        return False
    # Encoded separators or dot segments could reach a route other than the asset server.
    lowered = path.lower()
    return "/../" not in path and "%2f" not in lowered and "%2e" not in lowered and "\\" not in path


def is_open_asset(datasette, scope) -> bool:
    """Whether every spelling of this request's path is a static asset (no authentication)."""
    return all(_is_asset(_strip_base_url(datasette, p)) for p in _paths(scope))


def is_public_path(datasette, scope, public_paths) -> bool:
    """Paths an operator opened to anonymous callers (a login page of another plugin)."""
    if not public_paths:
        return False
    paths = [_strip_base_url(datasette, p) for p in _paths(scope)]
    return all(
        any(p == pub or (pub.endswith("/") and p.startswith(pub)) for pub in public_paths)
        for p in paths
    )


# -- authentication ---------------------------------------------------------------------


def authenticator_for(datasette, settings) -> Authenticator:
    """One authenticator per Datasette instance (it caches the provider's keys)."""
    auth = getattr(datasette, "_groundkit_authenticator", None)
    if auth is None:
        auth = Authenticator(settings.tokens, settings.oidc)
        datasette._groundkit_authenticator = auth
    return auth


def _header_values(scope, name: bytes) -> list[str]:
    return [v.decode("latin-1") for k, v in scope.get("headers") or [] if k.lower() == name]


async def authenticate_scope(datasette, settings, scope) -> Outcome:
    cached = scope.get(AUTH_SCOPE_KEY)
    if isinstance(cached, Outcome):
        return cached
    auth = authenticator_for(datasette, settings)
    if not auth.configured:
        return ABSENT
    authorization = _header_values(scope, b"authorization")
    if not authorization:
        return ABSENT
    if auth.oidc is None:
        return auth.authenticate(authorization)
    return await asyncio.to_thread(auth.authenticate, authorization)


async def _any_actor(datasette, scope, receive):
    """The actor some Datasette authentication plugin finds for this request (ours included)."""
    from datasette.plugins import pm
    from datasette.utils import await_me_maybe
    from datasette.utils.asgi import Request

    request = Request(scope, receive)
    for actor in pm.hook.actor_from_request(datasette=datasette, request=request):
        actor = await await_me_maybe(actor)
        if actor:
            return actor
    return None


# -- the wrapper ----------------------------------------------------------------------------

_REMOTE = (
    403,
    "remote_access_disabled",
    "groundkit answers only on a loopback address; to publish it, set the groundkit plugin "
    "setting allow_remote_access: true (and configure authentication)",
)
_HOST = (
    403,
    "host_not_allowed",
    "the Host header must name this machine's loopback (localhost, 127.0.0.1 or [::1]); a "
    "server published under another name sets allow_remote_access: true",
)
_ORIGIN = (403, "origin_not_allowed", "requests from pages outside this machine's loopback are refused")
_UNAVAILABLE = (
    503,
    "authentication_unavailable",
    "the identity provider could not be reached to verify the token; try again later",
)
_INVALID = (401, "invalid_token", "the bearer token was not accepted")
_REQUIRED = (
    401,
    "authentication_required",
    "this server requires authentication: send Authorization: Bearer <token>",
)


async def refusal(datasette, settings, scope, receive, *, authenticate=True):
    """Why this request is refused, or None; and the scope to pass on.

    ``authenticate=False`` (static assets, operator-listed public paths) keeps the
    loopback, Host and Origin rules and skips only "published means authenticated".
    """
    if not settings.allow_remote_access:
        if not loopback_socket(scope.get("server")):
            return _REMOTE, scope
        hosts = _header_values(scope, b"host")
        if len(hosts) != 1 or not loopback_host_header(hosts[0]):
            return _HOST, scope
        origins = _header_values(scope, b"origin")
        if origins and (len(origins) > 1 or not loopback_origin(origins[0])):
            return _ORIGIN, scope
    if not authenticate:
        return None, scope
    outcome = await authenticate_scope(datasette, settings, scope)
    scope = dict(scope, **{AUTH_SCOPE_KEY: outcome})
    if outcome.state == "unavailable":
        return _UNAVAILABLE, scope
    must_authenticate = settings.allow_remote_access and not settings.allow_anonymous
    if outcome.actor is None and (outcome.state == "invalid" or must_authenticate):
        if await _any_actor(datasette, scope, receive) is None:
            return (_INVALID if outcome.state == "invalid" else _REQUIRED), scope
    return None, scope


_CONFIGURATION_HIDDEN = (
    403,
    "forbidden",
    "on a published server the pages showing this instance's configuration (file paths, "
    "plugin settings) are only for the root actor",
)


async def configuration_page_refusal(datasette, settings, scope, receive):
    """``/-/databases``, ``/-/metadata`` and ``/-/config`` get the guard of a collection page;
    when published, they are root's only (adr/0053): Datasette serves the settings as they
    were written, and no public API of either line scrubs them."""
    refused, scope = await refusal(datasette, settings, scope, receive)
    if refused is not None or not settings.allow_remote_access:
        return refused, scope
    actor = await _any_actor(datasette, scope, receive)
    if isinstance(actor, dict) and actor.get("id") == "root":
        return None, scope
    return _CONFIGURATION_HIDDEN, scope


async def send_refusal(scope, send, status: int, kind: str, detail: str) -> None:
    request_id = uuid.uuid4().hex
    access_log.info(
        "request_id=%s method=%s route=%s refused status=%s error=%s", request_id,
        scope.get("method", "WS"), scope.get(ROUTE_SCOPE_KEY, "-"), status, kind,
    )
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps(ErrorInfo(status, kind, detail).body(request_id)).encode("utf-8")
    headers = [
        (b"content-type", b"application/json; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        (b"x-request-id", request_id.encode()),
    ]
    if status == 401:
        challenge = 'Bearer realm="groundkit"'
        if kind == "invalid_token":
            challenge += ', error="invalid_token"'
        headers.append((b"www-authenticate", challenge.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _route_label(datasette, scope) -> str:
    """A path for the log line with nothing the caller chose beyond the route's shape."""
    from ..logs import route_label

    return route_label(_strip_base_url(datasette, scope.get("path") or ""))


# Security headers for every answer (adr/0011). groundkit's own pages get a full policy:
# their scripts and styles are files, and the one inline script Datasette's base template
# carries is allowed by its hash. Datasette's and other plugins' pages keep their inline
# scripts, so they get the framing and plugin rules only.
_COMMON_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)
_BASE_CSP = "frame-ancestors 'none'; object-src 'none'; base-uri 'self'"


def _inline_script_hashes() -> list[str]:
    """The CSP hashes of the inline scripts in the installed Datasette's ``base.html`` and
    the templates it includes, as this version renders them: 1.0's carries the running
    version (``window.datasetteVersion = '...'``), so its hash is taken of the rendered
    text. A script whose text depends on the page (a plugin's ``extra_body_script``) is not
    allowed: it would need 'unsafe-inline'."""
    import base64
    import hashlib
    from pathlib import Path

    import datasette
    import jinja2
    from datasette.version import __version__

    folder = Path(datasette.__file__).parent / "templates"
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    hashes, names, seen = [], ["base.html"], set()
    while names:
        name = names.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            text = (folder / name).read_text("utf-8")
        except OSError:
            continue
        names += re.findall(r"""{%-?\s*include\s+["']([\w.-]+)["']""", text)
        for body in re.findall(r"<script>(.*?)</script>", text, flags=re.S):
            if "{%" in body:
                continue
            try:
                body = env.from_string(body).render(datasette_version=__version__)
            except jinja2.UndefinedError:
                continue
            digest = hashlib.sha256(body.encode("utf-8")).digest()
            hashes.append("'sha256-" + base64.b64encode(digest).decode() + "'")
    return sorted(set(hashes))


GROUNDKIT_CSP = (
    "default-src 'self'; script-src 'self' " + " ".join(_inline_script_hashes()) + "; "
    "style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; object-src 'none'; base-uri 'none'"
)


def _with_security_headers(scope, send):
    groundkit_page = GUARD_MARK in (scope.get("path") or "")

    async def send_with_headers(message):
        if message.get("type") == "http.response.start":
            headers = list(message.get("headers") or [])
            present = {k.lower() for k, _ in headers}
            for name, value in _COMMON_HEADERS:
                if name not in present:
                    headers.append((name, value))
            if b"content-security-policy" not in present:
                content_type = b""
                for k, v in headers:
                    if k.lower() == b"content-type":
                        content_type = v.lower()
                policy = GROUNDKIT_CSP if groundkit_page and b"text/html" in content_type else _BASE_CSP
                headers.append((b"content-security-policy", policy.encode()))
            message = dict(message, headers=headers)
        await send(message)

    return send_with_headers


def guard(datasette, settings_of, app):
    """``app`` behind the instance boundary: every HTTP and websocket request is decided
    here before anything of ``app`` runs. ``settings_of(datasette)`` gives the settings."""

    async def groundkit_access(scope, receive, send):
        if scope.get("type") not in ("http", "websocket"):
            return await app(scope, receive, send)
        settings = settings_of(datasette)
        route = _route_label(datasette, scope)
        scope = dict(scope, **{ROUTE_SCOPE_KEY: route})
        REQUEST_LINE.set((scope.get("method", "WS"), route))
        if scope["type"] == "http":
            send = _with_security_headers(scope, send)
        if is_configuration_page(datasette, scope):
            refused, scope = await configuration_page_refusal(datasette, settings, scope, receive)
        else:
            open_path = is_open_asset(datasette, scope) or is_public_path(
                datasette, scope, settings.public_paths
            )
            refused, scope = await refusal(datasette, settings, scope, receive,
                                           authenticate=not open_path)
        if refused is not None:
            return await send_refusal(scope, send, *refused)
        return await app(scope, receive, send)

    return groundkit_access


# -- start-up -------------------------------------------------------------------------------


def startup_checks(settings) -> None:
    """Say loudly what the settings publish."""
    if settings.allow_remote_access and settings.allow_anonymous:
        log.warning(
            "groundkit: allow_remote_access and allow_anonymous are both true: every collection "
            "this server serves is PUBLIC to anyone who can reach it, without authentication"
        )
    elif settings.allow_remote_access and not (settings.oidc or settings.tokens):
        log.warning(
            "groundkit: allow_remote_access is true but neither oidc nor tokens is configured: "
            "callers need an actor from another Datasette authentication plugin, or get 401"
        )
    elif settings.allow_anonymous:
        log.info("groundkit: allow_anonymous has no effect without allow_remote_access")
