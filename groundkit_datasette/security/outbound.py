"""Guard for outbound HTTP calls to embedding/rerank endpoints (SSRF defence).

Error messages never repeat the URL or any part of it: a URL may carry a
secret, and the service surfaces show ``str(error)`` to callers.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import Callable, Iterable
from urllib.parse import urlsplit

import httpx

from ..errors import RedirectRefused, UnsafeEndpoint

#: ``resolver(host, port)`` returns the IP address strings ``host`` resolves to.
Resolver = Callable[[str, int], Iterable[str]]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_DEFAULT_PORTS = {"http": 80, "https": 443}
# ASCII hostnames only: non-ASCII (IDN) names must be given in punycode so
# that what we check is exactly what the resolver sees.
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[a-z0-9_](?:[a-z0-9_-]{0,62})(?:\.[a-z0-9_-]{1,63})*\.?$")
_BAD_CHARS = re.compile(r"[\x00-\x20\x7f\\]")

_NAT64 = ipaddress.ip_network("64:ff9b::/96")


@dataclass(frozen=True)
class ParsedEndpoint:
    """A validated base URL, split into the parts the guard needs."""

    scheme: str
    host: str  # lower-case; IPv6 literals without brackets
    port: int
    path: str  # no trailing slash; "" for the root
    allow_private: bool = False

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.port == _DEFAULT_PORTS[self.scheme]:
            return host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.netloc}{self.path}"

    def url_for(self, suffix: str) -> str:
        return self.url + "/" + suffix.lstrip("/")

    @property
    def host_is_ip(self) -> bool:
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True


def validate_endpoint(url: str, *, allow_private: bool = False) -> ParsedEndpoint:
    """Check a configured base URL's shape; raise UnsafeEndpoint if unfit.

    ``allow_private`` is for local-server providers (Ollama, llama.cpp): it
    permits plain http and, later, loopback/private addresses.
    """
    if not isinstance(url, str) or not url:
        raise UnsafeEndpoint("endpoint URL is missing")
    if _BAD_CHARS.search(url):
        raise UnsafeEndpoint("endpoint URL contains whitespace, control characters or backslashes")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise UnsafeEndpoint("endpoint URL could not be parsed") from None
    scheme = parts.scheme.lower()
    allowed = ("https", "http") if allow_private else ("https",)
    if scheme not in allowed:
        if scheme == "http":
            raise UnsafeEndpoint("endpoint URL must use https (http only for local servers)")
        raise UnsafeEndpoint("endpoint URL scheme is not allowed; use https")
    if "@" in parts.netloc:
        raise UnsafeEndpoint("endpoint URL must not contain credentials; use an API key variable")
    if "?" in url:
        raise UnsafeEndpoint("endpoint URL must not contain a query string")
    if "#" in url:
        raise UnsafeEndpoint("endpoint URL must not contain a fragment")
    host = parts.hostname
    if not host:
        raise UnsafeEndpoint("endpoint URL has no host")
    if not host.isascii():
        raise UnsafeEndpoint("endpoint host must be ASCII (use punycode for international names)")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
        if not _HOSTNAME.match(host):
            raise UnsafeEndpoint("endpoint host is not a valid hostname") from None
        host = host.rstrip(".")
    if ip is not None:
        # A literal address can be judged now rather than at request time.
        _check_one(ip, allow_private=allow_private)
        host = ip.compressed
    if port is None:
        port = _DEFAULT_PORTS[scheme]
    if port == 0:
        raise UnsafeEndpoint("endpoint port is not valid")
    return ParsedEndpoint(
        scheme=scheme,
        host=host,
        port=port,
        path=parts.path.rstrip("/"),
        allow_private=allow_private,
    )


def _embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    if ip.version != 6:
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]  # the client address, already de-obfuscated
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def classify_address(addr: str | IPAddress) -> IPAddress:
    """Parse ``addr`` and return the address it really reaches.

    IPv4-mapped, 6to4, Teredo and NAT64 forms are unwrapped to their embedded
    IPv4 address, so ``::ffff:127.0.0.1`` classifies as loopback. Raises
    ValueError if ``addr`` is not an IP address.
    """
    ip = addr if isinstance(addr, (ipaddress.IPv4Address, ipaddress.IPv6Address)) else ipaddress.ip_address(addr)
    inner = _embedded_ipv4(ip)
    return inner if inner is not None else ip


def is_loopback(addr: str | IPAddress) -> bool:
    """True if ``addr`` (after unwrapping) is a loopback address."""
    try:
        return classify_address(addr).is_loopback
    except ValueError:
        return False


# The IANA special-purpose address registries (IPv4 and IPv6), written out rather than taken
# from ``ipaddress``'s ``is_private``/``is_global``, whose answers change between Python
# releases (3.11 calls 192.0.0.192, a cloud metadata address, global). ``private_ok``: a
# local-server provider (``allow_private``) may reach it.
_SPECIAL_PURPOSE = [
    # (network, what it is, private_ok)
    ("0.0.0.0/8", "an unspecified address", False),  # 0.0.0.0 reaches the local host on Linux
    ("10.0.0.0/8", "a private address", True),
    ("100.64.0.0/10", "a private address", True),  # shared address space (carrier NAT, VPNs)
    ("127.0.0.0/8", "a loopback address", True),
    ("169.254.0.0/16", "a link-local address", False),  # 169.254.169.254: cloud metadata
    ("172.16.0.0/12", "a private address", True),
    ("192.0.0.0/24", "a special-purpose address", False),  # 192.0.0.192: cloud metadata
    ("192.0.2.0/24", "a documentation address", False),
    ("192.31.196.0/24", "a special-purpose address", False),
    ("192.52.193.0/24", "a special-purpose address", False),
    ("192.88.99.0/24", "a special-purpose address", False),
    ("192.168.0.0/16", "a private address", True),
    ("192.175.48.0/24", "a special-purpose address", False),
    ("198.18.0.0/15", "a special-purpose address", False),
    ("198.51.100.0/24", "a documentation address", False),
    ("203.0.113.0/24", "a documentation address", False),
    ("224.0.0.0/4", "a multicast address", False),
    ("240.0.0.0/4", "a reserved address", False),  # 255.255.255.255 included
    ("::/128", "an unspecified address", False),
    ("::1/128", "a loopback address", True),
    ("64:ff9b:1::/48", "a special-purpose address", False),  # local-use NAT64
    ("100::/64", "a special-purpose address", False),
    ("100:0:0:1::/64", "a special-purpose address", False),
    ("2001::/23", "a special-purpose address", False),
    ("2001:db8::/32", "a documentation address", False),
    ("2620:4f:8000::/48", "a special-purpose address", False),
    ("3fff::/20", "a documentation address", False),
    ("5f00::/16", "a special-purpose address", False),
    ("fc00::/7", "a private address", True),
    ("fe80::/10", "a link-local address", False),
    ("fec0::/10", "a link-local address", False),  # site-local, deprecated
    ("ff00::/8", "a multicast address", False),
]
_SPECIAL_NETWORKS = [(ipaddress.ip_network(net), why, ok) for net, why, ok in _SPECIAL_PURPOSE]
# IPv6 outside global unicast (2000::/3) is not a place an endpoint can be: IPv4-compatible and
# other reserved forms included.
_GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")


def _refusal(ip: IPAddress, *, allow_private: bool) -> str | None:
    """Why ``ip`` (already unwrapped) may not be contacted, or None."""
    for network, why, private_ok in _SPECIAL_NETWORKS:
        if ip.version == network.version and ip in network:
            return None if (private_ok and allow_private) else why
    if ip.version == 6 and ip not in _GLOBAL_UNICAST_V6:
        return "a reserved address"
    return None


def _check_one(ip: IPAddress, *, allow_private: bool) -> None:
    reason = _refusal(classify_address(ip), allow_private=allow_private)
    if reason is not None:
        raise UnsafeEndpoint(f"endpoint host resolves to {reason}; refused")


def default_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [info[4][0] for info in infos]


def check_resolved(
    host: str,
    port: int,
    *,
    allow_private: bool = False,
    resolver: Resolver | None = None,
) -> list[str]:
    """Resolve ``host`` and refuse if ANY address is unfit; return the addresses.

    All addresses are checked, not just the first, so a name that mixes a
    public and a private address cannot be used to reach the private one.
    """
    resolve = resolver or default_resolver
    try:
        found = list(resolve(host, port))
    except (OSError, UnicodeError):
        raise UnsafeEndpoint("endpoint host could not be resolved") from None
    if not found:
        raise UnsafeEndpoint("endpoint host could not be resolved")
    addresses: list[str] = []
    for raw in found:
        try:
            ip = ipaddress.ip_address(raw)
        except ValueError:
            raise UnsafeEndpoint("endpoint host resolved to something that is not an IP address") from None
        _check_one(ip, allow_private=allow_private)
        # Drop any IPv6 zone id: link-local (the only scoped kind) is refused above.
        text = ip.compressed.split("%", 1)[0]
        if text not in addresses:
            addresses.append(text)
    return addresses


def redact_url(url: str) -> str:
    """``scheme://host[:port]/path`` with credentials, query and fragment removed."""
    try:
        parts = urlsplit(str(url))
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparseable url>"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    return f"{parts.scheme}://{netloc}{parts.path}"


