"""What a view puts in a notebook (classroom/display.py, svg.py, controls.py)."""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET

import pytest

from classroom import svg
from classroom.display import static_bundle

PICTURE = svg.document(40, 20, [svg.text(2, 12, "hi")], "a picture")


def test_the_picture_also_goes_as_an_img_an_untrusted_notebook_shows():
    """JupyterLab shows image/svg+xml only in trusted notebooks; an <img> of the same SVG always."""
    html = static_bundle(PICTURE, "a picture").get("text/html", "")
    found = re.findall(r"<img src='data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)'", html)
    assert found, f"expected an <img> with the SVG as a data URI, got {html[:80]!r}"
    assert base64.b64decode(found[0]).decode() == PICTURE, (
        "expected the <img> to hold the view's own SVG"
    )


def test_theme_colours_fall_back_to_a_light_picture_outside_jupyterlab():
    """A colour from a JupyterLab variable carries its light-theme value for an SVG file or an
    <img>, where no variable is defined; and it goes in `style`, where var() is understood."""
    root = ET.fromstring(PICTURE)
    for el in root.iter():
        for attr in ("fill", "stroke"):
            value = el.get(attr, "")
            assert "var(" not in value, (
                f"expected var() in style, not in the {attr} attribute: {value!r}"
            )
        for var in re.findall(r"var\(([^)]*)\)", el.get("style", "")):
            assert "," in var, f"expected a fallback colour in var({var})"


def test_a_slider_says_where_it_is_out_of_how_many():
    pytest.importorskip("ipywidgets")
    import ipywidgets as w

    from classroom.controls import with_range

    slider = w.IntSlider(min=1, max=9, value=1)
    label = with_range(slider).children[1]
    slider.value = 4
    assert label.value == "4 / 9", f"expected '4 / 9', got {label.value!r}"
    slider.max = 12
    assert label.value == "4 / 12", f"expected the label to follow a new max, got {label.value!r}"
