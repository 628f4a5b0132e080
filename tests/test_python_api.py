"""The top-level Python API: ``from groundkit_datasette import Collection, Indexer``, as the
README shows it. The README's own Python blocks are run here, on a real folder and a real
collection, so the README cannot drift from the API."""

import re
import subprocess
import sys
from pathlib import Path

import groundkit_datasette
from groundkit_datasette.indexing.ingest import Indexer
from groundkit_datasette.retrieval.collection import Collection

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_package_exports_the_reader_and_the_writer():
    assert groundkit_datasette.Collection is Collection
    assert groundkit_datasette.Indexer is Indexer
    assert {"Collection", "Indexer"} <= set(dir(groundkit_datasette))
    try:
        groundkit_datasette.Nothing
    except AttributeError as error:
        assert "Nothing" in str(error)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_importing_the_package_does_not_load_the_search_or_ingest_stacks():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, groundkit_datasette\n"
         "print(sorted(m for m in sys.modules if m.startswith('groundkit_datasette.')))"],
        capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_the_readme_python_blocks_run_as_written(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    ingest_block = next(b for b in blocks if "Indexer(" in b)
    search_block = next(b for b in blocks if "Collection.open(" in b)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "rename.md").write_text("# Publishing\n\nAn atomic rename publishes the new file.\n")
    (docs / "other.txt").write_text("Nothing about that here: quokkas and xylophones.\n")
    monkeypatch.chdir(tmp_path)
    exec(compile(ingest_block, "README ingest block", "exec"), {})
    assert "'added': 2" in capsys.readouterr().out
    exec(compile(search_block, "README search block", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("rename.md 1 c_")  # the one chunk holds the whole file
    assert printed[1] == "verified"
