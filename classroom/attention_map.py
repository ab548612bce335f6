"""Which KV locations each query of a batch may attend to, drawn from the batch's attention
metadata.

Rows are the batch's queries in order (every request's new tokens, one after the other); columns are
the locations of the KV pool. A cell is coloured by request when that query sees that location:
the request's own tokens, up to the query's position. The picture shows at once what the metadata
encodes: one sequence for the whole batch, each request reading scattered pages, and the causal
offset of requests whose first tokens were cached before this step.
"""

from __future__ import annotations

from typing import List, Sequence

import torch

from .kvpool import PALETTE


def visible_locations(meta) -> List[List[int]]:
    """For every query of the batch (in batch order), the KV locations it may attend to."""
    cu = meta.cu_seqlens_q.tolist()
    lens_k = meta.cache_seqlens.tolist()
    out: List[List[int]] = []
    for i, len_k in enumerate(lens_k):
        len_q = cu[i + 1] - cu[i]
        locs = meta.page_table[i, :len_k].tolist()
        for j in range(len_q):
            position = len_k - len_q + j  # this query's place in its own sequence
            out.append(locs[: position + 1])
    return out


def show_attention_map(meta, num_locations: int, labels: Sequence[str], page_size: int = 1) -> None:
    """Draw the map as a matplotlib figure (SVG output). `labels` names each request."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    from .figure import show_figure

    visible = visible_locations(meta)
    cu = meta.cu_seqlens_q.tolist()
    grid = torch.zeros(len(visible), num_locations)
    for i in range(len(cu) - 1):
        for q in range(cu[i], cu[i + 1]):
            grid[q, visible[q]] = i + 1
    colors = ["white"] + [PALETTE[i % len(PALETTE)] for i in range(len(cu) - 1)]
    fig, ax = plt.subplots(figsize=(min(12, 2 + num_locations * 0.2), 1.2 + len(visible) * 0.22))
    ax.imshow(
        grid.numpy(),
        cmap=ListedColormap(colors),
        vmin=0,
        vmax=len(colors) - 1,
        aspect="auto",
        interpolation="nearest",
    )
    ax.set_xticks(range(0, num_locations, page_size))
    ax.set_xticks([x - 0.5 for x in range(0, num_locations + 1, page_size)], minor=True)
    ax.set_yticks(range(len(visible)))
    ax.set_yticks([y - 0.5 for y in range(len(visible) + 1)], minor=True)
    ax.grid(which="minor", axis="x", color="#bbbbbb", linewidth=0.6)
    for b in cu[1:-1]:
        ax.axhline(b - 0.5, color="#333333", linewidth=1.2)
    ax.tick_params(which="both", labelsize=7, length=0)
    ax.set_xlabel("KV location" + (f" (grid lines: pages of {page_size})" if page_size > 1 else ""))
    ax.set_ylabel("query (batch order)")
    handles = [
        Patch(facecolor=colors[i + 1], edgecolor="#333", label=label)
        for i, label in enumerate(labels)
    ]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.25),
        ncol=len(labels),
        fontsize=8,
        frameon=False,
    )
    show_figure(fig, "attention map: which KV locations each query of the batch sees")
