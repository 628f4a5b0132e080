"""What every surface (JSON API, HTML pages, MCP) shares: configuration, the
collection registry, the tool-call context, and the one exception mapping."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import click
from pydantic import ValidationError

from .. import errors as E
from ..errors import ErrorInfo  # noqa: F401  (the error body of every surface)
from ..security.auth import OIDCConfig, StaticToken, parse_oidc, parse_tokens
from ..retrieval.collection import Collection
from ..logs import REQUEST_LINE
from ..retrieval.models import (
    MAX_QUERY_CHARS, MAX_TOP_K, PlainResponse, SearchRequest, readable_message,
)
from ..indexing.names import validate_name
from .datasette_compat import can, collection_file

log = logging.getLogger("groundkit")
access_log = logging.getLogger("groundkit.access")

# Status and exposure per error type, matched subclass-first along the MRO.
# Only types listed with safe=True return their own message; the rest a fixed text.
_ERRORS: dict[type, tuple[int, bool]] = {
    E.InvalidCollectionName: (400, True),
    E.InvalidRequest: (400, True),
    E.DenseUnavailable: (400, True),
    E.EmbedderMismatch: (409, True),
    E.CollectionNotFound: (404, True),
    E.ChunkNotFound: (404, True),
    E.DocumentNotFound: (404, True),
    E.NotACollection: (404, True),
    E.IndexInconsistent: (409, True),
    E.SchemaMismatch: (409, True),
    E.CollectionBusy: (409, True),
    E.TooManyDocuments: (413, True),
    E.NoPageImage: (404, True),
    E.SourceChanged: (409, True),
    E.PageImageTooLarge: (413, True),
    E.RenderTimeout: (422, True),
    E.RerankNotConfigured: (501, True),
    E.EmbedderError: (502, False),
    E.RerankerError: (502, False),
    E.UnsafeEndpoint: (502, False),
}
_FIXED = {
    502: "an upstream model service failed",
    500: "internal error",
}


def _validation_detail(exc: ValidationError) -> str:
    """Name the fields and the rule, never the submitted value or an unknown field's name."""
    parts = []
    for err in exc.errors(include_input=False, include_url=False):
        if err["type"] == "extra_forbidden":
            parts.append("unknown fields are not allowed")
            continue
        loc = ".".join(str(p) for p in err["loc"] if isinstance(p, str))
        message = readable_message(err)
        parts.append(f"{loc}: {message}" if loc else message)
    return "; ".join(dict.fromkeys(parts)) or "malformed request"


def map_exception(exc: BaseException) -> ErrorInfo:
    """The one exception-to-response mapping shared by the JSON API and MCP."""
    if isinstance(exc, ValidationError):
        return ErrorInfo(422, "malformed_request", _validation_detail(exc))
    if isinstance(exc, MalformedBody):
        return ErrorInfo(422, "malformed_request", str(exc))
    if isinstance(exc, RequestRejected):
        return ErrorInfo(exc.status, exc.kind, str(exc))
    for cls in type(exc).__mro__:
        if cls in _ERRORS:
            status, safe = _ERRORS[cls]
            return ErrorInfo(status, cls.kind, str(exc) if safe else _FIXED[status])
    return ErrorInfo(500, "internal_error", _FIXED[500])


class MalformedBody(Exception):
    """The body is not a JSON object (message is fixed text)."""


class RequestRejected(Exception):
    """Refused before any tool ran: size limits, Host checks, authentication."""

    def __init__(self, status: int, kind: str, detail: str):
        super().__init__(detail)
        self.status = status
        self.kind = kind


class ConfigurationError(click.ClickException, ValueError):
    """The plugin settings are wrong: start-up stops with this one message.

    A ClickException, so ``datasette serve`` prints ``Error: <message>`` and exits 1
    instead of a traceback; a ValueError for code that starts Datasette itself.
    """


# Operator-settable limits (plugin settings); the defaults are the values built into
# models.py and the plugin, which are also the ceilings for the request-model fields.
LIMITS = {
    # setting: (default, lowest, highest or None)
    "max_body_bytes": (256 * 1024, 1024, None),
    "max_top_k": (MAX_TOP_K, 1, MAX_TOP_K),
    "max_query_chars": (MAX_QUERY_CHARS, 1, MAX_QUERY_CHARS),
    "max_concurrent_searches": (8, 1, None),
}
BUSY_RETRY_AFTER = 1  # seconds, in the Retry-After of a 503 server_busy


