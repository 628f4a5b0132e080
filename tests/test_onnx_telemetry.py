"""Issue 37: an ingest with the default embedder leaves nothing in the user's home directory
(onnxruntime's telemetry provider writes a device id under ~/.cache/Microsoft on import)."""

import os
import subprocess
import sys


def test_ingest_with_default_embedder_writes_no_onnxruntime_device_id(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "note.md").write_text("# Quokka\n\nA small marsupial that lives on Rottnest Island.\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("ORT_DISABLE_TELEMETRY", "XDG_CACHE_HOME")}
    env["HOME"] = str(home)
    code = "from groundkit_datasette.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", code, "ingest", str(docs), "--collection", "notes",
         "--index-dir", str(tmp_path / "index")],
        env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "index" / "notes.lance").exists()  # the embedder ran: vectors written
    left = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert not any(p.startswith(".cache/Microsoft") for p in left), left
