"""Real-browser checks of the course website: Playwright driving Debian's Chromium.

:func:`check_pages` opens pages of a built site the way a reader does and returns every problem
it finds, as text (an empty list means clean):

* a console error or an uncaught exception, a failed request or an HTTP status >= 400;
* a request to any host but the local server (the site must work offline);
* an image that did not load (``naturalWidth`` 0);
* math left untypeset: a page with math but no MathJax output, or raw ``$$`` in its text;
* an internal link to a page or file that is not in the site, or to an anchor the page lacks.

The browser is the system's Chromium (``/usr/bin/chromium``, Debian package ``chromium``;
``FEDLIB_CHROMIUM`` overrides): Playwright cannot download its own without a network.
"""
from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Iterator, Optional
from urllib.parse import unquote, urljoin, urlsplit

import pytest

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> Optional[str]:
    candidate = os.environ.get("FEDLIB_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    return candidate if Path(candidate).exists() else None


def require_browser() -> str:
    """The Chromium executable; skip the test without one, except in CI, where it fails."""
    path = chromium_path()
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        path = None
    if path is None:
        message = ("the browser tests need Playwright (pip install -e '.[dev]') and Debian's Chromium "
                   "(apt-get install chromium; or set FEDLIB_CHROMIUM to a Chromium executable)")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@contextlib.contextmanager
def launch() -> Iterator:
    """A headless Chromium (Playwright ``Browser``)."""
    from playwright.sync_api import sync_playwright

    executable = require_browser()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def serve(root: Path) -> Iterator[str]:
    """Serve ``root`` on 127.0.0.1 (a free port); yields the base URL ending in ``/``."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def site_pages(root: Path) -> list[str]:
    """Every HTML page of a built site, as paths relative to ``root`` (Sphinx's search and
    generated index pages included)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.html") if "_static" not in p.parts)


_ID = re.compile(r"""\sid=["']([^"']+)["']""")


@functools.lru_cache(maxsize=None)
def _anchors(path: Path) -> frozenset[str]:
    return frozenset(_ID.findall(path.read_text(errors="replace")))


def _link_problems(root: Path, page: str, hrefs: list[str]) -> list[str]:
    problems = []
    base = "http://site/" + page
    for href in hrefs:
        if not href or href.startswith(("mailto:", "javascript:")):
            continue
        url = urlsplit(urljoin(base, href))
        if url.scheme not in ("http", "https") or url.netloc != "site":
            continue  # an external link: a reference, not a resource the page loads
        target = root / unquote(url.path.lstrip("/"))
        if target.is_dir():
            target = target / "index.html"
        if not target.exists():
            problems.append(f"{page}: link {href!r} points at {target.relative_to(root)}, which is not in the site")
        elif url.fragment and target.suffix == ".html" and unquote(url.fragment) not in _anchors(target):
            problems.append(f"{page}: link {href!r}: {target.relative_to(root)} has no anchor #{url.fragment}")
    return problems


_PAGE_FACTS = """() => ({
    images: Array.from(document.images).map(img => ({src: img.getAttribute('src'), complete: img.complete,
                                                      width: img.naturalWidth})),
    hrefs: Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href')),
    mathSource: document.querySelectorAll('.math, span.math, div.math').length,
    mathTypeset: document.querySelectorAll('mjx-container').length,
    // the prose: code shows "$$" on purpose (how to write math), typeset math is no longer text
    prose: (() => { const copy = document.body.cloneNode(true);
                    copy.querySelectorAll('code, pre, script, style, mjx-container').forEach(e => e.remove());
                    return copy.textContent; })(),
})"""


def check_pages(browser, root: Path, pages: list[str], base_url: str) -> list[str]:
    """Open each page of ``pages`` (relative to ``root``, served at ``base_url``); return the problems."""
    problems: list[str] = []
    local = base_url.rstrip("/")
    for page in pages:
        context = browser.new_context()
        tab = context.new_page()
        seen: list[str] = []
        tab.on("console", lambda message: seen.append(f"console {message.type}: {message.text}")
               if message.type == "error" else None)
        tab.on("pageerror", lambda error: seen.append(f"uncaught exception: {error}"))
        tab.on("requestfailed", lambda request: seen.append(f"request failed: {request.url}"))
        tab.on("response", lambda response: seen.append(f"HTTP {response.status}: {response.url}")
               if response.status >= 400 else None)
        tab.on("request", lambda request: seen.append(f"request outside the site: {request.url}")
               if not request.url.startswith((local, "data:", "blob:", "about:")) else None)
        tab.goto(base_url + page, wait_until="load")
        if 'class="math' in (root / page).read_text(errors="replace"):  # wait for the first typesetting
            tab.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                                  timeout=30_000)
            tab.evaluate("() => MathJax.startup.promise.then(() => true)")
        tab.wait_for_load_state("networkidle")
        facts = tab.evaluate(_PAGE_FACTS)
        problems += [f"{page}: {item}" for item in seen]
        for image in facts["images"]:
            if not image["complete"] or image["width"] == 0:
                problems.append(f"{page}: image {image['src']!r} did not load")
        if facts["mathSource"] and not facts["mathTypeset"]:
            problems.append(f"{page}: {facts['mathSource']} math elements but no MathJax output")
        if "$$" in facts["prose"]:
            problems.append(f"{page}: raw '$$' in the rendered text (math not typeset)")
        problems += _link_problems(root, page, facts["hrefs"])
        context.close()
    return problems
