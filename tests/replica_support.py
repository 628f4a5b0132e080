"""Several `groundkit serve` replicas of one index directory behind Debian's nginx, using the
shipped deploy/nginx/groundkit-replicas.conf with only its ports changed (free ones).

Used by tests/test_replicas.py and benchmarks/replicas.py. Every process goes in its own process
group and is killed by ``close``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
SHIPPED_CONF = REPO / "deploy" / "nginx" / "groundkit-replicas.conf"
TOKEN = "replica-test-token-4f1c"


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if not found:
        raise RuntimeError("nginx is not installed: run scripts/setup-test-system")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def published_metadata(extra: dict | None = None) -> dict:
    """A published service (every request needs an actor) with one static token."""
    from groundkit_datasette.security.auth import hash_token

    settings = {"allow_remote_access": True, "tokens": [{"id": "load", "sha256": hash_token(TOKEN)}]}
    settings.update(extra or {})
    return {"plugins": {"groundkit": settings}}


def nginx_conf(replica_ports: list[int], listen_port: int) -> str:
    """The shipped server config with these ports: one upstream line per replica."""
    text = SHIPPED_CONF.read_text()
    lines = re.findall(r"^ *server 127\.0\.0\.1:\d+ .*;\n", text, flags=re.M)
    template = lines[0]
    new = "".join(re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{p}", template) for p in replica_ports)
    text = text.replace("".join(lines), new)
    return re.sub(r"listen 127\.0\.0\.1:\d+;", f"listen 127.0.0.1:{listen_port};", text)


class Replicas:
    def __init__(self, work: Path, index_dir: Path, count: int = 2, metadata: dict | None = None):
        self.work = work
        self.procs: list[subprocess.Popen] = []
        self.ports = [free_port() for _ in range(count)]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.headers = {"Authorization": f"Bearer {TOKEN}"}
        meta = work / "metadata.json"
        meta.write_text(json.dumps(published_metadata() if metadata is None else metadata))
        env = dict(os.environ, PYTHONPATH=str(REPO), LANCE_LOG="error")
        try:
            for n, port in enumerate(self.ports):
                self._start([sys.executable, "-m", "groundkit_datasette.cli", "serve", str(index_dir),
                             "--host", "127.0.0.1", "--port", str(port), "--metadata", str(meta)],
                            env, f"replica{n}.log")
            for port in self.ports:
                self._wait(f"http://127.0.0.1:{port}")
            self._start_nginx()
            self._wait(self.url)
        except BaseException:
            self.close()
            raise

    def _start(self, cmd, env, log_name):
        log = open(self.work / log_name, "wb")
        self.procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           cwd=self.work, start_new_session=True))
        log.close()

    def _start_nginx(self):
        nginx = self.work / "nginx"
        temp = nginx / "temp"
        temp.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:  # nginx's workers run as nobody: they buffer large answers here
            import pwd

            os.chown(temp, pwd.getpwnam("nobody").pw_uid, -1)
        (nginx / "groundkit-replicas.conf").write_text(nginx_conf(self.ports, self.port))
        (nginx / "nginx.conf").write_text(f"""
daemon off;
worker_processes 1;
pid {nginx}/nginx.pid;
error_log {nginx}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format upstream '$status $upstream_addr';
    access_log {nginx}/access.log upstream;
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
    include {nginx}/groundkit-replicas.conf;
}}
""")
        self._start([nginx_binary(), "-p", str(nginx), "-c", str(nginx / "nginx.conf")], os.environ,
                    "nginx.log")

    def _wait(self, url: str, timeout: float = 120):
        deadline = time.monotonic() + timeout
        while True:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a process exited early (logs in {self.work})")
            try:
                if httpx.get(url + "/-/groundkit/collections.json", headers=self.headers, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer (logs in {self.work})")
            time.sleep(0.2)

    def upstreams_used(self) -> set[str]:
        log = self.work / "nginx" / "access.log"
        return {line.split()[1] for line in log.read_text().splitlines() if len(line.split()) > 1}

    def close(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(15)
