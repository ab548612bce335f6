"""`python -m tools.workbook learner [chNN ...]`: each learner notebook run as a learner meets it,
with every checking try-out held to the judge on the way.

One kernel per chapter runs the learner notebook (every exercise a stub) top to bottom. Before each
exercise cell whose try-out checks (calls `check(...)`), the same kernel runs that cell twice more
in a copy of the notebook's namespace, which is put back afterwards:

- with the reference function: the try-out must print only ✔ lines, at least one, although every
  other exercise is still a stub (a try-out that needs another exercise written first, or cannot go
  green, is caught);
- with each known-wrong variant of judge/variants/ that rewrites this function: the try-out must
  show a ✘ line or raise (a variant the judge fails and the try-out passes would tell a learner
  "all good" and the judge "wrong");
- with each mutant of the function that the mutation tool's last sample saw the judge kill
  (mutant_tryouts.py): the try-out must flag at least 90 % of them, each missed one named. A
  mutant's run that outlasts MUTANT_TIMEOUT_S is interrupted and counts as missed; one that kills
  the kernel (a Triton kernel reading out of bounds) counts as flagged, and a fresh kernel re-runs
  the learner's cells up to this one.

Then the stub cell runs as written, and the notebook goes on. At the end, no cell of the learner's
own run may have raised, and each stub's try-out must have said the function is not written yet.

One kernel a chapter, not one per exercise and variant: the notebook's set-up (the bundled model,
an engine) runs once, which made this check 6x faster than a fresh run per try-out.
"""

from __future__ import annotations

import time
from typing import Dict, List, Tuple

import nbformat

from . import execute as runner
from . import notebook
from .mutant_tryouts import killed_sample, share_line
from .paths import NOTEBOOKS
from .source import Chapter
from .variants import variant_functions, with_variant

SAVE = "__minisgl_saved_ns = dict(get_ipython().user_ns)"
# (a function call: its arguments are held while the namespace is emptied and refilled)
RESTORE = (
    "(lambda ns, saved: (ns.clear(), ns.update(saved)))"
    "(get_ipython().user_ns, get_ipython().user_ns['__minisgl_saved_ns']);"
)


def _text(outputs) -> str:
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")


def _raised(outputs) -> bool:
    return any(o.get("output_type") == "error" for o in outputs)


MUTANT_TIMEOUT_S = 120  # a try-out takes seconds; one past this is taken to hang


def _hung(outputs) -> bool:
    """Whether the cell was interrupted at its time limit (nbclient interrupts the kernel)."""
    return any(o.get("ename") == "KeyboardInterrupt" for o in outputs)


def _marks(text: str) -> str:
    from classroom.tryout import FAIL, NOT_WRITTEN, PASS

    lines = [ln for ln in text.splitlines() if ln.startswith((PASS, FAIL)) or NOT_WRITTEN in ln]
    return "; ".join(lines) or "no ✔ line"


def _first_fail(outputs) -> str:
    """The try-out's first ✘ line, cut short (or the error it raised): what a learner sees."""
    from classroom.tryout import FAIL

    line = next((ln for ln in _text(outputs).splitlines() if FAIL in ln), None)
    if line is not None:
        return line.strip()[:160]
    error = next(o for o in outputs if o.get("output_type") == "error")
    return f"an error: {error.get('ename', '')}: {error.get('evalue', '')}"[:160]


def _variants_by_exercise(ch: Chapter) -> Dict[str, List[Tuple[str, str, str, str]]]:
    """{exercise id: [(variant name, the function's name, its def, its imports)]} from
    judge/variants/."""
    from judge.registry import load_registry, variant_files

    registry = load_registry()
    if ch.chapter not in registry.chapters:
        return {}
    reg = registry.chapter(ch.chapter)
    out: Dict[str, List[Tuple[str, str, str, str]]] = {}
    for path in variant_files(reg):
        for ex, variant_def, imports in variant_functions(path, reg.exercises):
            out.setdefault(ex.id, []).append((path.stem, ex.attr, variant_def, imports))
    return out


def _exercises(ch: Chapter) -> Dict[str, object]:
    from judge.registry import load_registry

    registry = load_registry()
    if ch.chapter not in registry.chapters:
        return {}
    return {ex.id: ex for ex in registry.chapter(ch.chapter).exercises}


