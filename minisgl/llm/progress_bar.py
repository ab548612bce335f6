"""`LLM.generate`'s progress bar: tokens generated out of the most the prompts may produce.

It counts tokens, not finished requests: with continuous batching every request finishes near
the end, so a count of requests would sit at 0 % for most of the run. A request that stopped
early (end of sequence) counts as done in full. The bar is rich's, in a terminal and in a notebook
(there rich draws it in an ipywidgets output). When the run is over the bar is gone (transient);
a notebook keeps one short line saying what ran and how fast. rich imports IPython only once it
draws in a notebook, so importing the engine never does.

When it shows (`progress=` of `LLM.generate`):
  * True: always (unless MINISGL_PROGRESS=off);
  * False: never;
  * None, the default: where someone watches (a notebook kernel, or stderr is a terminal), not
    under pytest or CI, and only once the run has lasted `DELAY` seconds, so short runs print
    nothing.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Iterator, List, Sequence

from minisgl.env import ENV

DELAY = 2.0  # seconds before a bar appears on its own (progress=None)
EVERY = 0.2  # seconds between two redraws


def where(asked: bool | None) -> str | None:
    """'notebook', 'terminal', or None (no bar)."""
    setting = ENV.PROGRESS.value
    if asked is False or setting == "off":
        return None
    if (
        asked is None
        and setting == "auto"
        and (os.environ.get("PYTEST_CURRENT_TEST") or os.environ.get("CI"))
    ):
        return None
    if _in_notebook():
        return "notebook"
    if asked or setting == "on" or sys.stderr.isatty():
        return "terminal"
    return None


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


@contextmanager
def generation_progress(
    llm, uids: List[int], max_tokens: Sequence[int], asked: bool | None
) -> Iterator[None]:
    """Show a bar while `llm` runs the requests `uids` (each may produce up to `max_tokens[i]`)."""
    mode = where(asked)
    if mode is None:
        yield
        return
    bar = _Bar(notebook=mode == "notebook")
    total = sum(max_tokens)
    start, delay = time.monotonic(), 0.0 if asked else DELAY
    last = [0.0]

    def counts():
        done = tokens = 0
        for uid, most in zip(uids, max_tokens):
            r = llm.results[uid]
            tokens += len(r.token_ids)
            done += most if r.finished else len(r.token_ids)
        return done, tokens, sum(llm.results[u].finished for u in uids)

    def on_event(ev) -> None:
        now = time.monotonic()
        if ev.kind != "handle" or now - start < delay or now - last[0] < EVERY:
            return
        last[0] = now
        bar.draw(*counts(), total=total, requests=len(uids), elapsed=now - start)

    unsubscribe = llm.events.subscribe(on_event)
    try:
        yield
    finally:
        unsubscribe()
        if bar.shown:
            _, tokens, _ = counts()
            bar.close(tokens, len(uids), time.monotonic() - start)


class _Bar:
    """rich's progress bar, drawn on stderr in a terminal and in the cell's output in a notebook."""

    def __init__(self, notebook: bool) -> None:
        self.notebook = notebook
        self.shown = False
        self._progress = self._task = None

    def draw(
        self, done: int, tokens: int, finished: int, total: int, requests: int, elapsed: float
    ) -> None:
        if self._progress is None:
            self._start(total)
        self._progress.update(
            self._task, completed=done, what=f"{tokens} tokens, {finished}/{requests} requests done"
        )

    def _start(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._console = Console(stderr=not self.notebook)
        self._progress = Progress(
            TextColumn("generating"),
            BarColumn(),
            TextColumn("{task.fields[what]}"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=self._console,
            transient=True,
        )
        self._task = self._progress.add_task("generate", total=total, what="")
        self._progress.start()
        self.shown = True

    def close(self, tokens: int, requests: int, elapsed: float) -> None:
        self._progress.stop()  # transient: the bar is erased
        if self.notebook:
            self._console.print(
                f"generated {tokens} tokens for {requests} prompt(s) in {elapsed:.1f} s "
                f"({tokens / max(elapsed, 1e-9):.0f} tokens/s)",
                style="dim",
            )
