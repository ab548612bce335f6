"""Batches over time (chapter 7): which requests ran in which step, read from a run's event log.

`history(log)` turns the events of a run (`llm.events.record()`) into one `StepRecord` per launched
step: its phase, its requests, and the token each request received for it. `show_batches` draws
the result as a grid, one row per request and one column per step, and in JupyterLab adds a slider
that steps through the run and shows every request's text as it grows.

Only `launch`, `handle` and `send` events are read; nothing in the engine is replaced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from typing import Callable, Dict, List, Sequence

from . import svg
from .controls import with_range
from .display import show

PHASE_FILL = {"prefill": "#9ecae1", "decode": "#a1d99b"}


@dataclass
class StepRecord:
    step: int
    phase: str  # "prefill" | "decode"
    uids: List[int]
    rows: List[int]  # each request's slot (row of the page table and token pool)
    # uid -> the token this step produced for it
    tokens: Dict[int, int] = field(default_factory=dict)
    finished: List[int] = field(default_factory=list)  # uids whose last token came from this step


def history(log: Sequence) -> List[StepRecord]:
    """One record per launched step, in launch order, with the tokens its handling sent out."""
    steps: Dict[int, StepRecord] = {}
    handled: int | None = None  # the step whose results are being sent
    for ev in log:
        if ev.kind == "launch":
            steps[ev["step"]] = StepRecord(
                ev["step"], ev["phase"], list(ev["uids"]), list(ev["table_idxs"])
            )
        elif ev.kind == "handle":
            handled = ev["step"]
        elif ev.kind == "send" and handled in steps:
            rec = steps[handled]
            for msg in ev["msgs"]:
                if msg.error is None and msg.uid in rec.uids:
                    rec.tokens[msg.uid] = msg.next_token
                    if msg.finished:
                        rec.finished.append(msg.uid)
            handled = None
    return [steps[k] for k in sorted(steps)]


def requests_in(records: Sequence[StepRecord]) -> List[int]:
    """Every uid, in the order requests first ran."""
    seen: Dict[int, None] = {}
    for rec in records:
        for uid in rec.uids:
            seen.setdefault(uid, None)
    return list(seen)


def text_so_far(
    records: Sequence[StepRecord], uid: int, upto: int, decode: Callable[[List[int]], str]
) -> str:
    return decode([r.tokens[uid] for r in records[:upto] if uid in r.tokens])


def table(records: Sequence[StepRecord]) -> str:
    """The run as plain text: one line per step."""
    lines = []
    for r in records:
        done = f"   finished: {r.finished}" if r.finished else ""
        lines.append(f"step {r.step:>2}  {r.phase:<7}  requests {r.uids}  rows {r.rows}{done}")
    return "\n".join(lines)


# ---------------------------------------------------------------- drawing

CELL_W, CELL_H, LEFT, TOP = 30, 24, 170, 48


def batches_svg(
    records: Sequence[StepRecord],
    labels: Dict[int, str] | None = None,
    upto: int | None = None,
    title: str = "batches over time",
) -> str:
    """The grid: a box where request (row) ran in step (column), coloured by phase, with a thick
    border on the step that finished it. `upto` dims the steps after it (the widget's cursor)."""
    labels = labels or {}
    uids = requests_in(records)
    width = LEFT + len(records) * CELL_W + 16
    parts = [svg.text(8, 18, title, 13, weight="bold")]
    for j, rec in enumerate(records):
        x = LEFT + j * CELL_W
        parts.append(
            svg.text(x + CELL_W / 2, TOP - 8, str(rec.step), 10, anchor="middle", fill=svg.MUTED)
        )
    parts.append(svg.text(LEFT - 8, TOP - 8, "step", 10, anchor="end", fill=svg.MUTED))
    for i, uid in enumerate(uids):
        y = TOP + i * CELL_H
        parts.append(
            svg.text(LEFT - 8, y + 16, labels.get(uid, f"request {uid}"), 11, anchor="end")
        )
        for j, rec in enumerate(records):
            x = LEFT + j * CELL_W
            if uid not in rec.uids:
                parts.append(
                    svg.rect(
                        x + 2, y + 2, CELL_W - 4, CELL_H - 4, "#f4f4f4", stroke="#e2e2e2", rx=2
                    )
                )
                continue
            later = upto is not None and j >= upto
            fill = "#eeeeee" if later else PHASE_FILL[rec.phase]
            done = uid in rec.finished
            tip = f"step {rec.step}: {rec.phase}, row {rec.rows[rec.uids.index(uid)]}"
            if uid in rec.tokens:
                tip += f", token {rec.tokens[uid]}"
            if done:
                tip += " (its last)"
            parts.append(
                svg.rect(
                    x + 2,
                    y + 2,
                    CELL_W - 4,
                    CELL_H - 4,
                    fill,
                    stroke="#111" if done else "#666",
                    rx=2,
                    title=tip,
                )
            )
            if done and not later:
                parts.append(
                    svg.rect(x + 3, y + 3, CELL_W - 6, CELL_H - 6, "none", stroke="#111", rx=2)
                )
            parts.append(
                svg.text(
                    x + CELL_W / 2,
                    y + 16,
                    rec.phase[0].upper(),
                    10,
                    anchor="middle",
                    fill="#999" if later else "#222",
                )
            )
    y = TOP + len(uids) * CELL_H + 16
    parts.append(svg.text(LEFT - 8, y, "batch size", 10, anchor="end", fill=svg.MUTED))
    for j, rec in enumerate(records):
        parts.append(
            svg.text(
                LEFT + j * CELL_W + CELL_W / 2,
                y,
                str(len(rec.uids)),
                10,
                anchor="middle",
                fill=svg.MUTED,
            )
        )
    y += 22
    parts.append(svg.rect(LEFT, y - 11, 12, 12, PHASE_FILL["prefill"], rx=2))
    parts.append(svg.text(LEFT + 18, y, "P: prefill", 10))
    parts.append(svg.rect(LEFT + 90, y - 11, 12, 12, PHASE_FILL["decode"], rx=2))
    parts.append(svg.text(LEFT + 108, y, "D: decode", 10))
    parts.append(svg.rect(LEFT + 180, y - 11, 12, 12, "white", stroke="#111", rx=2))
    parts.append(svg.text(LEFT + 198, y, "thick border: the request's last token", 10))
    return svg.document(max(width, LEFT + 420), y + 10, parts, title)


def _status(records: Sequence[StepRecord], uid: int, upto: int) -> str:
    ran = [r for r in records[:upto] if uid in r.uids]
    if not ran:
        return "not started"
    if any(uid in r.finished for r in ran):
        return "finished"
    return "in this batch" if uid in records[upto - 1].uids else "waiting"


def show_batches(
    records: Sequence[StepRecord],
    labels: Dict[int, str] | None = None,
    decode: Callable[[List[int]], str] | None = None,
    title: str = "batches over time",
) -> None:
    """The grid as an SVG; in a live kernel also a slider through the steps that shows each
    request's state and, with `decode`, its text so far."""
    labels = labels or {}

    def make_widget():
        import ipywidgets as w

        slider = w.IntSlider(min=1, max=len(records), value=1, description="step")
        figure, panel = w.HTML(), w.HTML()

        def redraw(_=None) -> None:
            k = slider.value
            rec = records[k - 1]
            figure.value = batches_svg(records, labels, upto=k, title=title)
            rows = []
            for uid in requests_in(records):
                text = text_so_far(records, uid, k, decode) if decode else ""
                label, status = escape(labels.get(uid, str(uid))), _status(records, uid, k)
                rows.append(
                    f"<tr><td>{label}</td><td>{status}</td>"
                    "<td style='white-space:pre-wrap;font-family:monospace'>"
                    f"{escape(text)}</td></tr>"
                )
            panel.value = (
                f"<b>step {rec.step}</b>: {rec.phase} of requests {rec.uids} (rows {rec.rows})"
                f"{'; finished ' + str(rec.finished) if rec.finished else ''}"
                "<table><tr><th>request</th><th>after this step</th><th>text so far</th></tr>"
                + "".join(rows)
                + "</table>"
            )

        slider.observe(redraw, "value")
        redraw()
        return w.VBox([with_range(slider), figure, panel])

    show(batches_svg(records, labels, title=title), title, make_widget)
