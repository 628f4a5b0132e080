"""Reading one published collection version, read-only.

Owns: the ``Collection`` (opened ``immutable=1``), the request and response models of the
Python API, what one reader may see (``permissions``), search modes (``modes``: BM25, dense,
hybrid, plugins') and their ranking, fusion, reranking, citation verification, and the
evaluation harness.
May import: ``indexing``, ``embedding``, ``security`` and the shared modules.
"""
