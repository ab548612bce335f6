"""Look at the built site the way a reader would, offline.

1. Every internal link and resource of every page resolves (a file, and an element with the
   anchor's id); no page loads a resource from another host.
2. Headless Chromium opens the index and the chapter pages from a local server, with every host
   name but 127.0.0.1 unresolvable: no console errors, no uncaught exceptions, no failed request,
   no request that leaves the machine. It checks that each page shows what it should and saves
   screenshots.

    python tools/site_check.py [--site site] [--out build/site_check] [--pages index.html
    ch11_overlap/]

Chromium is the system's, driven through Playwright as in tools/browser (no browser is
downloaded). Exit status 0 when everything holds.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import sys
import threading
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Dict, List, Set, Tuple
from urllib.parse import unquote, urljoin, urlparse

FETCHED = {
    ("link", "href"),
    ("script", "src"),
    ("img", "src"),
    ("source", "src"),
    ("iframe", "src"),
    ("video", "src"),
    ("audio", "src"),
    ("embed", "src"),
    ("object", "data"),
}

# What each checked page must show (page path -> JavaScript expressions that must be true).
EXPECTATIONS: Dict[str, List[Tuple[str, str]]] = {
    "index.html": [
        ("the title", "document.querySelector('h1').textContent.includes('minisgl workbook')"),
        ("the set-up command", "document.body.innerText.includes('python judge.py ch11')"),
        (
            "the chapters in the navigation",
            "[...document.querySelectorAll('nav a')].some(a => "
            "a.textContent.includes('Chapter 11'))",
        ),
    ],
    "teachers/index.html": [
        ("the title", "document.querySelector('h1').textContent.includes('For teachers')"),
        ("the grading command", "document.body.innerText.includes('python judge.py grade ch01')"),
        ("the limits", "document.body.innerText.includes('A container is the boundary')"),
    ],
    "ch11_overlap/index.html": [
        (
            "the chapter title",
            "document.querySelector('h1').textContent.includes('Overlap scheduling')",
        ),
        (
            "four exercises",
            "[...document.querySelectorAll('.admonition-title')].filter(t => "
            "t.textContent.includes('Exercise ch11.')).length === 4",
        ),
        (
            "figures that loaded",
            "[...document.querySelectorAll('img.nb-figure')].length >= 2 && "
            "[...document.querySelectorAll('img.nb-figure')].every(i => i.complete && "
            "i.naturalWidth > 0)",
        ),
        (
            "real outputs",
            "document.body.innerText.includes('launch 1') && "
            "document.body.innerText.includes('handle 3')",
        ),
        ("the judge's report", "document.body.innerText.includes('PASSED:')"),
    ],
}


# ---------------------------------------------------------------- static link check


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: List[Tuple[str, str, str]] = []  # (tag, attribute, value)
        self.ids: Set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name") and (name == "id" or tag == "a"):
                self.ids.add(value)
            if name in ("href", "src", "data"):
                self.refs.append((tag, name, value))


def check_links(site: Path) -> List[str]:
    pages: Dict[Path, _Links] = {}
    for html in sorted(site.rglob("*.html")):
        parser = _Links()
        parser.feed(html.read_text(encoding="utf-8", errors="replace"))
        pages[html.resolve()] = parser
    problems: List[str] = []
    for page, parsed in pages.items():
        rel_page = page.relative_to(site.resolve())
        for tag, attr, value in parsed.refs:
            url = urlparse(value)
            if url.scheme in ("mailto", "javascript", "data", "about", "blob"):
                continue
            if url.scheme or url.netloc:
                if (tag, attr) in FETCHED:
                    problems.append(f"{rel_page}: <{tag} {attr}={value!r}> loads from another host")
                continue
            if url.path.startswith("/"):  # site-absolute (the 404 page uses these)
                target = (site / unquote(url.path).lstrip("/")).resolve()
            else:
                target = (page.parent / unquote(url.path)).resolve() if url.path else page
            if url.path.endswith("/") or target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                problems.append(f"{rel_page}: <{tag} {attr}={value!r}> points to a missing file")
                continue
            if url.fragment and target in pages and unquote(url.fragment) not in pages[target].ids:
                problems.append(
                    f"{rel_page}: <{tag} {attr}={value!r}>: no element with id {url.fragment!r}"
                )
    return problems


# ---------------------------------------------------------------- a local server


def serve(site: Path) -> Tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


@dataclass
class PageReport:
    path: str
    console_errors: List[str] = field(default_factory=list)
    failed: List[str] = field(default_factory=list)
    external: List[str] = field(default_factory=list)
    requests: int = 0
    expectations: List[Tuple[str, bool]] = field(default_factory=list)
    screenshots: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.console_errors or self.failed or self.external) and all(
            ok for _, ok in self.expectations
        )


def visit(
    browser, base: str, path: str, out: Path, width: int = 1280, height: int = 1000
) -> PageReport:
    from playwright.sync_api import Error as PlaywrightError

    report = PageReport(path)
    context = browser.new_context(viewport={"width": width, "height": height})

    def keep_local(route) -> None:  # a request for another host is recorded and never sent
        url = urlparse(route.request.url)
        if url.scheme in ("http", "https", "ws", "wss") and url.hostname != "127.0.0.1":
            report.external.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    def request(_) -> None:
        report.requests += 1

    context.route("**/*", keep_local)
    page = context.new_page()
    page.on("request", request)
    page.on(
        "requestfailed",
        lambda r: r.url in report.external or report.failed.append(f"{r.failure} {r.url}"),
    )
    page.on(
        "response", lambda r: r.status >= 400 and report.failed.append(f"HTTP {r.status} {r.url}")
    )
    page.on("pageerror", lambda e: report.console_errors.append(f"uncaught: {e}"))
    page.on(
        "console",
        lambda m: (
            m.type in ("error", "assert")
            and report.console_errors.append(f"console.error: {m.text}")
        ),
    )
    try:
        page.goto(urljoin(base, path), wait_until="load", timeout=30_000)
        page.wait_for_load_state("networkidle", timeout=10_000)  # the search index, scripts
    except PlaywrightError as e:
        report.failed.append(f"the page did not finish loading: {str(e).splitlines()[0]}")
    for what, expr in EXPECTATIONS.get(path if path.endswith(".html") else path + "index.html", []):
        report.expectations.append((what, page.evaluate(f"() => Boolean({expr})") is True))
    stem = path.strip("/").replace("/", "_").replace(".html", "") or "index"
    shots = [(f"{stem}.png", "window.scrollTo(0, 0)")]
    if "ch11_" in path:  # also the first figures (the timeline, then the problems)
        shots.append(
            (
                f"{stem}_figure1.png",
                "document.querySelectorAll('img.nb-figure')[0].scrollIntoView()",
            )
        )
        shots.append(
            (
                f"{stem}_figure2.png",
                "document.querySelectorAll('img.nb-figure')[1].scrollIntoView()",
            )
        )
    for name, script in shots:
        page.evaluate(f"() => {{ {script}; }}")
        page.wait_for_timeout(300)
        page.screenshot(path=str(out / name))
        report.screenshots.append(str(out / name))
    context.close()
    return report


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", default="site", type=Path)
    ap.add_argument("--out", default="build/site_check", type=Path)
    ap.add_argument("--pages", nargs="*", default=["index.html", "ch11_overlap/"])
    args = ap.parse_args(argv)
    if not (args.site / "index.html").is_file():
        print(
            f"no built site in {args.site}/ (run: python -m tools.workbook site && mkdocs "
            "build --strict)"
        )
        return 2
    failed = False
    problems = check_links(args.site)
    n_pages = len(list(args.site.rglob("*.html")))
    for p in problems:
        print(f"LINK  {p}")
    print(f"links: {n_pages} pages checked, {len(problems)} problem(s)")
    failed |= bool(problems)

    binary = find_chromium()
    if binary is None:
        print("chromium not found: the browser check is skipped (apt-get install -y chromium)")
        return 1 if failed else 0
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    server, base = serve(args.site)
    pw = sync_playwright().start()
    # Every host name but the local server's fails to resolve too: nothing can leave, even a
    # request the routing above would not see (a service worker's).
    browser = pw.chromium.launch(
        executable_path=binary,
        headless=True,
        args=[
            "--no-sandbox",
            "--disable-gpu",
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        ],
    )
    try:
        for path in args.pages:
            r = visit(browser, base, path, args.out)
            status = "ok  " if r.ok else "FAIL"
            print(
                f"{status}  {path}: {r.requests} requests, all to 127.0.0.1"
                if not r.external
                else f"{status}  {path}: {r.requests} requests, {len(r.external)} to other hosts"
            )
            for e in r.external:
                print(f"      request leaving the machine: {e}")
            for e in r.failed:
                print(f"      failed: {e}")
            for e in r.console_errors:
                print(f"      console: {e}")
            for what, ok in r.expectations:
                print(f"      {'shows' if ok else 'MISSING'} {what}")
            for s in r.screenshots:
                print(f"      screenshot {s}")
            failed |= not r.ok
    finally:
        browser.close()
        pw.stop()
        server.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
