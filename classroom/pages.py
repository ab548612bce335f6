"""Who holds the KV pages, step by step (chapter 8).

`census(llm)` counts, right now, the pages on the free list, the pages in the prefix cache
(evictable or locked by a running request) and the pages running requests hold themselves, plus
how many requests run and wait. `watch(llm)` takes a census after every step of `llm.step()`;
`show_census` draws them as stacked bars, one per step.

Every page is in exactly one of those places, so the bars always add up to the pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import List, Sequence

from . import svg
from .controls import with_range
from .display import show

COLOURS = {"held": "#6baed6", "locked": "#fd8d3c", "evictable": "#a1d99b", "free": "#f0f0f0"}
NAMES = {
    "held": "held by running requests",
    "locked": "cached, locked",
    "evictable": "cached, evictable",
    "free": "free",
}


@dataclass
class Census:
    step: int
    free: int
    evictable: int  # pages in the prefix cache that no running request locks
    locked: int  # pages in the prefix cache that a running request locks
    held: int  # pages running requests hold outside the prefix cache
    running: int
    waiting: int

    def parts(self):
        return [
            ("held", self.held),
            ("locked", self.locked),
            ("evictable", self.evictable),
            ("free", self.free),
        ]


def census(llm) -> Census:
    cm = llm.cache_manager
    cache = cm.prefix_cache
    evictable = cache.evictable_size // cm.page_size
    locked = cache.protected_size // cm.page_size
    held = cm.num_pages - cm.num_free_pages - evictable - locked
    return Census(
        llm.steps_launched,
        cm.num_free_pages,
        evictable,
        locked,
        held,
        len(llm.decode_manager.running),
        len(llm.prefill_manager.pending),
    )


def watch(llm, limit: int = 1000) -> List[Census]:
    """Run `llm` until it is idle, taking a census after every step."""
    out = []
    for _ in range(limit):
        if not llm.busy:
            return out
        llm.step()
        out.append(census(llm))
    raise RuntimeError("the loop did not go idle")


BAR_W, H, TOP, LEFT = 18, 180, 34, 46


def census_svg(
    rows: Sequence[Census], num_pages: int, title: str = "KV pages, step by step"
) -> str:
    width = LEFT + len(rows) * BAR_W + 20
    scale = H / num_pages
    parts = [svg.text(8, 16, title, 13, weight="bold")]
    for frac in (0, 0.5, 1):
        y = TOP + H - frac * H
        parts.append(svg.line(LEFT - 4, y, width - 10, y, stroke=svg.RULE))
        parts.append(
            svg.text(LEFT - 8, y + 4, str(int(frac * num_pages)), 9, anchor="end", fill=svg.MUTED)
        )
    for i, c in enumerate(rows):
        x, y = LEFT + i * BAR_W, TOP + H
        for name, n in c.parts():
            h = n * scale
            y -= h
            if n:
                parts.append(
                    svg.rect(
                        x + 1,
                        y,
                        BAR_W - 2,
                        h,
                        COLOURS[name],
                        stroke="#999",
                        rx=0,
                        title=f"step {c.step}: {n} {NAMES[name]}",
                    )
                )
        parts.append(svg.text(x + BAR_W / 2, TOP + H + 12, str(c.running), 9, anchor="middle"))
        parts.append(
            svg.text(
                x + BAR_W / 2, TOP + H + 24, str(c.waiting), 9, anchor="middle", fill=svg.FAINT
            )
        )
        if i % 5 == 0 or i == len(rows) - 1:
            parts.append(
                svg.text(
                    x + BAR_W / 2, TOP + H + 38, str(c.step), 9, anchor="middle", fill=svg.MUTED
                )
            )
    parts.append(svg.text(LEFT - 8, TOP + H + 12, "running", 9, anchor="end"))
    parts.append(svg.text(LEFT - 8, TOP + H + 24, "waiting", 9, anchor="end", fill=svg.FAINT))
    parts.append(svg.text(LEFT - 8, TOP + H + 38, "step", 9, anchor="end", fill=svg.MUTED))
    y = TOP + H + 58
    x = LEFT
    for name in ("held", "locked", "evictable", "free"):
        parts.append(svg.rect(x, y - 10, 12, 12, COLOURS[name], stroke="#999", rx=0))
        parts.append(svg.text(x + 16, y, NAMES[name], 10))
        x += 30 + 6 * len(NAMES[name])
    return svg.document(max(width, x + 10), y + 10, parts, title)


def show_census(
    rows: Sequence[Census], num_pages: int, title: str = "KV pages, step by step"
) -> None:
    """The bars; in a live kernel also a slider that reads one step's numbers out."""

    def make_widget():
        import ipywidgets as w

        slider = w.IntSlider(min=1, max=len(rows), value=1, description="step")
        text = w.HTML()

        def redraw(_=None) -> None:
            c = rows[slider.value - 1]
            items = "".join(f"<li>{n} {escape(NAMES[name])}</li>" for name, n in c.parts())
            text.value = (
                f"<b>after step {c.step}</b>: {c.running} running, {c.waiting} waiting"
                f"<ul>{items}</ul>"
            )

        slider.observe(redraw, "value")
        redraw()
        return w.VBox([w.HTML(census_svg(rows, num_pages, title)), with_range(slider), text])

    show(census_svg(rows, num_pages, title), title, make_widget)