def run_chapter(ch: Chapter) -> Tuple[nbformat.NotebookNode, List[str], List[str], float]:
    """Run one chapter's learner path: (the learner's run, problems, ok lines, seconds)."""
    from classroom.tryout import FAIL, NOT_WRITTEN, PASS

    nb = nbformat.read(NOTEBOOKS / f"{ch.stem}.ipynb", as_version=4)
    written = notebook.render(ch, "solution")
    variants = _variants_by_exercise(ch)
    exercises = _exercises(ch)
    problems: List[str] = []
    oks: List[str] = []
    client = runner.client(nb, NOTEBOOKS, allow_errors=True)

    def aside(index: int, source: str, limit: bool = False) -> list:
        """Run `source` in a copy of the namespace; the outputs it printed. With `limit`, a run
        past MUTANT_TIMEOUT_S is interrupted (`_hung` tells)."""
        client.execute_cell(nbformat.v4.new_code_cell(SAVE), index)
        cell = nbformat.v4.new_code_cell(source)
        if limit:
            client.timeout, client.interrupt_on_timeout = MUTANT_TIMEOUT_S, True
        try:
            client.execute_cell(cell, index)
        finally:
            client.timeout, client.interrupt_on_timeout = runner.CELL_TIMEOUT_S, False
        client.execute_cell(nbformat.v4.new_code_cell(RESTORE), index)
        return cell.outputs

    def restart(index: int) -> None:
        """A fresh kernel after one died, brought back to cell `index`: the learner's cells before
        it run again."""
        from jupyter_core.utils import run_sync

        run_sync(client.km.restart_kernel)(now=True)
        for j in range(index):
            if nb.cells[j].cell_type == "code":
                client.execute_cell(nb.cells[j], j)

    start = time.perf_counter()
    with client.setup_kernel(env=runner.kernel_env(), cwd=str(NOTEBOOKS)):
        for i, cell in enumerate(nb.cells):
            ex_id = cell.metadata.get("minisgl", {}).get("exercise")
            if ex_id and notebook.cell_kind(cell) == "exercise" and "check(" in cell.source:
                reference = written.cells[i].source
                outputs = aside(i, reference)
                text = _text(outputs)
                if _raised(outputs) or NOT_WRITTEN in text or FAIL in text or PASS not in text:
                    why = "it raised" if _raised(outputs) else _marks(text)
                    problems.append(
                        f"{ex_id}: with only this exercise written its try-out shows: {why}"
                    )
                else:
                    oks.append(f"{ex_id}: its try-out turns ✔ with only it written")
                for name, attr, variant_def, imports in variants.get(ex_id, []):
                    outputs = aside(i, with_variant(reference, attr, variant_def, imports))
                    text = _text(outputs)
                    if FAIL in text or _raised(outputs):
                        oks.append(f"{name} / {ex_id}: its try-out shows {_first_fail(outputs)}")
                    else:
                        last = text.strip().splitlines()[-1][:120] if text.strip() else "no output"
                        problems.append(
                            f"{name} / {ex_id}: judged wrong, its try-out shows no ✘: {last}"
                        )
                if ex_id in exercises:
                    ok, line = _try_mutants(ch, exercises[ex_id], reference, i, aside, restart)
                    if line:
                        (oks if ok else problems).append(line)
            client.execute_cell(cell, i)
    return client.nb, problems, oks, time.perf_counter() - start


def _try_mutants(ch: Chapter, ex, reference: str, index: int, aside, restart) -> Tuple[bool, str]:
    """Run the try-out after each killed mutant of `ex` in the sample: (whether it flags enough,
    the line saying so; "" when there is nothing to try)."""
    from nbclient.exceptions import DeadKernelError

    from classroom.tryout import FAIL

    sample = killed_sample(ch.chapter, ex)
    if sample.missing:
        return False, f"{ex.id}: {sample.missing}"
    flagged, missed, died = [], [], []
    # a mutant may loop forever in the try-out where the judge's test failed first: it is
    # interrupted, and counts as missed (a learner sees no ✘ there, only a cell that never ends)
    for mutant in sample.mutants:
        try:
            outputs = aside(index, with_variant(reference, ex.attr, mutant.source, ""), limit=True)
        except DeadKernelError:  # a kernel that crashes (a mutant's out-of-bounds Triton load)
            died.append(mutant.id)  # is a failure a learner sees, though not a ✘ line
            flagged.append(mutant)
            restart(index)
            continue
        caught = (FAIL in _text(outputs) or _raised(outputs)) and not _hung(outputs)
        (flagged if caught else missed).append(mutant)
    if not sample.mutants:
        return True, ""
    ok, line = share_line(ex.id, flagged, missed)
    if died:
        line += f" (the kernel died with {', '.join(died)}, counted as flagged)"
    return ok, line
