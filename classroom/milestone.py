"""The end of a part: your engine so far, run end to end on a real workload, beside the reference.

`run(part)` takes every exercise of the chapters up to the part's last one from your notebooks
(the sources `python judge.py chNN --cumulative` reads), puts them into the engine with the judge's
own swap, runs the part's workload (milestone_workloads.py) once with them and once with the
reference, each in a fresh process (milestone_worker.py), and prints both columns. An exercise
still its stub is left to the reference, and the first line says which ones are yours. When your
engine raises, stops or gives other tokens than the reference, the line under the table names the
exercise: the one whose code raised, or else the one that, put in alone, changes the outcome.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Sequence

PARTS = {1: "ch06", 2: "ch11", 3: "ch15", 4: "ch21"}  # each part's last chapter
REPO = Path(__file__).resolve().parents[1]
# A safety net only: the worker bounds each run itself (milestone_worker.py), the learner's at a few
# times the reference's time.
WORKER_TIMEOUT_S = 1800.0


class MilestoneError(Exception):
    """What keeps a milestone from running at all (no such part or variant)."""


class UnreadableNotebook(MilestoneError):
    """A notebook of yours that the judge cannot read (missing, broken JSON): `run` says so on a
    ✘ line and still runs the reference's column."""


@dataclass
class Column:
    rows: Dict[str, str] = field(default_factory=dict)  # figure -> value, in the table's order
    # what must equal the reference's: each workload's tokens, and counts such as the prefill
    # tokens each request computed
    checks: Dict[str, list] = field(default_factory=dict)
    error: str | None = None  # what stopped the workload
    seconds: float = 0.0  # the workload's run time
    culprits: List[str] = field(default_factory=list)  # "chNN.name: why", the exercises to blame


@dataclass
class Result:
    part: int
    yours: Column
    reference: Column
    swapped: List[str]  # your exercises that ran
    stubs: List[str]  # exercises still stubs: the reference ran in their place
    unreadable: str | None = None  # why your notebooks could not be read (only the reference ran)

    @property
    def same_as_reference(self) -> bool:
        return self.yours.error is None and self.yours.checks == self.reference.checks


def run(part: int, notebooks: str | Path | None = None, variant: str | None = None) -> Result:
    """Run part `part`'s workload with your exercises of every chapter up to its last, and with
    the reference; print the table and what to look at, and return both columns.

    `notebooks`: the folder of your chapter notebooks (default: `default_notebooks`);
    `variant`: a known-wrong variant of judge/variants/ (`ch09_...`) put in place of that
    chapter's code, to see what that mistake does to the numbers."""
    if part not in PARTS:
        raise MilestoneError(
            f"part {part!r}: the milestones are parts {', '.join(map(str, PARTS))}"
        )
    try:
        units, env, swapped, stubs = learner_spec(part, notebooks, variant)
        unreadable = None
    except UnreadableNotebook as e:
        units, env, swapped, stubs, unreadable = [], {}, [], [], str(e)
    with tempfile.TemporaryDirectory(prefix="minisgl-milestone-") as tmp:
        reference = _column(_work(part, None, None, {}, Path(tmp), "reference"))
        spec = Path(tmp) / "spec.json"
        from judge.protocol import RunSpec

        RunSpec(results=os.devnull, units=units).write(spec)
        # nothing of yours yet: your column would be the reference's again
        yours = _column(_work(part, spec, reference, env, Path(tmp), "yours")) if swapped else None
    if yours is None:
        yours = Column(error=unreadable or "none of the exercises is yours yet")
    result = Result(part, yours, reference, swapped, stubs, unreadable)
    print(render(result))
    return result


