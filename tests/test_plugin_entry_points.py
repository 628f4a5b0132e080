"""A plugin installed as a distribution (a ``groundkit`` entry point), not registered by hand:
it is found on the first lookup, and importing the package does not scan for it."""

import json
import subprocess
import sys
import textwrap


def _install_fake_distribution(site):
    # What pip leaves in site-packages for a package declaring
    # [project.entry-points.groundkit] echo = "gk_echo_plugin"
    (site / "gk_echo_plugin.py").write_text(textwrap.dedent("""
        from groundkit_datasette.hookspecs import hookimpl

        class EchoEmbedder:
            def __init__(self, dimensions: int = 3):
                self.dimensions = dimensions

        @hookimpl
        def register_embedders(register):
            register("echo", EchoEmbedder)
    """))
    dist = site / "gk_echo_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gk-echo-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[groundkit]\necho = gk_echo_plugin\n")
    (dist / "RECORD").write_text("")


PROBE = """
import json, sys
import groundkit_datasette.registry
from groundkit_datasette.embedding import embedders
before = "gk_echo_plugin" in sys.modules
from groundkit_datasette.registry import build, registered
from groundkit_datasette.errors import InvalidRequest
found = sorted(registered("register_embedders"))
built = build("register_embedders", "embedder", "echo", {"dimensions": "5"}, InvalidRequest)
print(json.dumps({"imported_before_lookup": before, "found": found,
                  "dimensions": built.dimensions}))
"""


def test_an_installed_plugin_is_found_on_first_lookup_not_at_import(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _install_fake_distribution(site)
    out = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n" + PROBE],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["imported_before_lookup"] is False
    assert "echo" in got["found"] and "minilm" in got["found"]
    assert got["dimensions"] == 5  # the option typed by the plugin's annotation
