"""Read a chapter source: MyST markdown in jupytext's `md:myst` layout, plus two directives.

A chapter is a sequence of blocks:

* markdown text (split into cells at code cells, directives and `+++` lines);
* ```` ```{code-cell} ```` blocks: code run in the notebook (options: `:tags: [a, b]`);
* ```` ```{exercise} chNN.name ```` : the exercise's function (a stub for the learner, the reference
  from `minisgl` in the solution and on the site), optionally followed by the directive's body:
  code that tries the function out, run in the same cell;
* ```` ```{listing} module:Qualified.name ```` : real code from the repository shown as a listing
  (also `path/to/file.py::name`), never pasted into the chapter.

Only fences at the top level of the document count; a fence inside another fence is text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Union

import yaml

DIRECTIVES = ("code-cell", "exercise", "listing")
_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})\s*(?P<info>.*)$")
_DIRECTIVE = re.compile(r"^\{(?P<name>[a-z-]+)\}\s*(?P<arg>.*)$")
_OPTION = re.compile(r"^:(?P<key>[a-z_-]+):\s*(?P<value>.*)$")
# chNN_words.md is a chapter; chNNm_words.md the milestone at the end of the part that chapter NN
# closes (it runs the learner's engine so far, classroom/milestone.py, and has no exercise of its
# own), named so that it sorts right after its chapter, in the site's navigation too.
CHAPTER_FILE = re.compile(r"^(?P<chapter>ch\d\dm?)_[a-z0-9_]+\.md$")


class SourceError(ValueError):
    """A chapter source that does not follow the format (the message says where)."""


@dataclass
class Markdown:
    text: str


@dataclass
class CodeCell:
    source: str
    tags: List[str] = field(default_factory=list)


@dataclass
class Exercise:
    chapter: str
    name: str
    tryout: str = ""  # code run after the function, in the same cell

    @property
    def key(self) -> str:
        return f"{self.chapter}.{self.name}"


@dataclass
class Listing:
    target: str  # "package.module:Qualified.name" or "path/to/file.py::name"
    caption: str = ""


Block = Union[Markdown, CodeCell, Exercise, Listing]


@dataclass
class Chapter:
    path: Path
    chapter: str  # "ch11"
    title: str
    blocks: List[Block]

    @property
    def stem(self) -> str:
        return self.path.stem  # "ch11_overlap": the notebooks and the site page take this name

    @property
    def is_milestone(self) -> bool:
        return self.chapter.endswith("m")

    @property
    def exercises(self) -> List[Exercise]:
        return [b for b in self.blocks if isinstance(b, Exercise)]


def read_chapter(path: Path) -> Chapter:
    path = Path(path)
    m = CHAPTER_FILE.match(path.name)
    if not m:
        raise SourceError(
            f"{path.name}: a chapter file is named chNN_some_words.md (a milestone's chNNm_...)"
        )
    chapter = m["chapter"]
    text = path.read_text(encoding="utf-8")
    front, body, body_line = _split_front_matter(text, path)
    meta = front.get("minisgl") or {}
    if meta.get("chapter", chapter) != chapter:
        raise SourceError(
            f"{path.name}: front matter says chapter {meta.get('chapter')!r}, the file name "
            f"{chapter!r}"
        )
    title = meta.get("title")
    if not title:
        raise SourceError(f"{path.name}: the front matter needs `minisgl: {{title: ...}}`")
    blocks = _parse_blocks(body, chapter, path, body_line)
    return Chapter(path, chapter, str(title), blocks)


def _split_front_matter(text: str, path: Path):
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}, text, 1
    for i in range(1, len(lines)):
        if lines[i].strip() == "---":
            front = yaml.safe_load("\n".join(lines[1:i])) or {}
            return front, "\n".join(lines[i + 1 :]) + "\n", i + 2
    raise SourceError(f"{path.name}: the front matter (--- ... ---) is not closed")


def _parse_blocks(body: str, chapter: str, path: Path, first_line: int) -> List[Block]:
    lines = body.splitlines()
    blocks: List[Block] = []
    text: List[str] = []

    def flush_text() -> None:
        chunk = "\n".join(text).strip("\n")
        if chunk.strip():
            blocks.append(Markdown(chunk))
        text.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        where = f"{path.name}:{first_line + i}"
        if line.strip() == "+++" or line.startswith("+++ "):  # jupytext's markdown cell break
            flush_text()
            i += 1
            continue
        fence = _FENCE.match(line)
        if not fence:
            text.append(line)
            i += 1
            continue
        end = _closing_fence(lines, i, fence["fence"])
        if end is None:
            raise SourceError(f"{where}: fence {fence['fence']} is never closed")
        directive = _DIRECTIVE.match(fence["info"].strip())
        if directive is None or directive["name"] not in DIRECTIVES:
            if directive is not None:
                raise SourceError(
                    f"{where}: unknown directive {{{directive['name']}}} "
                    f"(known: {', '.join(DIRECTIVES)})"
                )
            text.extend(lines[i : end + 1])  # an ordinary fenced block: part of the text
            i = end + 1
            continue
        flush_text()
        options, content = _split_options(lines[i + 1 : end])
        blocks.append(
            _make_block(
                directive["name"], directive["arg"].strip(), options, content, chapter, where
            )
        )
        i = end + 1
    flush_text()
    return blocks


def _closing_fence(lines: List[str], start: int, fence: str) -> int | None:
    char, n = fence[0], len(fence)
    for j in range(start + 1, len(lines)):
        s = lines[j].strip()
        if s and set(s) == {char} and len(s) >= n:
            return j
    return None


def _split_options(body: List[str]):
    """MyST options: `:key: value` lines at the top, or a `---` YAML block."""
    options: Dict[str, object] = {}
    if body and body[0].strip() == "---":
        for j in range(1, len(body)):
            if body[j].strip() == "---":
                options = yaml.safe_load("\n".join(body[1:j])) or {}
                return options, "\n".join(body[j + 1 :]).strip("\n")
    k = 0
    while k < len(body) and _OPTION.match(body[k]):
        opt = _OPTION.match(body[k])
        options[opt["key"]] = yaml.safe_load(opt["value"]) if opt["value"] else True
        k += 1
    return options, "\n".join(body[k:]).strip("\n")


def _make_block(
    name: str, arg: str, options: Dict, content: str, chapter: str, where: str
) -> Block:
    if name == "code-cell":
        tags = options.pop("tags", []) or []
        if isinstance(tags, str):
            tags = [tags]
        _no_more_options(options, where, name)
        if not content.strip():
            raise SourceError(f"{where}: an empty code cell")
        return CodeCell(content, [str(t) for t in tags])
    if name == "exercise":
        m = re.fullmatch(r"(ch\d\d)\.([A-Za-z_][A-Za-z0-9_]*)", arg)
        if not m:
            raise SourceError(f"{where}: write {{exercise}} {chapter}.name, got {arg!r}")
        if m[1] != chapter:
            raise SourceError(f"{where}: exercise {arg} belongs to another chapter than {chapter}")
        _no_more_options(options, where, name)
        return Exercise(chapter, m[2], content)
    caption = str(options.pop("caption", "") or "")
    _no_more_options(options, where, name)
    if not arg:
        raise SourceError(f"{where}: write {{listing}} package.module:Qualified.name")
    if content.strip():
        raise SourceError(f"{where}: a listing takes no body: the code comes from {arg}")
    return Listing(arg, caption)


def _no_more_options(options: Dict, where: str, name: str) -> None:
    if options:
        raise SourceError(
            f"{where}: {{{name}}} does not take option(s) {', '.join(map(str, options))}"
        )


def chapter_files(chapters_dir: Path) -> List[Path]:
    return sorted(p for p in Path(chapters_dir).glob("ch*.md") if CHAPTER_FILE.match(p.name))
