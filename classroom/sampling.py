"""What temperature, top-k and top-p do to a real next-token distribution (chapter 6).

`panel(logits, ...)` applies the engine's own `top_k_top_p_filter` to one row of logits and
returns, for the most likely tokens, their probability after the temperature and whether the
filter keeps them. `show_sampling` draws a few settings side by side as bars, and in JupyterLab
adds sliders for the three knobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Callable, List, Sequence, Tuple

import torch

from . import svg
from .display import show

KEPT, DROPPED = "#6baed6", "#e0e0e0"


@dataclass
class Setting:
    temperature: float = 1.0
    top_k: int = -1  # -1: off
    top_p: float = 1.0

    @property
    def label(self) -> str:
        k = "off" if self.top_k == -1 else str(self.top_k)
        return f"T={self.temperature:g}, top-k {k}, top-p {self.top_p:g}"


@dataclass
class Panel:
    setting: Setting
    tokens: List[int]  # the most likely tokens, most likely first
    probs: List[float]  # their probability after the temperature, before filtering
    kept: List[bool]
    num_kept: int  # over the whole vocabulary
    final: List[float]  # their probability after filtering (what the sampler draws from)


def panel(logits: torch.Tensor, setting: Setting, shown: int = 12) -> Panel:
    from minisgl.engine.sampler import top_k_top_p_filter

    logits = logits.float().flatten()
    vocab = logits.shape[0]
    scaled = logits / max(setting.temperature, 1e-6)
    k = vocab if setting.top_k == -1 else min(setting.top_k, vocab)
    filtered = top_k_top_p_filter(
        scaled.unsqueeze(0), torch.tensor([k]), torch.tensor([setting.top_p])
    )[0]
    probs, final = scaled.softmax(-1), filtered.softmax(-1)
    top = probs.argsort(descending=True)[:shown].tolist()
    kept = torch.isfinite(filtered)
    return Panel(
        setting,
        top,
        [float(probs[t]) for t in top],
        [bool(kept[t]) for t in top],
        int(kept.sum()),
        [float(final[t]) for t in top],
    )


def describe(p: Panel, token_text: Callable[[int], str]) -> str:
    rows = [f"{p.setting.label}: {p.num_kept} token(s) kept"]
    for t, prob, keep, fin in zip(p.tokens, p.probs, p.kept, p.final):
        rows.append(
            f"  {token_text(t)!r:<12} p={prob:.3f}  "
            f"{'kept, drawn with p=' + format(fin, '.3f') if keep else 'removed'}"
        )
    return "\n".join(rows)


PANEL_W, ROW_H, LABEL_W, TOP = 250, 16, 80, 40


def _panel_parts(
    p: Panel, token_text: Callable[[int], str], x0: float, top_prob: float
) -> List[str]:
    parts = [
        svg.text(x0, 16, p.setting.label, 11, weight="bold"),
        svg.text(x0, 30, f"{p.num_kept} token(s) kept", 10, fill=svg.MUTED),
    ]
    bar_w = PANEL_W - LABEL_W - 70
    for i, (t, prob, keep, fin) in enumerate(zip(p.tokens, p.probs, p.kept, p.final)):
        y = TOP + i * ROW_H
        w = max(prob / top_prob * bar_w, 1)
        parts.append(
            svg.text(
                x0 + LABEL_W - 6, y + 11, repr(token_text(t))[:12], 10, anchor="end", mono=True
            )
        )
        parts.append(
            svg.rect(
                x0 + LABEL_W,
                y + 2,
                w,
                ROW_H - 4,
                KEPT if keep else DROPPED,
                stroke="#888",
                rx=1,
                title=f"p = {prob:.4f}{'' if keep else ' (removed)'}",
            )
        )
        before, after = f"{prob:.2f}", f"{fin:.2f}"
        note = before if not keep or before == after else f"{before} → {after}"
        parts.append(
            svg.text(x0 + LABEL_W + w + 4, y + 11, note, 9, fill=svg.MUTED if keep else svg.FAINT)
        )
    return parts


def sampling_svg(panels: Sequence[Panel], token_text: Callable[[int], str], title: str = "") -> str:
    """The panels side by side; bars share one scale (the most likely token of all panels)."""
    top_prob = max(max(p.probs) for p in panels)
    parts: List[str] = []
    for i, p in enumerate(panels):
        parts.extend(_panel_parts(p, token_text, 10 + i * PANEL_W, top_prob))
    height = TOP + max(len(p.tokens) for p in panels) * ROW_H + 26
    parts.append(
        svg.text(
            10,
            height - 8,
            "bar: probability after the temperature; blue: kept, grey: removed by "
            "top-k / top-p; a → b: renormalized over the kept tokens",
            10,
            fill=svg.MUTED,
        )
    )
    return svg.document(
        max(len(panels) * PANEL_W + 10, 600), height, parts, title or "sampling settings"
    )


def show_sampling(
    logits: torch.Tensor,
    token_text: Callable[[int], str],
    settings: Sequence[Setting],
    title: str = "",
) -> None:
    """The settings side by side; in a live kernel, sliders for temperature, top-k and top-p."""

    def make_widget():
        import ipywidgets as w

        temp = w.FloatSlider(value=1.0, min=0.1, max=3.0, step=0.1, description="temperature")
        top_k = w.IntSlider(value=0, min=0, max=50, description="top-k (0 off)")
        top_p = w.FloatSlider(value=1.0, min=0.05, max=1.0, step=0.05, description="top-p")
        figure, text = w.HTML(), w.HTML()

        def redraw(_=None) -> None:
            s = Setting(temp.value, top_k.value or -1, top_p.value)
            p = panel(logits, s)
            figure.value = sampling_svg([p], token_text)
            text.value = f"<pre style='font-size:11px'>{escape(describe(p, token_text))}</pre>"

        for control in (temp, top_k, top_p):
            control.observe(redraw, "value")
        redraw()
        return w.VBox([temp, top_k, top_p, figure, text])

    panels = [panel(logits, s) for s in settings]
    show(sampling_svg(panels, token_text, title), title or "sampling settings", make_widget)


def entropy(logits: torch.Tensor, temperature: float) -> float:
    probs = (logits.float().flatten() / temperature).softmax(-1)
    probs = probs[probs > 0]
    return float(-(probs * probs.log()).sum())


def kept_counts(logits: torch.Tensor, settings: Sequence[Setting]) -> List[Tuple[str, int]]:
    return [(s.label, panel(logits, s, shown=1).num_kept) for s in settings]
