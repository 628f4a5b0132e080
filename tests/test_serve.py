"""``groundkit serve`` as a real process on a free loopback port."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from groundkit_datasette.indexing.ingest import ingest

PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def groundkit(*args, **kwargs):
    return [PYTHON, "-m", "groundkit_datasette.cli", *args]


def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read().decode()


class Served:
    """A running ``groundkit serve``: its first line of stdout and its URL."""

    def __init__(self, *args, env=None):
        self.port = free_port()
        self.proc = subprocess.Popen(
            groundkit("serve", *args, "--port", str(self.port)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})},
        )
        self.base = f"http://127.0.0.1:{self.port}"
        self.stderr_lines = []
        threading.Thread(target=self._drain, daemon=True).start()
        self.first_line = self.proc.stdout.readline()
        self._wait_up()

    def _drain(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    def _wait_up(self):
        for _ in range(600):  # start-up readiness, not a timing assertion
            if self.proc.poll() is not None:
                raise AssertionError("serve exited: " + "".join(self.stderr_lines))
            try:
                if get(self.base + "/-/groundkit/health")[0] == 200:
                    return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        raise AssertionError("serve never answered")

    def stop(self, sig=signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)


@pytest.fixture
def collection(corpus, index_dir):
    ingest([corpus], collection="energy", index_dir=index_dir, embedder="none")
    return index_dir / "energy.sqlite3"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_an_index_dir_answers_search_and_stops_cleanly(collection, corpus, sig):
    served = Served(str(collection.parent), "--base-dir", str(corpus))
    try:
        assert served.first_line.strip() == (
            f"Serving energy at http://127.0.0.1:{served.port}/-/groundkit  (Ctrl-C to stop)")
        status, body = get(served.base + "/energy/-/groundkit/search.json?query=batteries&top_k=2")
        assert status == 200 and json.loads(body)["hits"][0]["source"] == "solar.md"
        status, page = get(served.base + "/")
        assert "groundkit: energy" in page  # the title from serve's metadata
        status, page = get(served.base + "/-/groundkit")
        assert status == 200 and "energy" in page
    finally:
        code = served.stop(sig)
    assert code == 0
    assert "Traceback" not in "".join(served.stderr_lines)


def test_serve_is_immutable_and_follows_a_reingest(collection, corpus):
    served = Served(str(collection), "--base-dir", str(corpus))
    try:
        table = json.loads(get(served.base + "/energy/documents.json?_shape=array")[1])
        assert len(table) == 4
        (corpus / "tides.md").write_text("# Tides\n\nFlywheels and lagoons store energy.\n")
        ingest([corpus], collection="energy", index_dir=collection.parent, embedder="none")
        table = json.loads(get(served.base + "/energy/documents.json?_shape=array")[1])
        assert len(table) == 5
        assert not list(collection.parent.glob("*-wal")) and not list(collection.parent.glob("*-shm"))
    finally:
        assert served.stop() == 0


def test_serve_by_name_in_the_index_dir(collection, corpus):
    served = Served("energy", "--index-dir", str(collection.parent))
    try:
        assert json.loads(get(served.base + "/-/groundkit/collections.json")[1]) == {
            "collections": ["energy"]}
    finally:
        assert served.stop() == 0


def test_open_starts_the_browser_on_the_url(collection, tmp_path):
    """$BROWSER is how webbrowser finds a browser; a recorder stands in for one."""
    record = tmp_path / "opened.txt"
    recorder = tmp_path / "browser.py"
    recorder.write_text(f"import sys, pathlib; pathlib.Path({str(record)!r}).write_text(sys.argv[1])\n")
    served = Served(str(collection.parent), "--open", env={"BROWSER": f"{PYTHON} {recorder} %s"})
    try:
        for _ in range(600):
            if record.exists() and record.read_text():
                break
            time.sleep(0.1)
        assert record.read_text() == f"http://127.0.0.1:{served.port}/-/groundkit"
    finally:
        assert served.stop() == 0


@pytest.mark.parametrize(
    "args,code,words",
    [
        (["--host", "0.0.0.0"], 2, "--host 0.0.0.0 is not a loopback address"),
        (["missing-one"], 2, "missing-one: no such collection"),
        (["{plain}"], 2, "not a groundkit collection"),
        (["{empty}"], 2, "no groundkit collections in"),
        (["--metadata", "{bad_meta}"], 1,
         "Error: groundkit plugin settings: unknown reranker 'cross-encodr'"),
        (["--config", "{bad_meta}"], 1,
         "Error: groundkit plugin settings: unknown reranker 'cross-encodr'"),
    ],
)
def test_serve_refuses_with_one_message(collection, tmp_path, args, code, words):
    plain = tmp_path / "plain.sqlite3"
    plain.write_bytes(b"not sqlite")
    (tmp_path / "empty").mkdir()
    bad_meta = tmp_path / "meta.json"
    bad_meta.write_text(json.dumps({"plugins": {"groundkit": {"reranker": "cross-encodr"}}}))
    names = {"plain": plain, "empty": tmp_path / "empty", "bad_meta": bad_meta}
    args = [a.format(**names) for a in args]
    if args[0] in ("--metadata", "--config", "--host"):
        args = [str(collection.parent)] + args
    result = subprocess.run(groundkit("serve", *args, "--port", str(free_port())),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == code, result.stderr
    assert words in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("option", ["--config", "--metadata"])
def test_serve_reads_the_plugin_settings_from_a_config_or_a_metadata_file(
        collection, corpus, tmp_path, option):
    """datasette.yaml (``-c``) is where Datasette 1.0 plugins read their settings, metadata.yml
    is where 0.65 read them: ``groundkit serve`` takes either on both lines."""
    settings = tmp_path / "settings.yaml"
    settings.write_text("title: Energy notes\nplugins:\n  groundkit:\n    max_top_k: 3\n")
    served = Served(str(collection.parent), "--base-dir", str(corpus), option, str(settings))
    try:
        url = served.base + "/energy/-/groundkit/search.json?query=batteries&top_k="
        assert get(url + "3")[0] == 200
        with pytest.raises(urllib.error.HTTPError) as refused:
            get(url + "4")
        assert refused.value.code == 422 and b"at most 3" in refused.value.read()
        if option == "--metadata":
            assert "Energy notes" in get(served.base + "/")[1]
    finally:
        assert served.stop() == 0
