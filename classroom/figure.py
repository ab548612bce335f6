"""Show a matplotlib figure as SVG, whatever the backend.

The workbook's notebooks run headless (`MPLBACKEND=agg`), where `plt.show()` displays nothing. An
SVG output (with its `<img>` twin for untrusted notebooks, see display.py) works everywhere: in
JupyterLab, in a saved notebook and on the site. The SVG carries
no date and fixed element ids, so re-running a notebook changes only what the data changed.
"""

from __future__ import annotations

import io
from typing import Any


def show_figure(fig: Any, label: str) -> None:
    """Display `fig` (a matplotlib Figure) as an SVG output, then close it."""
    import matplotlib.pyplot as plt
    from IPython.display import display

    from .display import static_bundle

    buf = io.StringIO()
    with plt.rc_context({"svg.hashsalt": "minisgl", "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    display(static_bundle(buf.getvalue(), label), raw=True)
