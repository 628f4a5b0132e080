"""groundkit-datasette: explore and cite a private document corpus through Datasette.

The Python API is two classes, in the style of ``from sqlite_utils import Database``::

    from groundkit_datasette import Collection, Indexer

They are imported on first use (PEP 562), so loading the Datasette plugin or the CLI does not
pay for the search and ingest stacks before it needs them (cold start, adr/0041).
"""

__version__ = "0.1.0"

__all__ = ["Collection", "Indexer", "__version__"]


def __getattr__(name: str):
    if name == "Collection":
        from .retrieval.collection import Collection

        return Collection
    if name == "Indexer":
        from .indexing.ingest import Indexer

        return Indexer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
