"""Render the site's pages (markdown for mkdocs) from the executed solution notebooks.

A chapter page is the solution notebook, cell by cell: prose as written, code with its real
outputs, each exercise as its stub with the reference solution folded underneath. Widgets show
their static fallback (the SVG or PNG they put beside the live view). Figures are written next
to the page. Cells tagged `remove-cell`, `remove-input` or `remove-output` are left out in part.
"""

from __future__ import annotations

import base64
import re
import shutil
from html import unescape
from pathlib import Path
from typing import List

import nbformat

from . import exercises, notebook
from .paths import CHAPTERS, SITE_DOCS
from .source import Chapter, Exercise

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
SITE_FILES = ("index.md", "teachers.md")  # pages of chapters/ copied as they are


def render_page(chapter: Chapter, solution: nbformat.NotebookNode, out_dir: Path) -> str:
    exercise_blocks = iter(chapter.exercises)  # the exercise cells come in the same order
    assets = out_dir / f"{chapter.stem}_files"
    parts: List[str] = []
    for i, cell in enumerate(solution.cells):
        tags = set(cell.get("metadata", {}).get("tags", []))
        if "remove-cell" in tags:
            continue
        kind = notebook.cell_kind(cell)
        if cell.cell_type == "markdown":
            if kind != "exercise_intro":  # the exercise box below says it
                text = notebook.page_links(cell.source)
                parts.append(_under_title(text, download_links(chapter)) if not i else text)
            continue
        outputs = [] if "remove-output" in tags else _outputs(cell, assets, f"cell{i:03d}")
        if kind == "exercise":
            parts.append(_exercise_box(next(exercise_blocks), outputs))
            continue
        if "remove-input" not in tags:
            parts.append(_code(cell.source))
        parts.extend(outputs)
    return "\n\n".join(p.rstrip() for p in parts if p.strip()) + "\n"


DOWNLOADS = "downloads"  # build/site_docs/downloads/{learner,solution}/chNN_*.ipynb


def download_links(chapter: Chapter) -> str:
    name = f"{chapter.stem}.ipynb"
    return (
        "Download this chapter as a notebook: [the learner's, to work "
        f"in]({DOWNLOADS}/learner/{name})"
        f'{{ download="{name}" }} · [the solution, run, with its '
        f"outputs]({DOWNLOADS}/solution/{name})"
        f'{{ download="{chapter.stem}_solution.ipynb" }}. Open it with `jupyter lab`, from the '
        "repository's folder (the notebooks import `minisgl` and `judge`).\n{ .nb-downloads }"
    )


def _under_title(markdown: str, block: str) -> str:
    """`block` right under the page's `# title` line (at the top if there is none)."""
    lines = markdown.splitlines()
    at = next((k + 1 for k, line in enumerate(lines) if line.startswith("# ")), 0)
    return "\n".join(lines[:at] + ["", block, ""] + lines[at:])


def copy_notebooks(chapter: Chapter, learner: Path, solution: Path, out_dir: Path) -> None:
    for kind, src in (("learner", learner), ("solution", solution)):
        dest = out_dir / DOWNLOADS / kind / f"{chapter.stem}.ipynb"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)


def _exercise_box(block: Exercise, outputs: List[str]) -> str:
    """The stub as the learner gets it, the reference folded underneath, then the try-out code
    and what it printed with the reference in place."""
    info = exercises.info(block.chapter, block.name)
    body = [
        f"Write `{info.qualname}` (in `{exercises.module_path(info)}`). The learner's "
        "notebook starts from this stub:",
        _code(exercises.stub_source(block.chapter, block.name)),
        '??? success "Reference solution"',
        "",
        _indent(_code(exercises.reference_source(block.chapter, block.name))),
    ]
    if block.tryout.strip():
        body += [
            "The notebook tries the function out inside the engine; with the reference in place:",
            _code(block.tryout),
        ]
        body += outputs
    return f'!!! question "Exercise {block.key}"\n\n' + _indent("\n\n".join(body))