@dataclass(frozen=True)
class Settings:
    """Plugin settings (``plugins: groundkit:`` in metadata.yml)."""

    index_dir: Path | None = None
    base_dir: Path | None = None
    embedder: str | None = None
    embedder_options: dict | None = None
    reranker: str | None = None
    reranker_options: dict | None = None
    allow_remote_access: bool = False
    allow_anonymous: bool = False
    # Paths a published server answers without an actor (a login page of another
    # authentication plugin); exact, or a prefix ending in "/". Static assets always are.
    public_paths: tuple[str, ...] = ()
    # Authentication (auth.py, adr/0006): OIDC bearer tokens and hashed static tokens.
    oidc: OIDCConfig | None = None
    tokens: tuple[StaticToken, ...] = ()
    max_body_bytes: int = LIMITS["max_body_bytes"][0]
    max_top_k: int = LIMITS["max_top_k"][0]
    max_query_chars: int = LIMITS["max_query_chars"][0]
    max_concurrent_searches: int = LIMITS["max_concurrent_searches"][0]

    @classmethod
    def from_config(cls, config: dict | None) -> "Settings":
        """Check every setting's name and type; raise ConfigurationError naming the first problem."""
        if config is not None and not isinstance(config, dict):
            raise ConfigurationError("the groundkit plugin settings must be a mapping")
        config = dict(config or {})
        known = set(cls.__dataclass_fields__)
        unknown = set(config) - known
        if unknown:
            raise ConfigurationError(
                f"unknown groundkit plugin settings: {', '.join(sorted(unknown))}; "
                f"known settings: {', '.join(sorted(known))}"
            )
        for key in ("index_dir", "base_dir"):
            if config.get(key) is not None:
                if not isinstance(config[key], (str, Path)) or not str(config[key]):
                    raise ConfigurationError(f"groundkit setting {key} must be a directory path")
                config[key] = Path(config[key])
        for key in ("allow_remote_access", "allow_anonymous"):
            # A string "false" must not publish anything.
            if key in config and not isinstance(config[key], bool):
                raise ConfigurationError(f"groundkit setting {key} must be true or false")
        for key in ("embedder", "reranker"):
            if config.get(key) is not None and (not isinstance(config[key], str) or not config[key]):
                raise ConfigurationError(f"groundkit setting {key} must be a name")
        for key in ("embedder_options", "reranker_options"):
            if config.get(key) is not None and not isinstance(config[key], dict):
                raise ConfigurationError(f"groundkit setting {key} must be a mapping of option names")
        for key, (_default, low, high) in LIMITS.items():
            if key in config:
                value = config[key]
                if isinstance(value, bool) or not isinstance(value, int) or value < low or (
                    high is not None and value > high
                ):
                    bound = f"between {low} and {high}" if high is not None else f"at least {low}"
                    raise ConfigurationError(f"groundkit setting {key} must be an integer {bound}")
        public = config.get("public_paths") or []
        if not isinstance(public, list) or not all(
            isinstance(p, str) and p.startswith("/") and ".." not in p for p in public
        ):
            raise ConfigurationError(
                "groundkit setting public_paths must be a list of paths starting with /")
        config["public_paths"] = tuple(public)
        try:
            config["oidc"] = parse_oidc(config.get("oidc"))
            config["tokens"] = parse_tokens(config.get("tokens"))
        except ConfigurationError:
            raise
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        return cls(**config)

    def check_paths(self) -> None:
        """At start-up: a configured index directory must exist (a typo would serve nothing)."""
        if self.index_dir is not None and not self.index_dir.is_dir():
            raise ConfigurationError(
                f"groundkit setting index_dir: directory not found: {self.index_dir}"
            )
        if self.base_dir is not None and not self.base_dir.is_dir():
            # Not fatal: sources may be unmounted for a while; citations then read "unresolvable".
            log.warning("groundkit: base_dir is not a directory; citations cannot be verified")


