"""The built site at a phone's width and a desktop's, light and dark, checked in the browser."""

from __future__ import annotations

import functools
import http.server
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List

# Wider than the window: the page itself (not a box that scrolls on purpose), or a paragraph.
OVERFLOW_JS = """() => {
  const out = [];
  const w = document.documentElement.clientWidth;
  if (document.documentElement.scrollWidth > w + 1) out.push(`the page is ${document.documentElement.scrollWidth} px wide in a ${w} px window`);
  for (const p of document.querySelectorAll('.md-content p, .md-content li, .md-content h1, .md-content h2')) {
    if (p.closest('.nb-figure-box')) continue;  // a figure's own box scrolls on purpose
    // 4 px of slack: inline code's own padding may stick out where a long name breaks
    if (p.scrollWidth > p.clientWidth + 4) out.push(`text runs past its column: "${p.textContent.trim().slice(0, 50)}"`);
  }
  // A wide output or listing (the judge's report) must scroll, not be cut at the column's edge.
  const scrolls = e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
  for (const e of document.querySelectorAll('.md-content pre, .md-content .nb-html')) {
    if (e.scrollWidth > e.clientWidth + 1 && !scrolls(e) && !(e.parentElement && scrolls(e.parentElement)
        && e.parentElement.scrollWidth >= e.scrollWidth)) out.push(`cut, not scrolling: ${e.textContent.trim().slice(0, 50)}`);
  }
  return out.slice(0, 5);
}"""

# Every figure loaded, at its natural size (legible), and all of it reachable: inside a box that
# scrolls, or fully on screen.
FIGURES_JS = """() => {
  const out = [];
  for (const img of document.querySelectorAll('img.nb-figure')) {
    const name = img.getAttribute('src');
    if (!img.complete || !img.naturalWidth) { out.push(`${name}: not loaded`); continue; }
    const shown = img.getBoundingClientRect().width;
    if (shown < img.naturalWidth - 1) out.push(`${name}: shrunk to ${Math.round(shown)} px of its ${img.naturalWidth}`);
    const box = img.closest('.nb-figure-box');
    const scrolls = box && getComputedStyle(box).overflowX === 'auto' && box.scrollWidth >= img.naturalWidth - 1;
    if (shown > document.documentElement.clientWidth && !scrolls) out.push(`${name}: wider than the window, with no way to scroll to its edge`);
    if (!img.closest('a[href]')) out.push(`${name}: no link to open it alone`);
  }
  return out.slice(0, 5);
}"""

DOWNLOADS_JS = """async () => {
  const links = [...document.querySelectorAll('a[download]')];
  const out = [];
  if (links.length !== 2) out.push(`expected two download links (learner, solution), found ${links.length}`);
  for (const a of links) {
    const r = await fetch(a.href);
    const body = r.ok ? await r.text() : '';
    if (!r.ok || !body.includes('"cells"')) out.push(`${a.getAttribute('href')}: not a notebook (${r.status})`);
  }
  return out;
}"""


@contextmanager
def serve(site: Path) -> Iterator[str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def check_page(page, url: str, chapter: bool, dark: bool) -> List[str]:
    page.goto(url)
    page.wait_for_load_state("load")
    page.wait_for_function("() => [...document.querySelectorAll('img')].every(i => i.complete)")
    fails = list(page.evaluate(OVERFLOW_JS)) + list(page.evaluate(FIGURES_JS))
    scheme = page.evaluate("() => document.body.getAttribute('data-md-color-scheme')")
    if scheme != ("slate" if dark else "default"):
        fails.append(
            f"expected the {'dark' if dark else 'light'} scheme the system prefers, the page "
            f"uses {scheme!r}"
        )
    if not page.locator(
        "[data-md-component=palette] label, form[data-md-component=palette] label"
    ).count():
        fails.append("expected a light/dark toggle in the header, found none")
    if chapter:
        fails += page.evaluate(DOWNLOADS_JS)
        covered = page.evaluate("""() => [...document.querySelectorAll('.nb-output')].filter(
            o => o.closest('.highlight, div') && o.closest('.highlight, div').querySelector('.md-clipboard')).length""")
        if covered:
            fails.append(f"expected no copy button over an output, {covered} output(s) have one")
    return fails
