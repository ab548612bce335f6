"""A few helpers to write SVG by hand: deterministic, dependency-free, and small."""

from __future__ import annotations

from html import escape
from typing import List

FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"


def rect(x: float, y: float, w: float, h: float, fill: str, stroke: str = "#333", rx: int = 4,
         dash: bool = False, title: str = "") -> str:
    extra = " stroke-dasharray='4 3'" if dash else ""
    tip = f"<title>{escape(title)}</title>" if title else ""
    return (f"<rect x='{x:.1f}' y='{y:.1f}' width='{w:.1f}' height='{h:.1f}' rx='{rx}' fill='{fill}' "
            f"stroke='{stroke}'{extra}>{tip}</rect>")


def text(x: float, y: float, s: str, size: int = 12, anchor: str = "start", weight: str = "normal",
         fill: str = "#111", mono: bool = False) -> str:
    family = "font-family='DejaVu Sans Mono, Menlo, Consolas, monospace'" if mono else FONT
    return (f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' text-anchor='{anchor}' "
            f"font-weight='{weight}' fill='{fill}' {family}>{escape(s)}</text>")


def line(x1: float, y1: float, x2: float, y2: float, stroke: str = "#999", width: float = 1,
         dash: bool = False) -> str:
    extra = " stroke-dasharray='3 3'" if dash else ""
    return f"<line x1='{x1:.1f}' y1='{y1:.1f}' x2='{x2:.1f}' y2='{y2:.1f}' stroke='{stroke}' stroke-width='{width}'{extra}/>"


def document(width: float, height: float, parts: List[str], label: str) -> str:
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}' "
            f"viewBox='0 0 {width:.0f} {height:.0f}' role='img' aria-label='{escape(label)}'>"
            f"<rect width='100%' height='100%' fill='white'/>" + "".join(parts) + "</svg>")
