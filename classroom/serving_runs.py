"""Chapter 21's figures: the dated bench_serve.py runs in benchmarks/results, read and plotted.

A results file is the text bench_serve.py printed (a '#' line says where and when it ran): one
line with the offline throughput, then one row per request rate. Reading the files, rather than
copying their numbers into the notebook, keeps one source for every figure the chapter quotes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import List

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
NUMBER = r"\s+([\d.]+)"
ROW = re.compile(r"^\s*(inf|[\d.]+)\s+(\d+)\s+(\d+)%" + NUMBER * 4 + r"\s*$")


@dataclass
class ServingRun:
    """One bench_serve.py run: where it ran, the offline figure and a row per rate."""

    name: str
    header: str
    offline_tok_s: float
    rates: List[float] = field(default_factory=list)
    tok_s: List[float] = field(default_factory=list)
    ttft_ms: List[tuple] = field(default_factory=list)  # (p50, p99)
    itl_ms: List[tuple] = field(default_factory=list)  # (p50, p99)


def read_run(path: Path) -> ServingRun:
    """The run printed in `path`; the table's first block only (later '#' lines are notes)."""
    lines = path.read_text().splitlines()
    offline = next((ln for ln in lines if ln.startswith("offline LLM.generate:")), None)
    if offline is None:
        raise ValueError(f"{path.name}: no 'offline LLM.generate:' line; not a bench_serve run")
    run = ServingRun(path.stem, lines[0].lstrip("# "), float(offline.split()[2]))
    for line in lines:
        m = ROW.match(line)
        if m:
            run.rates.append(math.inf if m[1] == "inf" else float(m[1]))
            run.tok_s.append(float(m[2]))
            run.ttft_ms.append((float(m[4]), float(m[5])))
            run.itl_ms.append((float(m[6]), float(m[7])))
    if not run.rates:
        raise ValueError(f"{path.name}: no rows of rate, tok/s, TTFT and ITL")
    return run


def show_runs(runs: List[ServingRun]) -> None:
    """TTFT and ITL (p50 solid, p99 dashed) and throughput against the request rate, one colour
    per run; 'all at once' (rate inf) is drawn at the right end of the axis."""
    import matplotlib.pyplot as plt

    from .figure import show_figure

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for run, colour in zip(runs, ("#1f77b4", "#d62728", "#2ca02c")):
        label = run.name.replace("-bench-serve", "")  # the date and the machine
        finite = [r for r in run.rates if math.isfinite(r)]
        top = max(finite) * 4 if finite else 1.0
        xs = [r if math.isfinite(r) else top for r in run.rates]
        for ax, pairs, what in ((axes[0], run.ttft_ms, "TTFT"), (axes[1], run.itl_ms, "ITL")):
            ax.plot(xs, [p for p, _ in pairs], "o-", color=colour, label=f"{label} p50")
            ax.plot(xs, [p for _, p in pairs], "s--", color=colour, label=f"{label} p99")
            ax.set_yscale("log")
            ax.set_ylabel(f"{what} (ms)")
        axes[2].plot(xs, run.tok_s, "o-", color=colour, label=label)
        axes[2].axhline(run.offline_tok_s, color=colour, linestyle=":", linewidth=1)
    axes[2].set_ylabel("output tok/s (dotted: offline)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("request rate (req/s; last point: all at once)")
        ax.tick_params(labelsize=7)
    axes[0].legend(fontsize=6, frameon=False)
    fig.tight_layout()
    show_figure(fig, "TTFT, ITL and throughput against the request rate")
