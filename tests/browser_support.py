"""Helpers for the real-browser tests: a live Datasette server, Chromium, page checks."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import uvicorn

CHROMIUM = "/usr/bin/chromium"
# Debian's Chromium, never Playwright's download (which cannot be fetched here).
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
REPO = Path(__file__).resolve().parent.parent


def artifacts_dir() -> Path:
    path = Path(os.environ.get("GROUNDKIT_ARTIFACTS") or REPO / "artifacts" / "screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """A real uvicorn server on a loopback port, in a thread, like ``datasette serve``."""

    def __init__(self, datasette):
        self.datasette = datasette
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # access_log off: the server's own log must never record query strings.
        config = uvicorn.Config(datasette.app(), host="127.0.0.1", port=self.port,
                                log_level="warning", access_log=False, lifespan="auto")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=30)


# Run in the page: what a keyboard or screen-reader user would trip over.
_PAGE_PROBLEMS = """() => {
    const problems = [];
    const h1s = document.querySelectorAll('h1');
    if (h1s.length !== 1) problems.push(`${h1s.length} h1 elements`);
    let last = 0;
    for (const h of document.querySelectorAll('h1, h2, h3, h4, h5, h6')) {
        const level = Number(h.tagName[1]);
        if (last && level > last + 1) problems.push(`heading ${h.tagName} after h${last}: ${h.textContent.trim()}`);
        last = level;
    }
    for (const el of document.querySelectorAll('input, select, textarea')) {
        if (['hidden', 'submit', 'button'].includes(el.type)) continue;
        const named = (el.labels && el.labels.length) || el.getAttribute('aria-label')
            || el.getAttribute('aria-labelledby');
        if (!named) problems.push(`unlabelled ${el.tagName.toLowerCase()} #${el.id || el.name}`);
    }
    const ids = [...document.querySelectorAll('[id]')].map(e => e.id);
    const dupes = ids.filter((id, i) => ids.indexOf(id) !== i);
    if (dupes.length) problems.push(`duplicate ids: ${dupes.join(', ')}`);
    return problems;
}"""


def page_problems(page) -> list[str]:
    return page.evaluate(_PAGE_PROBLEMS)


def horizontal_overflow(page) -> int:
    """How many CSS pixels the page is wider than its viewport."""
    return page.evaluate(
        "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )


# -- an automated accessibility check: axe-core, run in the page ------------------------

JS_DIR = REPO / "tests" / "js"
AXE = JS_DIR / "node_modules" / "axe-core" / "axe.min.js"
# What fails a page: axe's two worst levels (minor and moderate findings are not counted).
AXE_FAILING = ("serious", "critical")

_AXE_RUN = """async () => {
    const result = await axe.run(document, {resultTypes: ['violations']});
    return result.violations.map(v => ({
        id: v.id, impact: v.impact, help: v.help,
        nodes: v.nodes.slice(0, 5).map(n => n.target.join(' ')),
    }));
}"""


def axe_source() -> str:
    """axe-core from tests/js (pinned in its package-lock.json), installed with `npm ci` when
    absent, as the TypeScript client test does: nothing is fetched while the tests run pages."""
    import shutil
    import subprocess

    if not AXE.exists():
        npm = shutil.which("npm")
        assert npm, "tests/js needs `npm ci` (axe-core) and npm is missing"
        proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=JS_DIR,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0 and AXE.exists(), proc.stderr[-2000:]
    return AXE.read_text(encoding="utf-8")


def axe_violations(page) -> list[dict]:
    """axe-core's serious and critical violations on the page as it is now.

    The script is evaluated through the DevTools protocol (``page.evaluate``), which the
    pages' Content-Security-Policy does not govern: no inline script is added to the page,
    and the CSP stays on for the check (``bypass_csp`` is not needed).
    """
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.evaluate(axe_source() + "\n;undefined")
    return [v for v in page.evaluate(_AXE_RUN) if v["impact"] in AXE_FAILING]


# -- the README's screenshots ------------------------------------------------------------

# What the README shows, each taken by test_readme_screenshots (docs/screenshots/<name>.png).
README_SHOTS = ("search", "document", "pdf-citation", "collection")
SCREENSHOT_MARK = "groundkit tests/test_browser.py::test_readme_screenshots"


def mark_png(data: bytes, text: str = SCREENSHOT_MARK) -> bytes:
    """``data`` with a PNG tEXt chunk (keyword "Software") naming the test that took it,
    inserted after IHDR: the README test checks every image it embeds carries it."""
    import zlib

    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    after_ihdr = 8 + 12 + int.from_bytes(data[8:12], "big")
    body = b"Software\x00" + text.encode("latin-1")
    chunk = (len(body).to_bytes(4, "big") + b"tEXt" + body
             + zlib.crc32(b"tEXt" + body).to_bytes(4, "big"))
    return data[:after_ihdr] + chunk + data[after_ihdr:]


def png_text(data: bytes) -> dict[str, str]:
    """A PNG's tEXt chunks, keyword to text."""
    out, pos = {}, 8
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        if kind == b"tEXt":
            key, _, value = data[pos + 8:pos + 8 + length].partition(b"\x00")
            out[key.decode("latin-1")] = value.decode("latin-1")
        if kind == b"IEND":
            break
        pos += 12 + length
    return out
