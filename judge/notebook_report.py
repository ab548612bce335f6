"""The judge's report in a notebook: ONE rich HTML output, live while the tests run.

In a kernel, rich's Console sends every `print` as an output of its own (big gaps between lines)
and hard-wraps at its width. Here the report is recorded instead, the same lines as the
terminal's (`report.render`), and shown as one HTML block that keeps each line whole and lets the
browser wrap it at the output's edge. Before the report, the same output says what is running and
for how long, so a cell that takes seconds never looks dead. Colours are mid-tones that read on
JupyterLab's light and dark themes; text without a colour takes the theme's own.
"""

from __future__ import annotations

import html
import io
import threading
import time
from typing import Callable, TypeVar

from rich.console import Console
from rich.terminal_theme import TerminalTheme

T = TypeVar("T")

# Readable on white and on near-black alike (rich's default export theme has #800000 for red).
THEME = TerminalTheme(
    (255, 255, 255),
    (0, 0, 0),
    [
        (0, 0, 0),
        (211, 47, 47),
        (56, 142, 60),
        (181, 137, 0),
        (25, 118, 210),
        (194, 24, 91),
        (0, 131, 143),
        (136, 136, 136),
    ],
    [
        (100, 100, 100),
        (229, 57, 53),
        (67, 160, 71),
        (205, 155, 0),
        (30, 136, 229),
        (216, 27, 96),
        (0, 151, 167),
        (160, 160, 160),
    ],
)
PRE = (
    "<pre class='minisgl-judge' style='margin:0;padding:2px "
    "0;white-space:pre-wrap;overflow-wrap:break-word;word-break:normal;"
    "line-height:1.45;font-size:var(--jp-code-font-size,13px);"
    "font-family:var(--jp-code-font-family,monospace);background:none;color:inherit'>{code}</pre>"
)
WIDTH = 100  # the table's width; long lines are not cut at it (soft wrap), the browser wraps them


def in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def recording_console() -> Console:
    return Console(
        record=True,
        file=io.StringIO(),
        width=WIDTH,
        soft_wrap=True,
        highlight=False,
        color_system="truecolor",
        force_jupyter=False,
        force_terminal=True,
    )


def as_html(console: Console) -> str:
    return console.export_html(theme=THEME, inline_styles=True, code_format=PRE)


def bundle(body_html: str, plain: str) -> dict:
    """A display's two forms: the HTML a browser shows, and the plain text a headless run
    (nbconvert, a terminal's jupyter console) shows instead of `<IPython.core.display.HTML
    object>`."""
    return {"text/html": body_html, "text/plain": plain}


class LiveOutput:
    """One display that first says what is running (with a clock), then becomes the report."""

    def __init__(self, what: str) -> None:
        from IPython.display import display

        self._what = what
        self._start = time.monotonic()
        self._done = threading.Event()
        self._handle = display(self._running(), raw=True, display_id=True)
        self._clock = threading.Thread(target=self._tick, daemon=True)
        self._clock.start()

    def _running(self) -> dict:
        line = f"⏳ {self._what} … {time.monotonic() - self._start:.0f} s"
        return bundle(PRE.format(code=html.escape(line)), line)

    def _tick(self) -> None:
        while not self._done.wait(1.0):
            self._handle.update(self._running(), raw=True)

    def finish(self, body_html: str, plain: str) -> None:
        self._done.set()
        self._clock.join()
        self._handle.update(bundle(body_html, plain), raw=True)


def shown(what: str, run: Callable[[], T], render: Callable[[T, Console], None]) -> T:
    """Run `run()` under a live line saying `what`, then show `render(result, console)`'s report
    in its place. Outside a kernel (a plain Python shell), just print the report."""
    if not in_notebook():
        result = run()
        render(result, Console(highlight=False))
        return result
    live = LiveOutput(what)
    try:
        result = run()
    except BaseException as exc:  # the judge broke, or Interrupt: say so in the same output
        said = f"the judge stopped: {type(exc).__name__}: {exc}"
        live.finish(PRE.format(code=html.escape(said)), said)
        raise
    console = recording_console()
    render(result, console)
    plain = console.export_text(clear=False)
    live.finish(as_html(console), plain)
    return result
