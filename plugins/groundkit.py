"""Lets ``datasette ... --plugins-dir plugins`` load groundkit from a checkout.

Datasette also loads the installed entry point; pluggy refuses to register the
same module twice, so we hand over only when the entry point did not.
"""

import sys
from pathlib import Path

try:
    import groundkit_datasette.plugin  # noqa: F401
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import groundkit_datasette.plugin  # noqa: F401
