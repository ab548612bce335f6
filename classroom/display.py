"""Show a view: in a live kernel, the interactive widget; everywhere, a static picture beside it.

All go out as ONE output with several representations. JupyterLab renders the widget while the
kernel lives. A saved notebook (where the tool strips the widget, which needs a live kernel) shows
the picture; since JupyterLab renders SVG only in notebooks the user has trusted, the picture
also goes as an `<img>` whose source is the SVG itself (a data URI), which untrusted notebooks
show: so a notebook fresh from git shows its figures. The site uses the SVG.
"""

from __future__ import annotations

import base64
from html import escape
from typing import Any, Callable, Dict, List, Sequence


def widgets_available() -> bool:
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def as_img(svg: str, label: str) -> str:
    """The SVG as an HTML <img> at its natural size, scrolling sideways when wider than the
    output."""
    data = base64.b64encode(svg.encode()).decode()
    return (
        "<div class='minisgl-figure' style='overflow-x:auto'><img "
        f"src='data:image/svg+xml;base64,{data}' "
        f"alt='{escape(label, quote=True)}' style='max-width:none'></div>"
    )


def static_bundle(
    svgs: str | Sequence[str], label: str, labels: Sequence[str] | None = None
) -> Dict[str, str]:
    """One picture, or several shown one under another (each its own figure on the site, which
    reads them from the HTML); the SVG representation holds them all in one picture."""
    figures: List[str] = [svgs] if isinstance(svgs, str) else list(svgs)
    names = list(labels) if labels else [label] * len(figures)
    from .svg import stack

    return {
        "image/svg+xml": figures[0] if len(figures) == 1 else stack(figures, label),
        "text/html": "".join(as_img(f, n) for f, n in zip(figures, names)),
        "text/plain": label,
    }


def show(
    static_svg: str | Sequence[str],
    label: str,
    make_widget: Callable[[], Any] | None = None,
    labels: Sequence[str] | None = None,
) -> None:
    """`static_svg`: the picture, or a list of pictures (`labels`: their alt texts)."""
    from IPython.display import display

    bundle: Dict[str, Any] = static_bundle(static_svg, label, labels)
    if make_widget is not None and widgets_available():
        bundle.update(make_widget()._repr_mimebundle_())
    bundle["text/plain"] = label
    display(bundle, raw=True)
