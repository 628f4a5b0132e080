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
