"""Judged retrieval runs behind ``groundkit eval``: BEIR-layout data sets, nDCG and recall.

Owns: loading a judged set, ingesting it into a scratch collection and scoring every mode.
May import: ``retrieval``, ``indexing``, ``embedding`` and the shared modules. Never
``surfaces``, ``datasette_plugin`` or ``cli``.
"""
