"""Our own pluggy hooks, in the style of llm's ``register_*`` hooks."""

import pluggy

hookspec = pluggy.HookspecMarker("groundkit")
hookimpl = pluggy.HookimplMarker("groundkit")


@hookspec
def register_embedders(register):
    """Call ``register(name, factory)``; ``factory(**options)`` returns an Embedder."""


@hookspec
def register_rerankers(register):
    """Call ``register(name, factory)``; ``factory(**options)`` returns a Reranker."""


@hookspec
def register_search_modes(register):
    """Call ``register(mode)`` with a ``modes.SearchMode`` to add a search mode to every surface."""


@hookspec
def register_tools(register):
    """Call ``register(tool)`` with a ``Tool`` to add an operation to every surface."""


@hookspec
def register_extractors(register):
    """Call ``register(extractor)`` with an ``indexing.formats.base.Extractor`` to read a file
    format: its suffixes are ingested and cited like the built-in ones (adr/0057)."""
