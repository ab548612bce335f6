"""The prefill token budget, step by step (chapter 10).

`loads(log)` reads a run's event log and tells, for every step, how many tokens each request
computed in it: for a prefill step, the new-token counts its launch event carries; for a decode
step, one token per request. `show_budget` draws each step as a bar against the budget, one
coloured piece per request, and in JupyterLab adds buttons to pick a run and a slider through its
steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from typing import Dict, List, Sequence, Tuple

from minisgl.scheduler.cache import pages_for

from . import svg
from .controls import with_range
from .display import show


def pages_still_owed(piece, total_tokens: int, page_size: int) -> int:
    """The KV pages a chunked request may still need once `piece` is in the batch: pages for all of
    its tokens (prompt and new tokens) less the pages its cached part already holds. The try-out
    compares an adder's reservation with this, so the cell the learner reads states the rule, not
    the formula."""
    return pages_for(total_tokens, page_size) - pages_for(piece.cached_len, page_size)


PALETTE = ["#6baed6", "#fd8d3c", "#74c476", "#9e9ac8", "#e377c2", "#bcbd22", "#17becf", "#d6616b"]


@dataclass
class Piece:
    uid: int
    start: int  # how many of the request's prompt tokens were computed before this piece
    tokens: int
    last: bool = True  # the piece that completes the prompt (False: a chunk, more follows)


@dataclass
class StepLoad:
    step: int
    phase: str
    pieces: List[Piece] = field(default_factory=list)  # prefill: one per request
    decoding: List[int] = field(default_factory=list)  # decode: the requests, one token each

    @property
    def tokens(self) -> int:
        return sum(p.tokens for p in self.pieces) + len(self.decoding)


@dataclass
class BudgetRun:
    title: str
    budget: int | None  # None: no limit that matters
    steps: List[StepLoad]


def loads(log: Sequence) -> List[StepLoad]:
    out: List[StepLoad] = []
    done: Dict[int, int] = {}  # uid -> prompt tokens computed so far in this run
    for ev in log:
        if ev.kind != "launch":
            continue
        load = StepLoad(ev["step"], ev["phase"])
        if ev["phase"] == "prefill":
            for uid, n in zip(ev["uids"], ev["extend_lens"]):
                load.pieces.append(Piece(uid, done.get(uid, 0), n))
                done[uid] = done.get(uid, 0) + n
        else:
            load.decoding = list(ev["uids"])
        out.append(load)
    later: Dict[int, int] = {}  # uid -> index of its last prefill step
    for i, load in enumerate(out):
        for piece in load.pieces:
            later[piece.uid] = i
    for i, load in enumerate(out):
        for piece in load.pieces:
            piece.last = later[piece.uid] == i
    return out


def describe(load: StepLoad, budget: int | None) -> str:
    if load.phase == "decode":
        return (
            f"step {load.step:>2}  decode   {len(load.decoding)} token(s): requests {load.decoding}"
        )
    parts = []
    for p in load.pieces:
        kind = "" if p.last else ", chunk"
        parts.append(f"req {p.uid} tokens {p.start}..{p.start + p.tokens - 1}{kind}")
    of = f" of {budget}" if budget is not None else ""
    return f"step {load.step:>2}  prefill  {load.tokens:>2}{of}: " + "; ".join(parts)


def text(run: BudgetRun) -> str:
    return "\n".join(describe(s, run.budget) for s in run.steps)


# ---------------------------------------------------------------- drawing

ROW_H, LEFT, BAR_H = 22, 120, 16


def _colour(uid: int) -> str:
    return PALETTE[uid % len(PALETTE)]


def _run_svg(
    run: BudgetRun, scale: float, top: float, upto: int | None = None
) -> Tuple[List[str], float]:
    parts = [svg.text(8, top + 14, run.title, 12, weight="bold")]
    y = top + 24
    for i, load in enumerate(run.steps):
        dim = upto is not None and i >= upto
        parts.append(
            svg.text(
                LEFT - 8,
                y + 12,
                f"step {load.step} {load.phase}",
                10,
                anchor="end",
                fill=svg.FAINT if dim else svg.INK,
            )
        )
        if run.budget is not None and load.phase == "prefill":
            parts.append(
                svg.rect(
                    LEFT,
                    y,
                    run.budget * scale,
                    BAR_H,
                    "#fafafa",
                    stroke="#bbb",
                    dash=True,
                    rx=1,
                    title=f"budget {run.budget} tokens",
                )
            )
        x = LEFT
        if load.phase == "prefill":
            for p in load.pieces:
                w = p.tokens * scale
                tip = f"request {p.uid}: prompt tokens {p.start}..{p.start + p.tokens - 1}" + (
                    "" if p.last else " (a chunk)"
                )
                parts.append(
                    svg.rect(
                        x,
                        y,
                        w,
                        BAR_H,
                        "#eee" if dim else _colour(p.uid),
                        stroke="#333",
                        dash=not p.last,
                        rx=1,
                        title=tip,
                    )
                )
                if w >= 26:
                    parts.append(
                        svg.text(
                            x + w / 2,
                            y + 12,
                            f"{p.uid}: {p.tokens}",
                            9,
                            anchor="middle",
                            fill="#aaa" if dim else "#111",
                        )
                    )
                x += w
        else:
            for uid in load.decoding:
                parts.append(
                    svg.rect(
                        x,
                        y + 3,
                        scale,
                        BAR_H - 6,
                        "#eee" if dim else _colour(uid),
                        stroke="#666",
                        rx=1,
                        title=f"request {uid}: one decode token",
                    )
                )
                x += scale
            parts.append(
                svg.text(
                    x + 6,
                    y + 12,
                    f"decode {load.decoding}",
                    9,
                    fill=svg.FAINT if dim else svg.MUTED,
                )
            )
        y += ROW_H
    return parts, y + 8


def budget_svg(runs: Sequence[BudgetRun], upto: int | None = None) -> str:
    """Each run as rows of bars: one row per step, one coloured piece per request; dashed outline:
    the budget; a dashed piece is a chunk (more of that prompt follows)."""
    widest = max(max((s.tokens for s in r.steps), default=1) for r in runs)
    widest = max([widest] + [r.budget for r in runs if r.budget is not None])
    scale = min(14.0, 520.0 / widest)
    parts: List[str] = []
    y = 4.0
    for run in runs:
        run_parts, y = _run_svg(run, scale, y, upto)
        parts.extend(run_parts)
    legend = (
        "a box per request (colour), its width the tokens it computes in that step; "
        "dashed box: a chunk; dashed outline: the budget"
    )
    parts.append(svg.text(8, y + 8, legend, 10, fill=svg.MUTED))
    width = LEFT + widest * scale + 160
    return svg.document(max(width, 640), y + 16, parts, "prefill token budget")


def show_budget(runs: Sequence[BudgetRun]) -> None:
    def make_widget():
        import ipywidgets as w

        pick = w.ToggleButtons(options=[(r.title, i) for i, r in enumerate(runs)], value=0)
        slider = w.IntSlider(min=1, max=len(runs[0].steps), value=1, description="step")
        figure, caption = w.HTML(), w.HTML()

        def redraw(_=None) -> None:
            run = runs[pick.value]
            slider.max = len(run.steps)
            k = min(slider.value, slider.max)
            figure.value = budget_svg([run], upto=k)
            caption.value = f"<pre>{escape(describe(run.steps[k - 1], run.budget))}</pre>"

        pick.observe(redraw, "value")
        slider.observe(redraw, "value")
        redraw()
        return w.VBox([pick, with_range(slider), figure, caption])

    show(budget_svg(runs), "prefill token budget: " + ", ".join(r.title for r in runs), make_widget)