def _code(source: str, lang: str = "python") -> str:
    fence = notebook.fence_for(source)
    return f"{fence}{lang}\n{source.rstrip()}\n{fence}"


def _indent(text: str) -> str:
    return "\n".join(("    " + line) if line.strip() else "" for line in text.splitlines())


def _outputs(cell, assets: Path, stem: str) -> List[str]:
    parts: List[str] = []
    for j, out in enumerate(cell.get("outputs", [])):
        kind = out.get("output_type")
        if kind == "stream":
            text = _ANSI.sub("", out.get("text", ""))
            if text.strip():
                parts.append(_output_text(text))
        elif kind == "error":
            parts.append(_output_text(_ANSI.sub("", "\n".join(out.get("traceback", [])))))
        elif kind in ("display_data", "execute_result"):
            parts.append(_rich(out.get("data", {}), assets, f"{stem}-{j}"))
    return [p for p in parts if p]


def _output_text(text: str) -> str:
    fence = notebook.fence_for(text)
    return f"{fence}text {{ .nb-output .no-copy }}\n{text.rstrip()}\n{fence}"


# A view's static pictures as the notebook has them (classroom/display.py): <img>s of SVG data.
_VIEW_IMG = re.compile(r"<img src='data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)' alt='([^']*)'")


def _rich(data, assets: Path, stem: str) -> str:
    views = _VIEW_IMG.findall(_joined(data.get("text/html", "")))
    if views:  # each picture of a view its own figure (chapter 11's four problems: four figures)
        return "\n\n".join(
            _figure(
                assets,
                f"{stem}-{k}.svg" if len(views) > 1 else f"{stem}.svg",
                base64.b64decode(b64),
                {"text/plain": unescape(alt)},
            )
            for k, (b64, alt) in enumerate(views)
        )
    if "image/svg+xml" in data:
        return _figure(assets, f"{stem}.svg", _joined(data["image/svg+xml"]).encode(), data)
    if "image/png" in data:
        return _figure(assets, f"{stem}.png", base64.b64decode(_joined(data["image/png"])), data)
    if "text/html" in data:
        if "text/plain" in data and not _ANSI.sub("", _joined(data["text/plain"])).strip():
            return ""  # a blank line of a rich report: nothing to show
        html = _joined(data["text/html"]).strip()
        # A blank line would end the raw HTML block in Python-Markdown: an empty element keeps the
        # line (inside the judge's <pre> report it is a line of its own) without ending the block.
        html = "\n".join(line if line.strip() else "<span></span>" for line in html.splitlines())
        return f'<div class="nb-output nb-html" markdown="0">\n{html}\n</div>'
    if "text/markdown" in data:
        return _joined(data["text/markdown"])
    if "text/plain" in data:
        return _output_text(_ANSI.sub("", _joined(data["text/plain"])))
    return ""


def _figure(assets: Path, name: str, payload: bytes, data) -> str:
    assets.mkdir(parents=True, exist_ok=True)
    (assets / name).write_bytes(payload)
    alt = (
        _joined(data.get("text/plain", "figure")).strip().strip("<>").replace("\n", " ")[:120]
        or "figure"
    )
    alt = alt.replace("[", "(").replace("]", ")")
    # At its natural size, scrolling sideways in its own box when wider than the column (a phone),
    # and a link to the picture alone, to zoom into it (site.css).
    link = f"{assets.name}/{name}"
    return (
        f'<div class="nb-figure-box" markdown="1">\n\n[![{alt}]({link}){{ .nb-figure '
        f'}}]({link} "open the figure alone")\n\n</div>'
    )


def _joined(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def copy_site_files(out_dir: Path) -> None:
    for name in SITE_FILES:
        src = CHAPTERS / name
        if src.is_file():
            shutil.copyfile(src, out_dir / name)
    css = Path(__file__).with_name("site.css")
    (out_dir / "stylesheets").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(css, out_dir / "stylesheets" / "workbook.css")


def reset(out_dir: Path = SITE_DOCS) -> None:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
