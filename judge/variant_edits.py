"""Known-wrong variants (judge/variants/) as edits of the current reference.

A variant is one mistake a learner could make. Most are the reference function with a line or two
changed, so they are kept as that change, `chNN_<mistake>.diff`, and the judge builds the wrong
function from the reference as it is now:

    The summary of the mistake, one paragraph (`--variant list` shows it).

    What it breaks and why, as many paragraphs as it takes.

    @@ try_add_one
         extend = len(pending.input_ids) - cached_len
    -    chunk = min(extend, self.token_budget)
    +    chunk = min(extend, self.token_budget + 1)  # the bug: one token over the budget

Everything before the first `@@` line is the description. Each `@@ <exercise>` starts a hunk of
that exercise's function (the registry's exercise name), written as `judge.stubs.reference_source`
gives it: at top level, indented as there. A hunk is read like a unified diff without line numbers:
its context (` `) and `-` lines, in order, must occur exactly once in the function, as whole lines;
they become its context and `+` lines. An empty line inside a hunk is an empty context line.
`@@ imports` holds `+` lines only: imports the wrong function needs that its module lacks.

So a change to the reference cannot silently change what a variant tests: a hunk whose lines are
gone, or now occur twice, or a function its hunks leave as it was (comments and docstring aside),
is an error naming the variant and the hunk, and the self-check fails on it.

A few variants are a different function altogether (a learner's other way of being wrong), where
an edit would be the whole body: those stay whole Python files, `chNN_<mistake>.py`, with the
module docstring as description and a `# whole function: <why>` comment saying why.

Only the standard library and the registry are used: nothing here imports torch or the engine.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

from .registry import Chapter, load_registry, variants_dir
from .sources import LearnerCode, Snippet, analyze
from .stubs import reference_source

SUFFIXES = (".diff", ".py")
WHOLE_MARK = re.compile(r"^# whole function: \S", re.MULTILINE)
IMPORTS = "imports"


class VariantError(ValueError):
    """A variant that cannot be built; the message names the variant and what is wrong."""


@dataclass(frozen=True)
class Hunk:
    exercise: str  # the registry's exercise name, or IMPORTS
    old: Tuple[str, ...]  # context and `-` lines, in order
    new: Tuple[str, ...]  # context and `+` lines, in order
    line: int  # of its `@@` in the file, for messages

    def where(self, variant: str) -> str:
        return f"variant {variant}, hunk `@@ {self.exercise}` (line {self.line})"


@dataclass(frozen=True)
class Variant:
    name: str  # "ch10_chunk_one_over_budget"
    path: Path
    description: str
    hunks: Tuple[Hunk, ...]  # empty for a whole-function variant
    whole: bool

    @property
    def chapter_key(self) -> str:
        return self.name.split("_", 1)[0]

    def summary(self) -> str:
        """The description's first paragraph, on one line."""
        return " ".join(self.description.strip().split("\n\n")[0].split())


# ---------------------------------------------------------------------- reading


def variant_path(name: str) -> Path:
    """The file of the variant `name` (its full stem, "ch11_upstream_finished")."""
    for suffix in SUFFIXES:
        path = variants_dir() / f"{name}{suffix}"
        if path.is_file():
            return path
    raise VariantError(f"no variant {name}: neither {name}.diff nor {name}.py in {variants_dir()}")


def read_variant(path: str | Path) -> Variant:
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return _read_whole(path, text)
    if path.suffix != ".diff":
        raise VariantError(f"{path.name}: a variant is a .diff (an edit) or a .py (whole)")
    lines = text.splitlines()
    first = next((i for i, ln in enumerate(lines) if ln.startswith("@@")), len(lines))
    description = "\n".join(lines[:first]).strip()
    if not description:
        raise VariantError(f"variant {path.stem}: no description before its first `@@` line")
    hunks = []
    starts = [i for i in range(first, len(lines)) if lines[i].startswith("@@")]
    for start, end in zip(starts, starts[1:] + [len(lines)]):
        hunks.append(_read_hunk(path.stem, lines, start, end))
    if not any(h.exercise != IMPORTS for h in hunks):
        raise VariantError(f"variant {path.stem}: no `@@ <exercise>` hunk changes a function")
    return Variant(path.stem, path, description, tuple(hunks), whole=False)


def _read_whole(path: Path, text: str) -> Variant:
    if not WHOLE_MARK.search(text):
        raise VariantError(
            f"variant {path.stem}: a .py variant is a whole function and says why in a "
            "`# whole function: <why>` comment (or write it as an edit, a .diff)"
        )
    try:
        description = ast.get_docstring(ast.parse(text)) or ""
    except SyntaxError as e:
        raise VariantError(f"variant {path.stem}: line {e.lineno}: {e.msg}") from None
    if not description:
        raise VariantError(f"variant {path.stem}: no module docstring describing the mistake")
    return Variant(path.stem, path, description, (), whole=True)


