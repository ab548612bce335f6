"""Widget helpers shared by the views."""

from __future__ import annotations


def with_range(slider):
    """The slider with its position out of its range beside it ("4 / 9"), in place of the bare
    readout ("4"), so the reader knows how far there is to go. Follows the slider's max too (a view
    that switches runs changes it)."""
    import ipywidgets as w

    slider.readout = False
    label = w.Label()

    def update(_=None) -> None:
        label.value = f"{slider.value} / {slider.max}"

    slider.observe(update, names=["value", "max"])
    update()
    return w.HBox([slider, label])
