"""A step-by-step view of two runs of the same problem side by side: upstream's code on the left,
ours on the right, one turn of the scheduler's loop at a time.

A line that only one of the two runs has in that turn is coloured: red on upstream's side, green
on ours. The static SVG shows every turn at once; the widget steps through them.
"""

from __future__ import annotations

from html import escape
from typing import Dict, List, Tuple

from . import svg
from .controls import with_range
from .display import show
from .overlap_problems import ProblemRun

LINE_H, COL_W, TURN_W, PAD, CHARS = 14, 330, 46, 8, 54
# The theme's own red and green (lighter in the dark theme); in a picture file, the light theme's.
ONLY_UPSTREAM, ONLY_OURS = "var(--jp-error-color1, #d32f2f)", "var(--jp-success-color1, #388e3c)"
# The turn the slider is on: the background of a code cell (a light grey; a near-black in the dark
# theme, where red and green still stand out), marked by an amber edge.
CURRENT = "var(--jp-cell-editor-background, #f5f5f5);border-left:3px solid #f9a825"


def _turn(run: ProblemRun, i: int) -> List[str]:
    return run.frames[i].lines if i < len(run.frames) else []


def _marked(lines: List[str], other: List[str], colour: str) -> List[Tuple[str, str]]:
    return [(line, colour if line not in other else svg.INK) for line in lines]


def problem_svg(title: str, upstream: ProblemRun, ours: ProblemRun) -> str:
    """Both runs, turn by turn, in two columns; the verdicts below, full width."""
    turns = max(len(upstream.frames), len(ours.frames))
    x_up, x_ours = PAD + TURN_W, PAD + TURN_W + COL_W + PAD
    width = x_ours + COL_W + PAD
    parts: List[str] = [svg.text(PAD, 18, title, 14, weight="bold")]
    y = 40
    for x, run, label in ((x_up, upstream, "upstream"), (x_ours, ours, "ours")):
        head = f"{label}: {'right' if run.ok else 'WRONG'}"
        parts.append(
            svg.text(x, y, head, 12, weight="bold", fill=svg.INK if run.ok else ONLY_UPSTREAM)
        )
    y += 8
    for i in range(turns):
        up, mine = _turn(upstream, i), _turn(ours, i)
        h = max(len(up), len(mine), 1) * LINE_H + 6
        fill = svg.PAPER_ALT if i % 2 == 0 else svg.PAPER
        parts.append(svg.rect(PAD, y, width - 2 * PAD, h, fill, stroke=svg.RULE, rx=0))
        parts.append(svg.text(PAD + 4, y + 13, f"turn {i + 1}", 10, fill=svg.MUTED))
        for x, lines in (
            (x_up, _marked(up, mine, ONLY_UPSTREAM)),
            (x_ours, _marked(mine, up, ONLY_OURS)),
        ):
            for j, (line, colour) in enumerate(lines):
                parts.append(
                    svg.text(x, y + 13 + j * LINE_H, line[:CHARS], 10, fill=colour, mono=True)
                )
        y += h
    y += 8
    for run, label in (
        (upstream, f"upstream ({upstream.variant})"),
        (ours, f"ours ({ours.variant})"),
    ):
        colour = svg.INK if run.ok else ONLY_UPSTREAM
        y += LINE_H + 2
        parts.append(svg.text(PAD, y, label, 11, weight="bold", fill=colour))
        for line in run.verdict:
            y += LINE_H
            parts.append(svg.text(PAD + 12, y, line[: 2 * CHARS], 10, mono=True, fill=colour))
    return svg.document(width, y + 10, parts, title)


def _html_column(run: ProblemRun, other: ProblemRun, upto: int, label: str, colour: str) -> str:
    """Turns 1..upto of `run`, the last one shaded, as one <pre> block."""
    rows = []
    for i in range(upto):
        mine, theirs = _turn(run, i), _turn(other, i)
        shade = f"background:{CURRENT};" if i == upto - 1 else ""
        body = "\n".join(
            f"<span style='color:{c}'>{escape(t)}</span>" for t, c in _marked(mine, theirs, colour)
        )
        rows.append(
            f"<div style='{shade}padding:2px 4px;border-top:1px solid {svg.RULE}'>"
            f"<span style='color:{svg.FAINT}'>turn {i + 1}</span>\n{body or '(nothing)'}</div>"
        )
    verdict = "right" if run.ok else "WRONG"
    return (
        f"<div style='flex:1;min-width:0'><b>{escape(label)}: {verdict}</b>"
        "<pre style='margin:4px 0 0 "
        f"0;font-size:12px;line-height:1.35;white-space:pre-wrap'>{''.join(rows)}</pre></div>"
    )


def show_problems(runs: Dict[str, Tuple[ProblemRun, ProblemRun]]) -> None:
    """`runs` maps a problem's title to (upstream's run, our run)."""
    titles = list(runs)

    def make_widget():
        import ipywidgets as w

        pick = w.ToggleButtons(options=titles, value=titles[0], style={"button_width": "auto"})
        turn = w.IntSlider(min=1, max=1, value=1, description="turn")
        panel, verdict = w.HTML(), w.HTML()

        def redraw(change=None) -> None:
            up, ours = runs[pick.value]
            turn.max = max(len(up.frames), len(ours.frames))
            if change is not None and change.get("owner") is pick:
                turn.value = 1
            k = turn.value
            panel.value = (
                "<div style='display:flex;gap:16px'>"
                + _html_column(up, ours, k, "upstream", ONLY_UPSTREAM)
                + _html_column(ours, up, k, "ours", ONLY_OURS)
                + "</div>"
            )
            if k == turn.max:
                verdict.value = (
                    "<div style='display:flex;gap:16px'>"
                    + "".join(
                        "<pre "
                        f"style='flex:1;font-size:12px;white-space:pre-wrap'>{escape(chr(10).join(r.verdict))}</pre>"
                        for r in (up, ours)
                    )
                    + "</div>"
                )
            else:
                verdict.value = "<i>move the slider to the last turn for the outcome</i>"

        pick.observe(redraw, "value")
        turn.observe(redraw, "value")
        redraw()
        return w.VBox([pick, with_range(turn), panel, verdict])

    figures = [problem_svg(t, *runs[t]) for t in titles]
    show(
        figures,
        "the overlap problems, upstream beside ours: " + ", ".join(titles),
        make_widget,
        labels=[f"{t}: upstream beside ours" for t in titles],
    )
