"""Render a chapter as a notebook: the learner's (exercises stubbed, no outputs) or the solution
(exercises filled from minisgl; outputs come later, from `execute`).

Both are built from the same blocks in the same order, so cell i of one matches cell i of the other
and of the site page. Cell ids are deterministic so a rebuild with no change writes identical files.
"""

from __future__ import annotations

import re
from typing import Dict, List, Literal

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from . import exercises, listing
from .source import Chapter, CodeCell, Exercise, Listing, Markdown

Kind = Literal["learner", "solution"]

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def render(chapter: Chapter, kind: Kind) -> nbformat.NotebookNode:
    cells = []
    for block in chapter.blocks:
        cells.extend(_cells_for(block, chapter, kind))
    if not chapter.is_milestone:  # a milestone has no exercise to judge: it runs them all
        cells.extend(_judge_cells(chapter))
    for i, cell in enumerate(cells):
        cell["id"] = f"{chapter.chapter}-{i:03d}"
    nb = new_notebook(cells=cells)
    nb.metadata = {
        "kernelspec": dict(KERNELSPEC),
        "language_info": {"name": "python"},
        "minisgl": {
            "chapter": chapter.chapter,
            "title": chapter.title,
            "kind": kind,
            "source": f"chapters/{chapter.path.name}",
        },
    }
    return nb


def _cells_for(block, chapter: Chapter, kind: Kind) -> List[nbformat.NotebookNode]:
    if isinstance(block, Markdown):
        return [new_markdown_cell(notebook_links(block.text))]
    if isinstance(block, CodeCell):
        cell = new_code_cell(block.source.rstrip("\n"))
        if block.tags:
            cell.metadata["tags"] = list(block.tags)
        return [cell]
    if isinstance(block, Listing):
        code = listing.resolve(block.target)
        cell = new_markdown_cell(listing_markdown(code, block.caption))
        cell.metadata["minisgl"] = {"listing": block.target}
        return [cell]
    if isinstance(block, Exercise):
        return exercise_cells(block, kind)
    raise TypeError(block)


# A link to another chapter is written to its source, `[chapter 7](ch07_scheduler.md)`: that works
# on GitHub and on the site. In a notebook it must name the notebook beside it.
CHAPTER_LINK = re.compile(r"\]\((ch\d\d_\w+)\.(md|ipynb)(#[\w-]*)?\)")


def notebook_links(text: str) -> str:
    return CHAPTER_LINK.sub(lambda m: f"]({m.group(1)}.ipynb{m.group(3) or ''})", text)


def page_links(text: str) -> str:
    return CHAPTER_LINK.sub(lambda m: f"]({m.group(1)}.md{m.group(3) or ''})", text)


def listing_markdown(code: listing.Code, caption: str = "") -> str:
    fence = fence_for(code.source)
    head = f"**`{code.path}`** · `{code.qualname}`" + (f": {caption}" if caption else "")
    return f"{head}\n\n{fence}python\n{code.source.rstrip()}\n{fence}"


def fence_for(text: str) -> str:
    longest, run = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return "`" * max(3, longest + 1)


def exercise_cells(block: Exercise, kind: Kind) -> List[nbformat.NotebookNode]:
    ex = exercises.info(block.chapter, block.name)
    where = exercises.module_path(ex)
    if kind == "learner":
        intro = (
            f"**Exercise `{ex.id}`**: write `{ex.qualname}` (it lives in `{where}`). "
            "Keep the signature; the judge puts your function in place of the engine's. "
            f"Stuck? `python judge.py {block.chapter} --hint`."
        )
        code = exercises.stub_source(block.chapter, block.name)
    else:
        intro = (
            f"**Exercise `{ex.id}`**: `{ex.qualname}`, as `{where}` has it "
            "(the learner's notebook holds a stub here)."
        )
        code = exercises.reference_source(block.chapter, block.name)
    source = code.rstrip("\n")
    if block.tryout.strip():
        source += "\n\n\n" + block.tryout.rstrip("\n")
    cell = new_code_cell(source)
    cell.metadata["tags"] = ["exercise"]
    cell.metadata["minisgl"] = {"exercise": ex.id}
    intro_cell = new_markdown_cell(intro)
    intro_cell.metadata["minisgl"] = {"exercise_intro": ex.id}
    return [intro_cell, cell]


def _judge_cells(chapter: Chapter) -> List[nbformat.NotebookNode]:
    n = chapter.chapter
    intro = new_markdown_cell(
        "## Check your work\n\n"
        f"The next cell takes the functions you wrote in this notebook, swaps them into the engine "
        f"and runs chapter {int(n[2:])}'s tests against them. From a terminal, `python "
        f"judge.py {n}` "
        "judges the saved notebook the same way."
    )
    intro.metadata["minisgl"] = {"judge_intro": n}
    cell = new_code_cell(f'import judge\n\njudge.check("{n}")')
    cell.metadata["tags"] = ["judge"]
    cell.metadata["minisgl"] = {"judge": n}
    return [intro, cell]


def dumps(nb: nbformat.NotebookNode) -> str:
    """The committed form: sorted keys, one-space indent, a final newline."""
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def strip_outputs(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook without what execution adds: what staleness is judged on."""
    nb = nbformat.from_dict(nb)  # a deep copy
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
            cell.metadata.pop("execution", None)
    nb.metadata.get("minisgl", {}).pop("execution", None)
    nb.metadata.pop("widgets", None)
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def cell_kind(cell: Dict) -> str:
    """'exercise', 'exercise_intro', 'listing', 'judge', 'judge_intro' or '' (an ordinary cell)."""
    meta = cell.get("metadata", {}).get("minisgl", {})
    for key in ("exercise", "exercise_intro", "listing", "judge", "judge_intro"):
        if key in meta:
            return key
    return ""
