"""Show a view: in a live kernel, the interactive widget; everywhere, the static SVG beside it.

Both go out as ONE output with two representations. JupyterLab renders the widget; a saved
notebook (where the tool strips the widget, which needs a live kernel) and the site render the SVG.
"""

from __future__ import annotations

from typing import Any, Callable


def widgets_available() -> bool:
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def show(static_svg: str, label: str, make_widget: Callable[[], Any] | None = None) -> None:
    from IPython.display import display

    bundle = {"image/svg+xml": static_svg}
    if make_widget is not None and widgets_available():
        bundle.update(make_widget()._repr_mimebundle_())
    bundle["text/plain"] = label
    display(bundle, raw=True)