class Registry:
    """Open collections keyed by Datasette database name, reopened when a new version is published."""

    def __init__(self, datasette, settings: Settings):
        self.datasette = datasette
        self.settings = settings
        self._open: dict[str, Collection] = {}
        self._lock = asyncio.Lock()
        self._embedder = None
        self._reranker = None
        self._models_loaded = False
        self._models_lock = threading.Lock()
        self._searches = 0  # in flight, across every surface of this instance
        self._searches_lock = threading.Lock()

    def check_models(self) -> None:
        """At start-up: build the configured embedder and reranker (names and options checked;
        no model is loaded yet), so a typo stops the server instead of failing every request."""
        from ..errors import GroundkitError

        try:
            self._models()
        except GroundkitError as exc:
            raise ConfigurationError(f"groundkit plugin settings: {exc}") from None

    def check_search(self, request: SearchRequest) -> SearchRequest:
        """This instance's limits, which may be lower than the request model's ceilings.
        A default top_k above the limit is lowered to it; an asked-for one is refused."""
        s = self.settings
        if request.top_k > s.max_top_k and "top_k" not in request.model_fields_set:
            request = request.model_copy(update={"top_k": s.max_top_k})
        if request.top_k > s.max_top_k:
            raise RequestRejected(422, "malformed_request",
                                  f"top_k: must be at most {s.max_top_k} on this server")
        if len(request.query) > s.max_query_chars:
            raise RequestRejected(
                422, "malformed_request",
                f"query: must be at most {s.max_query_chars} characters on this server")
        return request

    @contextlib.contextmanager
    def search_slot(self):
        """One of ``max_concurrent_searches`` slots, or a 503 at once (no queue to grow)."""
        with self._searches_lock:
            if self._searches >= self.settings.max_concurrent_searches:
                raise RequestRejected(503, "server_busy", "too many searches at once; retry shortly")
            self._searches += 1
        try:
            yield
        finally:
            with self._searches_lock:
                self._searches -= 1

    def _models(self):
        with self._models_lock:
            return self._load_models()

    def _load_models(self):
        if not self._models_loaded:
            s = self.settings
            if s.embedder:
                from ..embedding.embedders import get_embedder

                self._embedder = get_embedder(s.embedder, **(s.embedder_options or {}))
            if s.reranker:
                from ..retrieval.rerankers import get_reranker

                self._reranker = get_reranker(s.reranker, **(s.reranker_options or {}))
            self._models_loaded = True
        return self._embedder, self._reranker

    @property
    def reranker_configured(self) -> bool:
        return bool(self.settings.reranker)

    def database_path(self, name: str) -> Path | None:
        db = self.datasette.databases.get(name)
        return None if db is None else collection_file(db)

    def warm(self) -> None:
        """Import LanceDB and load query embedders ahead of the first dense query.

        Run in a thread at start-up: importing lancedb alone takes seconds, and
        none of this reads per-corpus data beyond the manifests.
        """
        from ..retrieval.search import query_embedder

        try:
            import lancedb  # noqa: F401

            embedder, _ = self._models()
            for name in self.candidate_names():
                with Collection(self.database_path(name), name, embedder=embedder) as col:
                    if col.embedding is not None:
                        query_embedder(col).embed_query("warm-up")
        except Exception as exc:  # warming is an optimisation; requests report real errors
            log.debug("warm-up skipped: %s", type(exc).__name__)

    def candidate_names(self) -> list[str]:
        from ..indexing.names import NAME_PATTERN

        return [
            name
            for name in self.datasette.databases
            if NAME_PATTERN.fullmatch(name) and self.database_path(name) is not None
        ]

    async def allowed(self, actor, name: str) -> bool:
        ds = self.datasette
        if not await can(ds, actor, "view-instance"):
            return False
        return await can(ds, actor, "view-database", name)

    async def get(self, name: str, actor) -> Collection:
        validate_name(name)  # before any lookup: a traversal probe learns nothing
        col = self._open.get(name)
        db = self.datasette.databases.get(name)
        # The collection already open at this database's path, and still the file there (one
        # stat): known to be a collection file, so its header is not read again per request.
        if (col is not None and db is not None and getattr(db, "path", None) == str(col.path)
                and col.is_current()):
            path = col.path
        else:
            path, col = self.database_path(name), None
        if path is None or not await self.allowed(actor, name):
            raise E.CollectionNotFound("collection not found")  # echoes nothing from the request
        if col is not None:
            return col
        async with self._lock:
            col = self._open.get(name)
            if col is None or col.path != path or not col.is_current():
                embedder, reranker = await asyncio.to_thread(self._models)
                col = await asyncio.to_thread(
                    Collection, path, name, base_dir=self.settings.base_dir,
                    embedder=embedder, reranker=reranker,
                )
                self._open[name] = col  # the old object closes when the last request drops it
        return col

    async def visible(self, actor) -> list[str]:
        return [n for n in sorted(self.candidate_names()) if await self.allowed(actor, n)]