def guarded_send(
    client: httpx.Client,
    method: str,
    endpoint: ParsedEndpoint,
    suffix: str,
    *,
    json: object = None,
    headers: dict[str, str] | None = None,
    resolver: Resolver | None = None,
) -> httpx.Response:
    """Send one request to ``endpoint`` + ``suffix`` through the guard.

    The host is resolved and checked before every request, and the connection
    is pinned to a checked address (Host header and TLS SNI keep the name), so
    a DNS answer that changes between check and connect (rebinding) cannot
    redirect the request. A 3xx reply raises RedirectRefused.

    Use one client per endpoint: its connection pool is keyed by address.
    """
    addresses = check_resolved(
        endpoint.host, endpoint.port, allow_private=endpoint.allow_private, resolver=resolver
    )
    last_error: Exception | None = None
    for address in addresses:
        request = _pinned_request(client, method, endpoint, suffix, address, json=json, headers=headers)
        try:
            response = client.send(request, follow_redirects=False)
        except httpx.ConnectError as exc:
            last_error = exc  # try the next checked address
            continue
        if 300 <= response.status_code < 400:
            response.close()
            _refuse_redirect(response.status_code)
        return response
    assert last_error is not None
    raise last_error


def _refuse_redirect(status: int) -> None:
    raise RedirectRefused(f"endpoint replied with a redirect (HTTP {status}); redirects are not followed")


