"""The order of work in the scheduler's loops, from a real run's event log.

`watch(llm)` subscribes to the engine's events and builds a `Timeline`: the scheduler's `launch`
and `handle` events in the order they happened, with the engine's own work ("compute N") placed
where it really ran. Where that is depends on the CPU stream mode:

* eager: a launched step runs at once, inside the launch;
* deferred: a launched step is queued and runs only when the CPU synchronizes on it, which is
  inside the `handle` that waits for its tokens. Like a GPU, the engine is behind the CPU.

Where the engine's work ran is read from the engine stream's queue length at each event (a
deferred stream counts its queued work): no method of the engine is replaced to observe it.
On a CPU the times mean little; the order is what this view shows.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Tuple

from . import svg
from .controls import with_range
from .display import show


@dataclass
class Mark:
    kind: str  # "launch" | "handle" (the CPU) or "compute" (the engine)
    step: int
    phase: str  # "prefill" | "decode"
    time: float | None = None  # perf_counter seconds, for CPU events

    @property
    def label(self) -> str:
        return f"{self.kind} {self.step}"


@dataclass
class Timeline:
    title: str
    marks: List[Mark] = field(default_factory=list)
    _queued: Deque[Tuple[int, str]] = field(default_factory=deque)

    def cpu_order(self) -> List[str]:
        return [m.label for m in self.marks if m.kind != "compute"]

    def order(self) -> List[str]:
        return [m.label for m in self.marks]

    def _engine_ran(self, still_queued: int) -> None:
        while len(self._queued) > still_queued:
            step, phase = self._queued.popleft()
            self.marks.append(Mark("compute", step, phase))


def watch(llm, title: str) -> Timeline:
    """Start recording `llm`'s loop into a Timeline (call `finish(timeline, llm)` after the run)."""
    timeline = Timeline(title)
    stream = llm.engine.stream

    def on_event(ev) -> None:
        if ev.kind not in ("launch", "handle"):
            return
        timeline._engine_ran(getattr(stream, "pending", 0))
        timeline.marks.append(Mark(ev.kind, ev["step"], ev["phase"], ev.time))
        if ev.kind == "launch":  # the event comes just before the step is handed to the engine
            timeline._queued.append((ev["step"], ev["phase"]))

    llm.events.subscribe(on_event)
    return timeline


def finish(timeline: Timeline, llm) -> Timeline:
    timeline._engine_ran(getattr(llm.engine.stream, "pending", 0))
    return timeline


# ---------------------------------------------------------------- drawing

COLORS = {"launch": "#cfe3ff", "handle": "#d5f0d0", "compute": "#ffe2b8"}
BOX_W, BOX_H, GAP, LEFT, LANE_GAP = 66, 26, 6, 190, 8


def timeline_svg(
    timelines: List[Timeline], upto: int | None = None, highlight: int | None = None
) -> str:
    """Each timeline as two lanes, the CPU (scheduler) above the engine, one column per mark in
    the order the marks happened. `upto` draws only the first marks (the widget steps through)."""
    width = LEFT + max(len(t.marks) for t in timelines) * (BOX_W + GAP) + 12
    block_h = 2 * BOX_H + LANE_GAP + 34
    parts: List[str] = []
    for r, tl in enumerate(timelines):
        top = 10 + r * block_h
        parts.append(svg.text(8, top + 14, tl.title, 13, weight="bold"))
        lanes = {"cpu": top + 22, "engine": top + 22 + BOX_H + LANE_GAP}
        parts.append(
            svg.text(
                LEFT - 10, lanes["cpu"] + 17, "CPU (scheduler)", 11, anchor="end", fill=svg.MUTED
            )
        )
        parts.append(
            svg.text(
                LEFT - 10, lanes["engine"] + 17, "engine stream", 11, anchor="end", fill=svg.MUTED
            )
        )
        shown = tl.marks if upto is None else tl.marks[:upto]
        for i, m in enumerate(shown):
            x = LEFT + i * (BOX_W + GAP)
            y = lanes["engine" if m.kind == "compute" else "cpu"]
            stroke = "#d62728" if highlight == i else "#333"
            parts.append(
                svg.rect(
                    x,
                    y,
                    BOX_W,
                    BOX_H,
                    COLORS[m.kind],
                    stroke=stroke,
                    title=f"{m.label} ({m.phase})",
                )
            )
            parts.append(
                svg.text(x + BOX_W / 2, y + 12, m.label, 11, anchor="middle", fill=svg.ON_BOX)
            )
            parts.append(svg.text(x + BOX_W / 2, y + 23, m.phase, 9, anchor="middle", fill="#555"))
    height = 10 + len(timelines) * block_h
    return svg.document(
        width, height, parts, "timeline of " + ", ".join(t.title for t in timelines)
    )


def explain(tl: Timeline, i: int) -> str:
    """One sentence about mark i, from the marks before it."""
    m = tl.marks[i]
    before = tl.marks[:i]
    launched = {x.step for x in before if x.kind == "launch"}
    handled = {x.step for x in before if x.kind == "handle"}
    if m.kind == "launch":
        waiting = sorted(launched - handled)
        if waiting:
            return (
                f"The CPU launches step {m.step} ({m.phase}) while step {waiting[0]}'s results "
                "are still "
                "unhandled: its inputs are read from the token pool, where the engine will "
                "write them."
            )
        return f"The CPU launches step {m.step} ({m.phase}); nothing else is in flight."
    if m.kind == "compute":
        prev = before[-1] if before else None
        if prev is not None and prev.kind == "launch" and prev.step == m.step:
            return f"The engine runs step {m.step} at once, inside its launch (eager CPU streams)."
        return (
            f"The engine runs step {m.step} only now, because the CPU has to wait for its tokens "
            "(deferred CPU streams: like a GPU, the engine runs behind the CPU)."
        )
    pending = sorted(launched - handled - {m.step})
    tail = f"; step {pending[0]} is already launched" if pending else ""
    return (
        f"The CPU handles step {m.step}'s results: it waits for the tokens, then sends them{tail}."
    )


def show_timeline(timelines: List[Timeline]) -> None:
    """The timelines as an SVG; in a live kernel, also a widget that steps through them."""

    def make_widget():
        import ipywidgets as w

        pick = w.ToggleButtons(
            options=[(t.title, i) for i, t in enumerate(timelines)],
            value=0,
            style={"button_width": "auto"},
        )
        n = len(timelines[0].marks)
        slider = w.IntSlider(min=1, max=n, value=n, description="events")
        figure, caption = w.HTML(), w.HTML()

        def redraw(change=None) -> None:
            tl = timelines[pick.value]
            slider.max = len(tl.marks)
            if change is not None and change.get("owner") is pick:
                slider.value = slider.max  # a new run: show all of it, then step back through it
            k = min(slider.value, slider.max)
            figure.value = timeline_svg([tl], upto=k, highlight=k - 1)
            caption.value = f"<b>{tl.marks[k - 1].label}</b>: {explain(tl, k - 1)}"

        pick.observe(redraw, "value")
        slider.observe(redraw, "value")
        redraw()
        return w.VBox([pick, with_range(slider), figure, caption])

    show(timeline_svg(timelines), "timeline: " + "; ".join(t.title for t in timelines), make_widget)


def orders(timelines: List[Timeline]) -> Dict[str, List[str]]:
    return {t.title: t.order() for t in timelines}
