"""The tool table and everything that renders it: the JSON API, the HTML pages, MCP over
stdio and HTTP, the datasette-mcp bridge, the OpenAPI document, ``groundkit serve``; the
plugin settings, the collection registry and the one call path every surface shares
(``service``).
May import: ``retrieval``, ``indexing``, ``embedding``, ``security`` and the shared modules.
Never ``evaluation``, ``datasette_plugin`` or ``cli``.
"""