def learner_spec(part: int, notebooks: str | Path | None, variant: str | None):
    """(the judge's swap units, the engine settings they need, your exercises, the stubs)."""
    from judge.cli_args import notebooks_dir
    from judge.judging import path_env, spec_unit
    from judge.registry import RegistryError, UnknownChapter, load_registry, variant_files
    from judge.serving import stubs_left_to_the_reference
    from judge.sources import SourceError, find_notebook, from_notebook
    from judge.variant_edits import VariantError, variant_code

    folder = Path(notebooks) if notebooks is not None else default_notebooks(notebooks_dir)
    try:
        registry = load_registry()
        chapters = registry.up_to(PARTS[part])
    except (RegistryError, UnknownChapter) as e:
        raise MilestoneError(str(e)) from None
    by_key = {c.key: c for c in chapters}
    units, swapped, stubs = [], [], []
    for chapter in chapters:
        if not chapter.exercises:
            continue
        try:
            if variant is not None and variant.startswith(chapter.key + "_"):
                paths = variant_files(chapter, variant[len(chapter.key) + 1 :])
                if not paths:
                    raise MilestoneError(f"no known-wrong variant {variant} in judge/variants/")
                code = variant_code(paths[0], chapter)
            else:
                code = from_notebook(find_notebook(chapter, folder), chapter)
        except VariantError as e:
            raise MilestoneError(str(e)) from None
        except SourceError as e:
            raise UnreadableNotebook(str(e)) from None
        yours = stubs_left_to_the_reference(code, chapter)
        swapped += [f"{chapter.key}.{n}" for n in yours]
        stubs += [e.id for e in chapter.exercises if e.name not in yours]
        units.append(spec_unit(code, chapter))
    if variant is not None and not any(variant.startswith(k + "_") for k in by_key):
        raise MilestoneError(f"variant {variant}: not of a chapter of part {part}")
    return units, path_env(units, chapters), swapped, stubs


def default_notebooks(notebooks_dir) -> Path:
    """Where your notebooks are: MINISGL_JUDGE_NOTEBOOKS where it is set; else the folder the
    notebook running this sits in, when it holds the chapters' notebooks (JupyterLab starts a
    kernel there: `notebooks/` for yours, `solutions/` when the reference's own are run); else
    the judge's default, `notebooks/`."""
    from judge.settings import NOTEBOOKS

    here = Path.cwd()
    if NOTEBOOKS.read() or not any(here.glob("ch00_*.ipynb")):
        return notebooks_dir()
    return here


