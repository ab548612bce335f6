"""Run a notebook top to bottom in a fresh kernel (nbclient), on the CPU, and time it.

The kernel gets the repository on PYTHONPATH (so `minisgl` and `judge` import without an install),
none of the MINISGL_* switches of the calling shell (so the outputs depend only on the notebook and
the bundled model; `LLM.generate`'s progress bar is off), and one OpenMP thread unless
OMP_NUM_THREADS says otherwise. The judge cell at the end of every notebook records its verdict in
build/, not in the author's own progress file.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List

import nbformat
from nbclient import NotebookClient

from judge.progress import PROGRESS_ENV

from .paths import NOTEBOOK_PROGRESS, REPO

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
CELL_TIMEOUT_S = 300


@dataclass
class Run:
    nb: nbformat.NotebookNode
    seconds: float


def kernel_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINISGL_")}
    env[PROGRESS_ENV] = str(NOTEBOOK_PROGRESS)
    # No progress bar in a saved notebook: its last line says how long the run took, which
    # changes from run to run (minisgl/llm/progress_bar.py).
    env["MINISGL_PROGRESS"] = "off"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    # One thread per kernel: on a CPU shared with other work (CI, a busy laptop), two OpenMP threads
    # fighting for two cores make the small model ten times slower; one thread is steady.
    env.setdefault("OMP_NUM_THREADS", "1")
    env["MPLBACKEND"] = "agg"
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    return env


def client(nb: nbformat.NotebookNode, cwd: Path, allow_errors: bool = False) -> NotebookClient:
    """A client for `nb` with the kernel and limits every run here uses."""
    NOTEBOOK_PROGRESS.parent.mkdir(exist_ok=True)
    return NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        allow_errors=allow_errors,
        record_timing=False,
        store_widget_state=False,
        resources={"metadata": {"path": str(cwd)}},
    )


def run(nb: nbformat.NotebookNode, cwd: Path, allow_errors: bool = False) -> Run:
    nb = nbformat.from_dict(nb)
    start = time.perf_counter()
    client(nb, cwd, allow_errors).execute(env=kernel_env(), cwd=str(cwd))
    return Run(nb, time.perf_counter() - start)


def sanitize(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """What a saved solution keeps: the static view of every widget (the live one needs a kernel,
    and without its state a saved widget output shows only an error), no volatile metadata."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept: List = []
        for out in cell.outputs:
            data = out.get("data")
            if data is not None and WIDGET_VIEW in data:
                data.pop(WIDGET_VIEW)
                if set(data) <= {"text/plain"}:
                    continue  # a widget without a static fallback leaves nothing worth keeping
            kept.append(out)
        cell.outputs = kept
        cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)
    return nb
