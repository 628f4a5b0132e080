"""Lets ``datasette ... --plugins-dir plugins`` load groundkit from a checkout.

When the package is installed, Datasette has already registered its entry
point module; registering it again is skipped, so hooks never run twice.
"""

import sys
from pathlib import Path

try:
    import groundkit_datasette.datasette_plugin as _groundkit
except ImportError:  # a checkout that was not pip-installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import groundkit_datasette.datasette_plugin as _groundkit

from datasette.plugins import pm

if not pm.is_registered(_groundkit):
    pm.register(_groundkit, name="groundkit_datasette.datasette_plugin")