def _pinned_request(client, method, endpoint, suffix, address, *, json, headers):
    literal = f"[{address}]" if ":" in address else address
    url = f"{endpoint.scheme}://{literal}:{endpoint.port}{endpoint.path}/{suffix.lstrip('/')}"
    all_headers = {"Host": endpoint.netloc}
    all_headers.update(headers or {})
    extensions = {}
    if endpoint.scheme == "https" and not endpoint.host_is_ip:
        extensions["sni_hostname"] = endpoint.host
    return client.build_request(method, url, json=json, headers=all_headers, extensions=extensions)


def tls_context(ca_bundle: str | None):
    """The TLS trust for outbound calls: the system's roots, or only the CAs in ``ca_bundle``
    (a PEM file, for an endpoint behind a private CA). Raises OSError or ssl.SSLError."""
    import ssl

    if ca_bundle is None:
        return True  # httpx's default verification (certifi's roots)
    context = ssl.create_default_context(cafile=str(ca_bundle))
    return context


def guarded_client(timeout: float, ca_bundle: str | None = None) -> httpx.Client:
    """An httpx client for guarded use (see ``guarded_send``).

    ``trust_env=False`` so proxy variables cannot route the pinned request
    somewhere the guard did not check (and ``SSL_CERT_FILE`` cannot change whom it
    trusts); a private CA is given explicitly as ``ca_bundle``. Certificates are always
    verified, against the endpoint's name (sent as SNI) even though the connection is
    pinned to an address.
    """
    return httpx.Client(timeout=httpx.Timeout(timeout), follow_redirects=False, trust_env=False,
                        verify=tls_context(ca_bundle))


class GuardedHTTPService:
    """Shared plumbing of the HTTP embedder and reranker: one lazily built guarded
    client, closed on exit, and a Bearer key read from a named environment variable."""

    _error_class = Exception
    _key_purpose = "API key"

    def _init_http(self, *, timeout, api_key_env, ca_bundle=None) -> None:
        import ssl
        import threading

        self.timeout = float(timeout)
        self.api_key_env = api_key_env
        if ca_bundle is not None:
            if not isinstance(ca_bundle, str) or not ca_bundle.strip():
                raise self._error_class("ca_bundle must be the path of a PEM file")
            try:
                tls_context(ca_bundle)  # read now: a bad bundle is a start-up error
            except (OSError, ssl.SSLError):
                raise self._error_class("ca_bundle could not be read as a PEM CA bundle") from None
        self.ca_bundle = ca_bundle
        self._client = None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _http(self):
        with self._lock:
            if self._client is None:
                self._client = guarded_client(self.timeout, self.ca_bundle)
            return self._client

    def _post_json(self, suffix: str, body: dict, what: str):
        """POST ``body`` to the endpoint's ``suffix`` through the guard; the reply's JSON.

        Failures raise ``_error_class`` with a message naming ``what`` and at most a
        status code or an exception type: never the URL, the key or the reply body.
        """
        import httpx

        from ..errors import GroundkitError

        try:
            response = guarded_send(
                self._http(), "POST", self._endpoint, suffix, json=body,
                headers=self._headers(), resolver=self._resolver,
            )
        except GroundkitError:
            raise
        except httpx.TimeoutException:
            raise self._error_class(f"{what} request timed out") from None
        except httpx.HTTPError as exc:
            # The exception text can name the address; only its type is safe.
            raise self._error_class(f"{what} request failed ({type(exc).__name__})") from None
        try:
            if response.status_code != 200:
                raise self._error_class(f"{what} endpoint replied HTTP {response.status_code}")
            try:
                return response.json()
            except ValueError:
                raise self._error_class(f"{what} endpoint reply was not JSON") from None
        finally:
            response.close()

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.api_key_env:
            # Read at each call and never stored: rotating the key needs no restart.
            import os

            key = os.environ.get(self.api_key_env, "").strip()
            if not key:
                raise self._error_class(
                    f"environment variable {self.api_key_env} (the {self._key_purpose}) is not set"
                )
            headers["Authorization"] = f"Bearer {key}"
        return headers
