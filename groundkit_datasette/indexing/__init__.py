"""The on-disk format of a collection and its only writer.

Owns: collection names and paths, the SQLite schema and manifest, text extraction, chunking,
the BM25 index (tokenizer, terms, postings), the LanceDB vector table, access-list files, and
ingest, which writes a private copy and publishes it by rename (adr/0002), and watch mode,
which re-runs ingest on file-system events (adr/0021).
May import: ``embedding`` (to embed chunks), ``security``, and the shared modules
(``errors``, ``logs``, ``hookspecs``, ``registry``). Never ``retrieval`` or anything above.
"""