class ToolContext:
    """One call of one tool, on any surface."""

    def __init__(self, registry: Registry, actor, surface: str, request_id: str | None = None):
        self.registry = registry
        self.actor = actor
        self.surface = surface
        self.request_id = request_id or uuid.uuid4().hex
        self.datasette = registry.datasette

    async def collection(self, name: str) -> Collection:
        return await self.registry.get(name, self.actor)

    def scoped(self, collection: Collection):
        """The collection as this caller sees it: only documents its actor may read (acl.py)."""
        from ..retrieval.permissions import Reader, ScopedCollection

        return ScopedCollection(collection, Reader.from_actor(self.actor))

    async def visible_collections(self) -> list[str]:
        return await self.registry.visible(self.actor)

    async def run(self, fn, *args):
        return await asyncio.to_thread(fn, *args)


def result_count(response) -> int | None:
    # A PlainResponse (retrieval/models.py) holds its values in ``payload``.
    plain = response.payload if type(response) is PlainResponse else None
    for attr in ("hits", "collections", "results"):
        value = plain.get(attr) if plain is not None else getattr(response, attr, None)
        if value is not None:
            return len(value)
    return 1 if response is not None else None


async def call_tool(tool, ctx: ToolContext, collection: str | None, arguments: dict):
    """Validate, run and log one call; returns ``(response model | None, ErrorInfo | None)``."""
    started = time.perf_counter()
    response, error = None, None
    try:
        if tool.scope == "collection":
            validate_name(collection)
        request = tool.request_model.model_validate(arguments)
        if isinstance(request, SearchRequest):
            request = ctx.registry.check_search(request)
            with ctx.registry.search_slot():
                response = await tool.handler(ctx, collection, request)
        else:
            response = await tool.handler(ctx, collection, request)
    except Exception as exc:  # mapped below; the full exception goes only to the server log
        error = map_exception(exc)
        if error.status == 500:  # a defect: the traceback, for the server's log only
            log.error("request %s: %s failed", ctx.request_id, tool.name, exc_info=exc)
        elif error.status >= 502:  # an upstream or capacity problem: one line
            log.warning("request %s: %s failed: %s", ctx.request_id, tool.name, error.kind)
        else:  # an expected refusal (4xx, 501): one line
            log.debug("request %s: %s refused: %s", ctx.request_id, tool.name, error.kind)
    log_call(ctx, tool.name, error.status if error else 200, started,
             result_count(response) if error is None else 0)
    return response, error


def log_call(ctx: ToolContext, tool_name: str, status: int, started: float, results: int | None = 0):
    """The one access line per call, also for calls refused before validation (bad bodies)."""
    elapsed = (time.perf_counter() - started) * 1000
    method, route = REQUEST_LINE.get()
    access_log.info(
        "request_id=%s method=%s route=%s surface=%s tool=%s status=%s latency_ms=%.1f results=%s",
        ctx.request_id, method, route, ctx.surface, tool_name, status, elapsed, results,
    )


# -- one Settings and one Registry per Datasette instance ----------------------------------

PLUGIN = "groundkit"


def settings_for(datasette) -> Settings:
    cached = getattr(datasette, "_groundkit_settings", None)
    if cached is None:
        cached = Settings.from_config(datasette.plugin_config(PLUGIN))
        datasette._groundkit_settings = cached
    return cached


def registry_for(datasette) -> Registry:
    reg = getattr(datasette, "_groundkit_registry", None)
    if reg is None:
        reg = Registry(datasette, settings_for(datasette))
        datasette._groundkit_registry = reg
    return reg
