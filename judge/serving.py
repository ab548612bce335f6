"""The learner's code in every process of the server.

Two users:

* the judge's test process: plugin.py sets MINISGL_SERVER_INIT to `judge.serving:apply_spec`, so a
  server a test starts (`python -m minisgl serve` in a subprocess, which spawns the scheduler and
  the tokenizer worker) swaps in the same code from the same spec file (MINISGL_JUDGE_SPEC) in each
  of its three processes, and the test talks to the learner's server;
* `python judge.py serve ch13 [--notebook PATH | --file PATH]` (serve_command.py): the learner's
  notebook or file served for real (`serve_learner_code`), written to a spec file that the three
  processes read the same way. Exercises still a stub (or, from a file, not defined there) stay the
  reference (a server that answers a 500 to everything helps no one), and the line printed says
  which ones serve.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import List

from . import settings

SERVER_INIT = "MINISGL_SERVER_INIT"  # minisgl/env.py's SERVER_INIT
HOOK = "judge.serving:apply_spec"


class ServeError(Exception):
    """The learner's code cannot be served (no such chapter or notebook, code that fails)."""


def apply_spec() -> None:
    """In a server process: swap in what MINISGL_JUDGE_SPEC's units say, as the judge did."""
    from . import swap
    from .protocol import RunSpec

    path = settings.SPEC.read()
    if not path:
        return
    # An exercise whose code cannot run gets its stand-in, which raises with the reason when
    # called, as in the test process; the server logs it and the test that reaches it says so.
    swap.apply(RunSpec.read(path).units)


def hook_into_servers() -> None:
    """Make the servers this process starts (and their workers) run the judged code."""
    os.environ.setdefault(SERVER_INIT, HOOK)


def serve_learner_code(
    chapter_name: str, notebook: Path | None = None, file: Path | None = None
) -> str:
    """Write the spec of the learner's code of `chapter_name` (its notebook, `notebook`, or the
    functions `file` defines), point this process and the ones it starts at it, and say what is
    served."""
    from .judging import spec_unit
    from .protocol import RunSpec
    from .registry import RegistryError, UnknownChapter, load_registry
    from .sources import SourceError, find_notebook, from_file, from_notebook, require_some_exercise

    if notebook is not None and file is not None:
        raise ServeError("serve a notebook or a file, not both")
    try:
        chapter = load_registry().chapter(chapter_name)
        if file is not None:
            path = Path(file)
            code = from_file(path, chapter, missing="reference")
            require_some_exercise(code, chapter, path)
        else:
            path = Path(notebook) if notebook else find_notebook(chapter, _notebooks_dir())
            code = from_notebook(path, chapter)
    except (RegistryError, UnknownChapter, SourceError) as e:
        raise ServeError(str(e)) from None
    broken = {n: p for n, p in code.problems.items() if code.attempted.get(n, True)}
    if broken or code.general_problems:
        why = "; ".join([f"{n}: {p}" for n, p in broken.items()] + code.general_problems)
        raise ServeError(f"{path} cannot be served: {why}")
    yours = stubs_left_to_the_reference(code, chapter)
    unit = spec_unit(code, chapter)
    spec = Path(tempfile.mkdtemp(prefix="minisgl-serve-")) / "spec.json"
    RunSpec(results=os.devnull, units=[unit]).write(spec)
    os.environ[settings.SPEC.name] = str(spec)
    os.environ[SERVER_INIT] = HOOK
    if not yours:
        return f"minisgl: {path}: every exercise is still its stub, so the reference serves"
    rest = [ex.name for ex in chapter.exercises if ex.name not in code.attempted]
    return f"minisgl: serving your {chapter.key} code from {path}: {', '.join(yours)}" + (
        f" (still stubs, the reference serves: {', '.join(rest)})" if rest else ""
    )


def stubs_left_to_the_reference(code, chapter) -> List[str]:
    """Leave every exercise of `code` that is still its stub to the reference (a server, or a
    milestone's run, that fails on the first stub helps no one); the names of the others, which
    are swapped in (with their stand-in where they cannot run)."""
    code.missing = "reference"
    for name, attempted in list(code.attempted.items()):
        if not attempted:
            del code.attempted[name]
            code.snippets = [s for s in code.snippets if s.exercise != name]
    return [ex.name for ex in chapter.exercises if code.swaps(ex.name)]


def _notebooks_dir() -> Path:
    from .cli import notebooks_dir

    return notebooks_dir()
