import hashlib
import os
from pathlib import Path

import pytest

MARKDOWN = """# Solar power

Photovoltaic panels turn sunlight into electricity. Efficiency depends on the cell
material and the angle of the panel towards the sun.

## Storage

Batteries store surplus energy for the night. Lithium-ion cells dominate home storage.

## Costs

Panel prices fell steadily for a decade; installation labour is now the largest cost.
"""

TEXT = """Wind turbines convert the kinetic energy of moving air into rotation.
Offshore farms see steadier winds than onshore ones.

Maintenance at sea is expensive and weather dependent.
"""

HTML = """<html><head><title>Hydro power</title><style>p {color: red}</style></head>
<body><h1>Hydro power</h1><p>Dams hold water &amp; release it through turbines.</p>
<script>var secret = 1;</script><p>Pumped storage moves water uphill when power is cheap.</p></body></html>
"""


def write_corpus(root: Path) -> Path:
    """A small real corpus: markdown, text, HTML, code, a binary file."""
    (root / "notes").mkdir(parents=True, exist_ok=True)
    (root / "solar.md").write_text(MARKDOWN, encoding="utf-8")
    (root / "notes" / "wind.txt").write_text(TEXT, encoding="utf-8")
    (root / "notes" / "hydro.html").write_text(HTML, encoding="utf-8")
    (root / "notes" / "calc.py").write_text("def watts(volts, amps):\n    return volts * amps\n")
    (root / "image.raw").write_bytes(bytes(range(256)) * 4)
    return root


@pytest.fixture(autouse=True)
def _mcp_discover_waits_like_every_other_request(monkeypatch):
    """The mcp SDK gives ``server/discover`` a fixed 10 s, and a stdio server still importing
    on a loaded machine (CI beside other jobs) can take longer to read its first message; the
    tests give every other request 60 s (``read_timeout_seconds``), so discover gets the same."""
    import mcp.client.session as session

    monkeypatch.setattr(session, "DISCOVER_TIMEOUT_SECONDS", 60.0)


@pytest.fixture
def corpus(tmp_path) -> Path:
    return write_corpus(tmp_path / "corpus")


@pytest.fixture
def index_dir(tmp_path) -> Path:
    d = tmp_path / "index"
    d.mkdir()
    return d


def manifest(path: Path) -> dict:
    """A collection file's manifest, read without writing to it."""
    from groundkit_datasette.indexing.schema import connect_readonly

    conn = connect_readonly(path)
    try:
        return dict(conn.execute("SELECT key, value FROM groundkit_manifest"))
    finally:
        conn.close()


def snapshot(directory: Path) -> dict:
    """Every file under ``directory`` with its SHA-256: to prove nothing changed."""
    out = {}
    for dirpath, _dirs, files in os.walk(directory):
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(directory))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out
