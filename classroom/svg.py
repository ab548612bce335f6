"""A few helpers to write SVG by hand: deterministic, dependency-free, and small.

Colours that sit on the page's background come from JupyterLab's theme variables, with the light
theme's value as the fallback: drawn inline in a live view they follow JupyterLab's light or dark
theme; in an SVG file or an `<img>` (a saved notebook, the site), where no variable is defined,
the fallback applies and the picture is the light one, on its own white background. Such
colours go in a `style` attribute, because presentation attributes (`fill='...'`) do not take
`var()`. Text drawn on a light box keeps a fixed dark ink (`ON_BOX`), whatever the theme.
"""

from __future__ import annotations

from html import escape
from typing import List

FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"

INK = "var(--jp-content-font-color1, #111)"  # text on the page
MUTED = "var(--jp-content-font-color2, #555)"  # secondary text on the page
FAINT = "var(--jp-content-font-color3, #777)"  # captions, axis numbers, what is greyed out
PAPER = "var(--jp-layout-color0, #fff)"  # the page
PAPER_ALT = "var(--jp-layout-color2, #f6f6f6)"  # every other band of the page
RULE = "var(--jp-border-color2, #ddd)"  # separators
ON_BOX = "#111"  # text on a light, fixed-colour box


def paint(**props: str) -> str:
    """fill=..., stroke=... as attributes, or as one style attribute when any is a var()."""
    props = {k.replace("_", "-"): v for k, v in props.items()}
    if any(v.startswith("var(") for v in props.values()):
        return "style='" + ";".join(f"{k}:{v}" for k, v in props.items()) + "'"
    return " ".join(f"{k}='{v}'" for k, v in props.items())


def rect(
    x: float,
    y: float,
    w: float,
    h: float,
    fill: str,
    stroke: str = "#333",
    rx: int = 4,
    dash: bool = False,
    title: str = "",
) -> str:
    extra = " stroke-dasharray='4 3'" if dash else ""
    tip = f"<title>{escape(title)}</title>" if title else ""
    return (
        f"<rect x='{x:.1f}' y='{y:.1f}' width='{w:.1f}' height='{h:.1f}' rx='{rx}' "
        f"{paint(fill=fill, stroke=stroke)}{extra}>{tip}</rect>"
    )


def text(
    x: float,
    y: float,
    s: str,
    size: int = 12,
    anchor: str = "start",
    weight: str = "normal",
    fill: str = INK,
    mono: bool = False,
) -> str:
    family = "font-family='DejaVu Sans Mono, Menlo, Consolas, monospace'" if mono else FONT
    return (
        f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' text-anchor='{anchor}' "
        f"font-weight='{weight}' {paint(fill=fill)} {family}>{escape(s)}</text>"
    )


def line(
    x1: float,
    y1: float,
    x2: float,
    y2: float,
    stroke: str = "#999",
    width: float = 1,
    dash: bool = False,
) -> str:
    extra = " stroke-dasharray='3 3'" if dash else ""
    return (
        f"<line x1='{x1:.1f}' y1='{y1:.1f}' x2='{x2:.1f}' y2='{y2:.1f}' {paint(stroke=stroke)} "
        f"stroke-width='{width}'{extra}/>"
    )


def document(width: float, height: float, parts: List[str], label: str) -> str:
    """The picture at its natural size; `max-width:100%` lets a live view shrink it to fit the
    output area (the viewBox keeps its proportions) instead of hiding its right edge."""
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}' "
        f"viewBox='0 0 {width:.0f} {height:.0f}' role='img' aria-label='{escape(label)}'"
        f" style='max-width:100%;height:auto'>"
        f"<rect width='100%' height='100%' {paint(fill=PAPER)}/>" + "".join(parts) + "</svg>"
    )


def stack(figures: List[str], label: str) -> str:
    """Several SVG documents (from `document`) one under another, in a single SVG."""
    import re

    parts, y, width = [], 0.0, 0.0
    for fig in figures:
        m = re.match(r"<svg [^>]*width='(\d+)' height='(\d+)'", fig)
        w_, h_ = float(m[1]), float(m[2])
        inner = fig[fig.index(">") + 1 : fig.rindex("</svg>")]
        parts.append(f"<g transform='translate(0,{y:.0f})'>{inner}</g>")
        y += h_ + 12
        width = max(width, w_)
    return document(width, y, parts, label)