def _work(part: int, spec: Path | None, reference, env: Dict[str, str], tmp: Path, name: str):
    """One worker process: the workload with the spec's code (None: the reference)."""
    job = tmp / f"{name}.job.json"
    out = tmp / f"{name}.out.json"
    job.write_text(
        json.dumps(
            {
                "part": part,
                "previous_part_ends": PARTS.get(part - 1, ""),
                "spec": str(spec) if spec else None,
                "reference": reference.__dict__ if reference is not None else None,
            }
        )
    )
    from judge.serving import HOOK, SERVER_INIT
    from judge.settings import SPEC

    penv = {k: v for k, v in os.environ.items() if not k.startswith("MINISGL_")}
    penv.update(env)
    penv["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    penv.setdefault("OMP_NUM_THREADS", "1")
    penv["MINISGL_PROGRESS"] = "off"
    if spec is not None:  # the server's processes and tensor-parallel ranks swap it in too
        penv[SPEC.name] = str(spec)
        penv[SERVER_INIT] = HOOK
    cmd = [sys.executable, "-m", "classroom.milestone_worker", str(job), str(out)]
    try:
        proc = subprocess.run(
            cmd, env=penv, cwd=REPO, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return {"error": f"the run did not end in {WORKER_TIMEOUT_S:.0f} s"}
    if not out.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": "the worker process died: " + " / ".join(tail)}
    return json.loads(out.read_text())


def _column(data: dict) -> Column:
    return Column(**{k: v for k, v in data.items() if k in Column.__dataclass_fields__})


# ---------------------------------------------------------------------- the report


def render(result: Result) -> str:
    lines = [f"Milestone {result.part}: your engine of chapters 0 to {int(PARTS[result.part][2:])}"]
    n = len(result.swapped) + len(result.stubs)
    lines.append(f"yours: {len(result.swapped)} of {n} exercises" + _stub_note(result.stubs))
    lines.append("")
    names = list(dict.fromkeys([*result.reference.rows, *result.yours.rows]))
    width = max([len(k) for k in names] + [6])
    col = max([len(v) for v in result.yours.rows.values()] + [12])
    lines.append(f"{'':<{width}}  {'yours':>{col}}  reference")
    for name in names:
        mine = result.yours.rows.get(name, "—")
        lines.append(f"{name:<{width}}  {mine:>{col}}  {result.reference.rows.get(name, '—')}")
    lines.append("")
    lines += verdict_lines(result)
    return "\n".join(lines)


def _stub_note(stubs: Sequence[str]) -> str:
    if not stubs:
        return ""
    shown = ", ".join(stubs[:6]) + (f" and {len(stubs) - 6} more" if len(stubs) > 6 else "")
    return f"; still stubs, the reference runs in their place: {shown}"


def verdict_lines(result: Result) -> List[str]:
    from classroom.tryout import FAIL, PASS

    yours, ref = result.yours, result.reference
    if ref.error:
        return [f"{FAIL} the reference itself failed (a bug of the workbook): {ref.error}"]
    if result.unreadable:
        return [f"{FAIL} only the reference ran: {result.unreadable}"]
    if not result.swapped:
        return [
            "none of the exercises is yours yet, so only the reference ran: write them in the "
            "chapters' notebooks, save them, and run this again"
        ]
    if result.same_as_reference:
        return [
            f"{PASS} your engine's tokens and counts equal the reference's: "
            + "; ".join(ref.checks)
        ]
    what = yours.error or _first_difference(yours.checks, ref.checks)
    lines = [f"{FAIL} {what}"]
    if yours.culprits:
        lines += [f"{FAIL} {c}" for c in yours.culprits]
    else:
        lines.append(
            "  no single exercise of yours does it alone: judge the part's chapters together, "
            f"`python judge.py {PARTS[result.part]} --cumulative`"
        )
    return lines


def _first_difference(mine: Dict[str, list], ref: Dict[str, list]) -> str:
    """Where your outputs first leave the reference's: request and token for token lists."""
    for name, want in ref.items():
        got = mine.get(name)
        if got == want:
            continue
        if got is None:
            return f"{name}: your engine gave nothing"
        if all(_ints(w) for w in want) and all(_ints(g) for g in got):  # requests' token ids
            for i, (g, w) in enumerate(zip(got, want)):
                if g != w:
                    j = next(
                        (k for k, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w))
                    )
                    if j < min(len(g), len(w)):
                        return f"{name}: request {i}'s token {j} is {g[j]}, the reference's {w[j]}"
                    return f"{name}: request {i} has {len(g)} tokens, the reference's {len(w)}"
            return f"{name}: {len(got)} requests, the reference's {len(want)}"
        if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
            i = next(k for k, (g, w) in enumerate(zip(got, want)) if g != w)
            return f"{name}: request {i}'s {_short(got[i])}, the reference's {_short(want[i])}"
        return f"{name}: {got}, the reference's {want}"
    return "your engine's outputs differ from the reference's"


def _ints(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) for v in value)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------- what to explain


def checklist(result: Result) -> str:
    """The questions a learner should now be able to answer, each with the figures just printed
    (yours where your engine ran the workload, else the reference's)."""
    rows = result.yours.rows if not result.yours.error else result.reference.rows
    questions = QUESTIONS[result.part](rows)
    return "\n".join(f"{i}. {q}" for i, q in enumerate(questions, start=1))


def _row(rows: Dict[str, str], start: str) -> str:
    return next((v for k, v in rows.items() if k.startswith(start)), "?")


