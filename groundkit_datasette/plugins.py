"""The groundkit plugin manager: built-ins plus ``groundkit`` entry points."""

import pluggy

from . import hookspecs

pm = pluggy.PluginManager("groundkit")
pm.add_hookspecs(hookspecs)
pm.load_setuptools_entrypoints("groundkit")

# The embedder used when neither the user nor the collection names one.
DEFAULT_EMBEDDER = "minilm"

_BUILTINS = ("groundkit_datasette.embedders", "groundkit_datasette.rerankers")


def _load_builtins():
    import importlib

    for name in _BUILTINS:
        mod = importlib.import_module(name)
        if not pm.is_registered(mod):
            pm.register(mod, name)


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
    return factory(**options)
