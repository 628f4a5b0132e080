"""Issue 37: `make demo` in a clone leaves nothing untracked; the repository's .gitignore covers
every file an ingest leaves beside a collection (the lock, the spare copy, the vectors)."""

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from groundkit_datasette.cli import cli

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_gitignore_covers_what_an_ingest_leaves(tmp_path):
    repo = tmp_path / "clone"
    (repo / "docs").mkdir(parents=True)
    shutil.copy(ROOT / ".gitignore", repo / ".gitignore")
    (repo / "docs" / "a.md").write_text("# Atomic rename\n\nPublishing replaces the file by rename.\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "start"], check=True)
    for _ in range(2):  # the second run takes the spare and leaves a new one
        result = CliRunner().invoke(cli, ["ingest", str(repo / "docs"), "--collection", "groundkit",
                                          "--index-dir", str(repo)])
        assert result.exit_code == 0, result.output
        (repo / "docs" / "a.md").write_text((repo / "docs" / "a.md").read_text() + "\nMore.\n")
        subprocess.run([*git, "commit", "-q", "-am", "edit"], check=True)
    left = {p.name for p in repo.iterdir()}
    assert {".groundkit.lock", "groundkit.sqlite3", "groundkit.lance"} <= left
    assert any(name.startswith(".groundkit.sqlite3.spare-") for name in left), left
    status = subprocess.run([*git, "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout
    assert status == "", status
