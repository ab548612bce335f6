"""Tokens per expert per step (chapter 20), recorded from a running mixture-of-experts engine.

`record_routing(llm)` hooks every sparse layer of the engine's model (`SparseMoeBlock._on_route`)
for the length of a `with` block: each routing a step does is kept, as how many of the step's
token choices went to each expert, with the step's phase. `show_loads` draws one layer's record as
a grid, one row per expert and one column per step, each cell shaded by its count; `text` prints
it. Nothing in the engine is replaced; the hook asks for the counts, which syncs a GPU, so it is
for notebooks, not for serving.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Set

import torch
from torch.overrides import TorchFunctionMode

from minisgl.core import get_global_ctx

from . import svg
from .display import show


@dataclass
class Routing:
    """Every routing of a run: per layer, one list of per-expert counts per step."""

    num_experts: int
    top_k: int
    phases: List[str] = field(default_factory=list)  # one per step
    tokens: List[int] = field(default_factory=list)  # tokens in each step
    counts: Dict[int, List[List[int]]] = field(default_factory=dict)  # layer -> steps -> experts

    def layers(self) -> List[int]:
        return sorted(self.counts)


@contextmanager
def record_routing(llm) -> Iterator[Routing]:
    blocks = [b for b in _sparse_blocks(llm.engine.model)]
    if not blocks:
        raise ValueError("this model has no sparse (mixture-of-experts) layers to record")
    moe = blocks[0]._moe
    log = Routing(moe.num_experts, moe.top_k)
    first = blocks[0]._layer_id

    def on_route(layer: int, ids: torch.Tensor) -> None:
        if layer == first:  # a new step starts at the first sparse layer
            log.phases.append(get_global_ctx().batch.phase)
            log.tokens.append(ids.shape[0])
        counts = torch.bincount(ids.reshape(-1), minlength=log.num_experts).tolist()
        log.counts.setdefault(layer, []).append(counts)

    for b in blocks:
        b._on_route = on_route
    try:
        yield log
    finally:
        for b in blocks:
            b._on_route = None


def _sparse_blocks(model):
    from minisgl.models.moe import SparseMoeBlock

    for layer in model.model.layers:
        if isinstance(layer.mlp, SparseMoeBlock):
            yield layer.mlp


def text(log: Routing, layer: int) -> str:
    """One line per step: its phase, its tokens, and the count of each expert."""
    lines = [f"step phase    tokens  tokens per expert (experts 0..{log.num_experts - 1})"]
    for step, counts in enumerate(log.counts[layer]):
        lines.append(
            f"{step:>4} {log.phases[step]:<8} {log.tokens[step]:>6}  "
            + " ".join(f"{c:>3}" for c in counts)
        )
    return "\n".join(lines)


CELL, GAP, LEFT, TOP = 22, 2, 74, 46


def _shade(count: int, most: int) -> str:
    """White for 0 to a deep orange for the busiest cell of the picture."""
    t = 0.0 if most == 0 else count / most
    r, g, b = 255, int(255 - t * 160), int(255 - t * 235)
    return f"#{r:02x}{g:02x}{b:02x}"


def picture(log: Routing, layer: int) -> str:
    steps = log.counts[layer]
    most = max((c for counts in steps for c in counts), default=0)
    title = f"layer {layer}: tokens sent to each expert, step by step ({log.top_k} per token)"
    # wide enough for the grid and for the title (about 7.5 px a character at 13 px, bold)
    width = max(LEFT + len(steps) * (CELL + GAP) + 20, 16 + 7.5 * len(title))
    height = TOP + log.num_experts * (CELL + GAP) + 40
    parts = [svg.text(8, 18, title, size=13, weight="bold")]
    for step, counts in enumerate(steps):
        x = LEFT + step * (CELL + GAP)
        phase = log.phases[step]
        parts.append(
            svg.text(x + CELL / 2, TOP - 8, phase[0].upper(), 10, "middle", fill=svg.FAINT)
        )
        for expert, c in enumerate(counts):
            y = TOP + expert * (CELL + GAP)
            tip = f"step {step} ({phase}, {log.tokens[step]} tokens): expert {expert} got {c}"
            parts.append(svg.rect(x, y, CELL, CELL, _shade(c, most), "#bbb", 2, title=tip))
            if c:
                parts.append(svg.text(x + CELL / 2, y + 15, str(c), 10, "middle", fill=svg.ON_BOX))
    for expert in range(log.num_experts):
        y = TOP + expert * (CELL + GAP) + 15
        parts.append(svg.text(LEFT - 8, y, f"expert {expert}", 11, "end", fill=svg.MUTED))
    foot = TOP + log.num_experts * (CELL + GAP) + 22
    parts.append(svg.text(LEFT, foot, "columns: steps (P prefill, D decode)", 11, fill=svg.FAINT))
    return svg.document(width, height, parts, title)


def show_loads(log: Routing, layers: List[int] | None = None) -> None:
    """The grid of each of `layers` (default: every sparse layer), one figure each."""
    layers = log.layers() if layers is None else layers
    pictures = [picture(log, layer) for layer in layers]
    show(pictures, "tokens per expert per step", labels=[f"layer {n}" for n in layers])


class Products(TorchFunctionMode):
    """`with Products(gate_up, down) as seen:` records the matrix products torch runs inside it:
    `seen.experts_read` has one set per product, the experts whose slices of `gate_up` or `down`
    it read (found by where the operand lies in their storage), and `seen.empty` counts products
    with an operand of no rows. A try-out reads from it how often each expert ran."""

    NAMES = ("matmul", "__matmul__", "mm", "bmm", "addmm", "linear", "einsum")

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor):
        super().__init__()
        self.stacks = [(w.untyped_storage().data_ptr(), w.stride(0)) for w in (gate_up, down)]
        self.experts_read: List[Set[int]] = []
        self.empty = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.NAMES:
            operands = [a for a in args if isinstance(a, torch.Tensor)]
            read = set()
            for a in operands:
                for ptr, stride in self.stacks:
                    if a.untyped_storage().data_ptr() == ptr:
                        read.add(a.storage_offset() // stride)
            self.experts_read.append(read)
            self.empty += any(a.numel() == 0 for a in operands)
        return func(*args, **(kwargs or {}))