def _read_hunk(variant: str, lines: List[str], start: int, end: int) -> Hunk:
    header = lines[start]
    exercise = header[2:].strip()
    if not re.fullmatch(r"[A-Za-z_]\w*", exercise):
        raise VariantError(
            f"variant {variant}, line {start + 1}: `{header}` should be `@@ <exercise name>`"
        )
    body = lines[start + 1 : end]
    while body and not body[-1].strip():
        body.pop()  # blank lines between hunks
    old: List[str] = []
    new: List[str] = []
    for offset, line in enumerate(body, start=start + 2):
        mark, rest = line[:1], line[1:]
        if mark in (" ", "") or not line:
            old.append(rest)
            new.append(rest)
        elif mark == "-":
            old.append(rest)
        elif mark == "+":
            new.append(rest)
        else:
            raise VariantError(
                f"variant {variant}, line {offset}: a hunk line starts with ' ', '-' or '+', "
                f"not {mark!r}"
            )
    hunk = Hunk(exercise, tuple(old), tuple(new), start + 1)
    if exercise == IMPORTS and old:
        raise VariantError(f"{hunk.where(variant)}: imports are only added (`+` lines)")
    if old == new:
        raise VariantError(f"{hunk.where(variant)}: it changes nothing (no `-` or `+` line)")
    return hunk


# ---------------------------------------------------------------------- building


def variant_source(path: str | Path, chapter: Chapter | None = None) -> str:
    """The variant's Python source, as the judge swaps it in: a whole variant's file as it is, an
    edit applied to the current reference (a VariantError if it no longer applies exactly)."""
    variant = read_variant(path)
    if variant.whole:
        return variant.path.read_text(encoding="utf-8")
    chapter = chapter or load_registry().chapter(variant.chapter_key)
    by_exercise: Dict[str, List[Hunk]] = {}
    for hunk in variant.hunks:
        by_exercise.setdefault(hunk.exercise, []).append(hunk)
    imports = [line for h in by_exercise.pop(IMPORTS, []) for line in h.new]
    known = {ex.name for ex in chapter.exercises}
    parts = [f'"""{variant.description}\n"""\n']
    if imports:
        parts.append("\n".join(imports) + "\n")
    for exercise, hunks in by_exercise.items():
        if exercise not in known:
            raise VariantError(
                f"{hunks[0].where(variant.name)}: {chapter.key} has no exercise {exercise} "
                f"(its exercises: {', '.join(sorted(known))})"
            )
        reference = reference_source(chapter.key, exercise)
        parts.append(apply_hunks(variant.name, reference, hunks))
    return "\n\n".join(parts)


def apply_hunks(variant: str, reference: str, hunks: List[Hunk]) -> str:
    """`reference` (one function's source) with each hunk applied in turn; a VariantError if a
    hunk's lines are not there exactly once, or if the function comes out unchanged."""
    lines = reference.splitlines()
    for hunk in hunks:
        at = _occurrences(lines, hunk.old)
        if len(at) != 1:
            first = next((ln for ln in hunk.old if ln.strip()), "")
            found = "not found" if not at else f"found {len(at)} times (lines {at})"
            raise VariantError(
                f"{hunk.where(variant)}: its lines are {found} in the reference "
                f"{hunk.exercise}, so the edit no longer applies exactly (first: `{first.strip()}`)"
            )
        lines[at[0] : at[0] + len(hunk.old)] = hunk.new
    built = "\n".join(lines) + "\n"
    if code_of(built) == code_of(reference):
        raise VariantError(
            f"variant {variant}: its hunks leave {hunks[0].exercise} as the reference (only "
            "comments, layout, annotations or the docstring differ): it tests nothing"
        )
    return built


def _occurrences(lines: List[str], block: Tuple[str, ...]) -> List[int]:
    n = len(block)
    if n == 0:
        return []
    return [i for i in range(len(lines) - n + 1) if tuple(lines[i : i + n]) == block]


def code_of(source: str) -> str:
    """What the function does: its code without comments, layout, docstrings or annotations."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return f"<syntax error: {e}>"  # differs from any reference, and the run will say why
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            node.annotation = None
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if not isinstance(node, ast.ClassDef):
            node.returns = None
        body = node.body
        if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def check_variant(path: str | Path, chapter: Chapter | None = None) -> str | None:
    """None if the variant builds, else why not (for the self-check's table)."""
    try:
        variant_source(path, chapter)
    except (VariantError, LookupError, OSError) as e:
        return str(e)
    return None


def variant_diff(path: str | Path) -> str:
    """What the variant changes, for a report: its hunks as written, or a whole variant's note."""
    variant = read_variant(path)
    if variant.whole:
        return f"{variant.name} is a whole function of its own (judge/variants/{variant.path.name})"
    lines = variant.path.read_text(encoding="utf-8").splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("@@"))
    return "\n".join(lines[first:]).rstrip() + "\n"


def variant_code(path: str | Path, chapter: Chapter) -> LearnerCode:
    """The variant as learner code to judge (the reference stays for what it does not change)."""
    path = Path(path)
    source = variant_source(path, chapter)
    label = str(path) if path.suffix == ".py" else f"{path} (applied to the reference)"
    code = LearnerCode(
        chapter.key, f"judge/variants/{path.name}", [Snippet(label, source)], missing="reference"
    )
    return analyze(code, chapter)
