"""Look at the built site the way a reader would, offline.

1. Every internal link and resource of every page resolves (a file, and an element with the
   anchor's id); no page loads a resource from another host.
2. Headless Chromium opens the index and the chapter pages from a local server, with every host
   name but 127.0.0.1 unresolvable: no console errors, no uncaught exceptions, no failed request,
   no request that leaves the machine. It checks that each page shows what it should and saves
   screenshots.

    python tools/site_check.py [--site site] [--out build/site_check] [--pages index.html
    ch11_overlap/]

Chromium is driven through the DevTools protocol over a pipe (`--remote-debugging-pipe`), so
nothing but the standard library is needed. Exit status 0 when everything holds.
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.server
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Dict, List, Set, Tuple
from urllib.parse import unquote, urljoin, urlparse

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-extensions",
                  "--disable-default-apps", "--hide-scrollbars", "--mute-audio"]
FETCHED = {("link", "href"), ("script", "src"), ("img", "src"), ("source", "src"), ("iframe", "src"),
           ("video", "src"), ("audio", "src"), ("embed", "src"), ("object", "data")}

# What each checked page must show (page path -> JavaScript expressions that must be true).
EXPECTATIONS: Dict[str, List[Tuple[str, str]]] = {
    "index.html": [
        ("the title", "document.querySelector('h1').textContent.includes('minisgl workbook')"),
        ("the set-up command", "document.body.innerText.includes('python judge.py ch11')"),
        ("the chapters in the navigation", "[...document.querySelectorAll('nav a')].some(a => "
            "a.textContent.includes('Chapter 11'))"),
    ],
    "ch11_overlap/index.html": [
        ("the chapter title", "document.querySelector('h1').textContent.includes('Overlap scheduling')"),
        ("four exercises", "[...document.querySelectorAll('.admonition-title')].filter(t => "
            "t.textContent.includes('Exercise ch11.')).length === 4"),
        ("figures that loaded", "[...document.querySelectorAll('img.nb-figure')].length >= 2 && "
            "[...document.querySelectorAll('img.nb-figure')].every(i => i.complete && "
            "i.naturalWidth > 0)"),
        ("real outputs", "document.body.innerText.includes('launch 1') && "
            "document.body.innerText.includes('handle 3')"),
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
                problems.append(f"{rel_page}: <{tag} {attr}={value!r}>: no element with id {url.fragment!r}")
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


# ---------------------------------------------------------------- Chromium over the DevTools pipe


class Chromium:
    """A headless Chromium driven through `--remote-debugging-pipe` (JSON messages, NUL-separated,
    commands on fd 3, replies and events on fd 4)."""

    def __init__(self, binary: str) -> None:
        self.profile = tempfile.mkdtemp(prefix="site-check-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def plumb() -> None:  # in the child: the pipe ends become fds 3 and 4
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        args = [binary, *CHROMIUM_FLAGS, "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
                # Every host name but the local server's fails to resolve: nothing can leave.
                "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", "about:blank"]
        self.proc = subprocess.Popen(args, preexec_fn=plumb, pass_fds=(3, 4), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self._next_id = 0
        self._replies: Dict[int, queue.Queue] = {}
        self.events: "queue.Queue[dict]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buf = b""
        while True:
            chunk = os.read(self._from_child, 1 << 16)
            if not chunk:
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg and msg["id"] in self._replies:
                    self._replies[msg["id"]].put(msg)
                else:
                    self.events.put(msg)

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30) -> dict:
        self._next_id += 1
        mid = self._next_id
        self._replies[mid] = queue.Queue()
        msg = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        reply = self._replies[mid].get(timeout=timeout)
        del self._replies[mid]
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


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
        return not (self.console_errors or self.failed or self.external) and all(ok for _, ok in self.expectations)


def visit(browser: Chromium, base: str, path: str, out: Path, width: int = 1280, height: int = 1000) -> PageReport:
    report = PageReport(path)
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        browser.send(f"{domain}.enable", session=session)
    browser.send("Emulation.setDeviceMetricsOverride",
                 {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
    url = urljoin(base, path)
    browser.send("Page.navigate", {"url": url}, session=session)
    deadline, loaded, quiet_since = time.time() + 30, False, None
    while time.time() < deadline:
        try:
            ev = browser.events.get(timeout=0.25)
        except queue.Empty:
            if loaded and quiet_since and time.time() - quiet_since > 1.5:
                break  # loaded, and nothing new for a while (the search index, fonts, scripts)
            continue
        quiet_since = time.time()
        if ev.get("sessionId") != session:
            continue
        method, params = ev.get("method", ""), ev.get("params", {})
        if method == "Page.loadEventFired":
            loaded = True
        elif method == "Network.requestWillBeSent":
            report.requests += 1
            req_url = params["request"]["url"]
            host = urlparse(req_url).hostname
            if urlparse(req_url).scheme in ("http", "https", "ws", "wss") and host != "127.0.0.1":
                report.external.append(req_url)
        elif method == "Network.loadingFailed":
            if not params.get("canceled"):
                report.failed.append(f"{params.get('errorText')} (request {params.get('requestId')})")
        elif method == "Network.responseReceived":
            status = params["response"]["status"]
            if status >= 400:
                report.failed.append(f"HTTP {status} {params['response']['url']}")
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            report.console_errors.append("uncaught: " + details.get("exception", {}).get("description", details.get("text", "")))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            report.console_errors.append("console.error: " + " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            report.console_errors.append(f"{params['entry'].get('source')}: {params['entry'].get('text')} "
                f"{params['entry'].get('url', '')}")
    if not loaded:
        report.failed.append("the page did not finish loading in 30 s")
    for what, expr in EXPECTATIONS.get(path if path.endswith(".html") else path + "index.html", []):
        value = browser.send("Runtime.evaluate", {"expression": f"Boolean({expr})", "returnByValue": True},
                             session=session).get("result", {}).get("value")
        report.expectations.append((what, value is True))
    stem = path.strip("/").replace("/", "_").replace(".html", "") or "index"
    shots = [(f"{stem}.png", "window.scrollTo(0, 0)")]
    if "ch11" in path:  # also the first figures (the timeline, then the problems)
        shots.append((f"{stem}_figure1.png", "document.querySelectorAll('img.nb-figure')[0].scrollIntoView()"))
        shots.append((f"{stem}_figure2.png", "document.querySelectorAll('img.nb-figure')[1].scrollIntoView()"))
    for name, script in shots:
        browser.send("Runtime.evaluate", {"expression": script}, session=session)
        time.sleep(0.3)
        png = browser.send("Page.captureScreenshot", {"format": "png"}, session=session)["data"]
        (out / name).write_bytes(base64.b64decode(png))
        report.screenshots.append(str(out / name))
    browser.send("Target.closeTarget", {"targetId": target})
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
        print(f"no built site in {args.site}/ (run: python -m tools.workbook site && mkdocs "
            "build --strict)")
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
    args.out.mkdir(parents=True, exist_ok=True)
    server, base = serve(args.site)
    browser = Chromium(binary)
    try:
        browser.send("Browser.getVersion", timeout=60)
        for path in args.pages:
            r = visit(browser, base, path, args.out)
            status = "ok  " if r.ok else "FAIL"
            print(f"{status}  {path}: {r.requests} requests, all to 127.0.0.1" if not r.external else
                  f"{status}  {path}: {r.requests} requests, {len(r.external)} to other hosts")
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
        server.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
