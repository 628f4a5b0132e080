"""The groundkit plugin manager: built-ins plus ``groundkit`` entry points."""

import threading

import pluggy

from . import hookspecs

pm = pluggy.PluginManager("groundkit")
pm.add_hookspecs(hookspecs)
# Installed plugins (``groundkit`` entry points) load on the first lookup (``_load_builtins``),
# not at import: the scan of every distribution's metadata took 0.09 s of a fresh process's
# first query before its model could start loading (adr/0041, session 11).
_entry_points_loaded = False

# The embedder used when neither the user nor the collection names one.
DEFAULT_EMBEDDER = "minilm"

# Modules holding built-in hook implementations, in the order they declared themselves
# (``add_builtins``). The registry imports none of them: each is imported by the code that
# looks its hook up, with an import statement the layers contract sees (adr/0060).
_builtins: list = []

_builtins_lock = threading.Lock()  # a query model warming in a thread may get here first


def add_builtins(module) -> None:
    """Declare ``module``'s hook implementations built in: registered on the next lookup,
    after installed plugins, as every built-in is (so a plugin's name wins over a built-in's
    where the hook keeps the last)."""
    if module not in _builtins:
        _builtins.append(module)  # no lock: an entry point's import may declare during the scan


def _load_builtins():
    """Installed plugins (``groundkit`` entry points, once per process), then every declared
    built-in not registered yet; every lookup calls this first."""
    global _entry_points_loaded

    with _builtins_lock:
        if not _entry_points_loaded:
            pm.load_setuptools_entrypoints("groundkit")
            _entry_points_loaded = True
        for module in tuple(_builtins):
            if not pm.is_registered(module):
                pm.register(module, module.__name__)


class LazyFactory:
    """A registered class imported when first built or its options checked: for built-ins
    whose imports (the HTTP stack) cost more than a query and most processes never need.
    ``load`` returns the class; it imports it with an ordinary import statement inside the
    function, so the layers contract sees that import."""

    def __init__(self, load):
        self._load = load

    def _target(self):
        return self._load()

    @property
    def __signature__(self):
        import inspect

        return inspect.signature(self._target())

    def __call__(self, **options):
        return self._target()(**options)


def registered(hook_name):
    """Return ``{name: factory}`` collected from every implementation of a register hook."""
    _load_builtins()
    found = {}

    def register(name, factory):
        found[name] = factory

    getattr(pm.hook, hook_name)(register=register)
    return found


def build(hook_name: str, kind: str, name: str, options: dict, error_class):
    """Build the ``kind`` registered as ``name``; unknown names and bad options raise ``error_class``.

    Options are checked against the factory's signature so a typo is a clear error,
    without catching TypeErrors raised inside the factory itself.
    """
    import inspect

    factories = registered(hook_name)
    factory = factories.get(name)
    if factory is None:
        known = ", ".join(sorted(factories)) or "none"
        raise error_class(f"unknown {kind} {name!r}; known {kind}s: {known}")
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        signature = None  # not introspectable: let the factory judge
    if signature is not None:
        try:
            signature.bind(**options)
        except TypeError:
            params = signature.parameters
            unknown = sorted(set(options) - set(params))
            missing = sorted(
                n for n, p in params.items()
                if p.default is p.empty and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
                and n not in options
            )
            problems = []
            if unknown:
                problems.append(f"unknown option(s): {', '.join(unknown)}")
            if missing:
                problems.append(f"missing option(s): {', '.join(missing)}")
            detail = "; ".join(problems) or "bad options"
            raise error_class(f"invalid options for {kind} {name!r}: {detail}") from None
        options = typed_options(factory, options, f"{kind} {name!r}", error_class)
    return factory(**options)


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def typed_options(factory, options: dict, what: str, error_class) -> dict:
    """Options typed by the factory's annotations: ``"false"`` from a command line or a
    YAML string is the boolean False (never a truthy string), ``"30"`` the number 30.

    Only ``bool``, ``int`` and ``float`` annotations are enforced; anything else is
    left for the factory to judge.
    """
    import inspect
    import types
    import typing

    if isinstance(factory, LazyFactory):
        factory = factory._target()  # typed by the class it stands for
    try:
        hints = typing.get_type_hints(factory.__init__ if inspect.isclass(factory) else factory)
    except Exception:
        return options
    out = dict(options)
    for key, value in options.items():
        hint = hints.get(key)
        if hint is None:
            continue
        args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        kinds = {a for a in args if a in (bool, int, float, str)}
        if not kinds or str in kinds or value is None and type(None) in args:
            continue
        out[key] = _coerce(key, value, kinds, what, error_class)
    return out


def _coerce(key, value, kinds, what, error_class):
    if bool in kinds:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise error_class(f"invalid options for {what}: {key} must be true or false")
    if isinstance(value, bool):
        raise error_class(f"invalid options for {what}: {key} must be a number, not true/false")
    if int in kinds and isinstance(value, int):
        return value
    if float in kinds and isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        for kind in (int, float):
            if kind in kinds:
                try:
                    return kind(value.strip())
                except ValueError:
                    pass
    noun = "an integer" if float not in kinds else "a number"
    raise error_class(f"invalid options for {what}: {key} must be {noun}")