def _part1(rows: Dict[str, str]) -> List[str]:
    prefill, decode = (_row(rows, "prefill steps").split(" + ") + ["?", "?"])[:2]
    return [
        f"The batch of {_row(rows, 'requests')} requests took {prefill} prefill step and {decode} "
        "decode steps for 40 new tokens each: why one prefill step for every prompt, and why "
        "one decode step fewer than the tokens each request received?",
        f"The {_row(rows, 'prompt tokens')} prompt tokens ran as one forward pass: what in the "
        "batch's attention metadata keeps each request's queries on its own keys (chapter 5), and "
        "where did each token's keys and values go (chapter 4)?",
        "The sampled batch is seeded: why does a request's seed give it the same tokens whatever "
        "else is in the batch, and what would change if top-p ran before top-k (chapter 6)?",
        f"{_row(rows, 'new tokens per second')} new tokens per second: what does one decode step "
        "of this engine do besides the model's matrix products, and which of it would a GPU not "
        "speed up?",
    ]


def _part2(rows: Dict[str, str]) -> List[str]:
    length, budget = (_row(rows, "chunks: prompt tokens").split(", ") + ["?", "?"])[:2]
    return [
        f"The four requests computed {_row(rows, 'radix: prefill tokens computed')} prefill "
        "tokens: why did the first compute every token of its prompt and the others only their "
        "own last line? What did the radix tree hold when the second arrived, and what stayed "
        "locked while it ran (chapter 9)?",
        f"{_row(rows, 'radix: prefill tokens saved')} of the prompt tokens were never computed: "
        "what would the naive cache of chapter 8 have computed, and what would the radix cache "
        "save if each prompt differed from the first token on?",
        f"The {length}-token prompt took {_row(rows, 'chunks: prefill steps')} prefill steps "
        f"under a budget of {budget} tokens a step ({_row(rows, 'chunks: tokens per')}): why is "
        "the last piece the smallest, and what must the scheduler reserve for the request between "
        "two of its pieces (chapter 10)?",
        f"The overlap loop ran at {_row(rows, GAIN)} the normal loop's speed: what does it "
        "overlap with what on a GPU, and why can it not be faster on a CPU (chapter 11)?",
        "Both loops gave the same tokens: what are chapter 11's four problems of the overlap loop, "
        "and what rule of the reference prevents each?",
    ]


GAIN = "overlap's gain"


def _part3(rows: Dict[str, str]) -> List[str]:
    return [
        f"The server took {_row(rows, 'server start')} s to start: which three processes started, "
        "what does each own, and how do they find each other (chapter 14)?",
        f"The eight streams' first tokens came {_row(rows, 'time to first token')} (the fastest / "
        "the slowest) after they were sent: why not all at once, when all eight were sent "
        "together?",
        "Follow one token from the model to your HTTP client: which messages (chapter 12) carry "
        "it, through which sockets, and where does it become text (chapter 13)?",
        "A client that disconnects mid-stream: what tells the scheduler, and what does it give "
        "back (chapter 15)?",
    ]


def _part4(rows: Dict[str, str]) -> List[str]:
    return [
        f"TTFT p50 / p99 {_row(rows, 'bench: TTFT')}, inter-token latency "
        f"{_row(rows, 'bench: inter-token')}: why is the p99 gap well above the p50 when a new "
        "request arrives every few steps (chapter 21)?",
        f"{_row(rows, 'bench: output tokens')} output tokens per second, the first request a "
        "warm-up: why over the run's wall span rather than the sum of the requests' durations?",
        f"Two tensor-parallel ranks: {_row(rows, '2 tensor-parallel')} new tokens per second, one "
        f"rank {_row(rows, 'one rank')}: what does each layer add to a step (chapter 16), and on "
        "what hardware and model sizes does the split pay?",
        f"Emulated CUDA graphs: {_row(rows, 'emulated')} new tokens per second: what does a real "
        "graph save on a GPU, and why can an emulation on a CPU not show it (chapter 18)?",
        "What this CPU cannot show: the Triton attention kernels (chapter 17; the engine's triton "
        "backend needs CUDA) and the decode kernels at speed (chapter 19). Which command checks "
        "your kernels on a GPU, and which figure of chapter 19 tells you a kernel is good enough?",
    ]


QUESTIONS = {1: _part1, 2: _part2, 3: _part3, 4: _part4}
