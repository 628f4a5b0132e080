"""Datasette plugin entry point (``[project.entry-points.datasette] groundkit``).

Hook implementations live here; the behaviour lives in the library modules.
"""
