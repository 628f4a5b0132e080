"""The layers of docs/architecture.md hold: import-linter's contract (``.importlinter``) is
kept by the package, and it is broken by a lower layer importing a higher one."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def lint(root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([str(LINT), "--config", str(root / ".importlinter")], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)


def test_the_layer_contract_is_kept():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout[-2000:]
    assert "2 kept, 0 broken" in result.stdout


def test_a_lower_layer_importing_a_higher_one_breaks_it(tmp_path):
    shutil.copytree(ROOT / "groundkit_datasette", tmp_path / "groundkit_datasette",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    auth = tmp_path / "groundkit_datasette" / "security" / "auth.py"
    auth.write_text(auth.read_text() + "\nfrom ..surfaces import service  # noqa\n")
    result = lint(tmp_path)
    assert result.returncode != 0
    assert "groundkit_datasette.security is not allowed to import" in result.stdout


def test_an_import_circle_inside_a_package_breaks_it(tmp_path):
    # A function-level import counts: the HTTP embedder importing the built-ins' module back.
    shutil.copytree(ROOT / "groundkit_datasette", tmp_path / "groundkit_datasette",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    client = tmp_path / "groundkit_datasette" / "embedding" / "openai_compat.py"
    client.write_text(client.read_text() + "\n\ndef _late():\n    from . import embedders  # noqa\n")
    result = lint(tmp_path)
    assert result.returncode != 0
    assert "No cycles are allowed in groundkit_datasette.embedding" in result.stdout


def test_every_layer_says_what_it_owns_and_may_import():
    for layer in ("indexing", "retrieval", "embedding", "surfaces", "security", "evaluation"):
        doc = (ROOT / "groundkit_datasette" / layer / "__init__.py").read_text()
        assert "May import" in doc, layer


def test_no_module_is_longer_than_700_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "groundkit_datasette").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 700}
    assert long == {}
