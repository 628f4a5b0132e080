"""Where the plugin's own CSS and JavaScript are served (the HTML pages and page images use it).

Its own module, below ``pages.py`` and ``page_images.py`` alike, so neither imports the other.
"""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).parent.parent / "datasette_plugin" / "static"


def _mount_name(datasette) -> str | None:
    """The plugin name Datasette lists for our static directory: it depends on how the plugin
    was loaded (an installed entry point, ``--plugins-dir``, a test's ``pm.register``)."""
    from datasette.plugins import get_plugins

    for plugin in get_plugins():
        path = plugin.get("static_path")
        if path and Path(path).resolve() == STATIC_DIR.resolve():
            return plugin["name"]
    return None


def static_url(datasette, filename: str) -> str | None:
    """URL of one of our static files on this instance, or None when they are not mounted."""
    name = getattr(datasette, "_groundkit_static_name", False)
    if name is False:  # looked up once per instance
        name = _mount_name(datasette)
        datasette._groundkit_static_name = name
    return datasette.urls.static_plugins(name, filename) if name else None
