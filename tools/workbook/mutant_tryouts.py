"""The judge's killed mutants as try-out material: the learner check (learner_run.py) runs each
exercise's try-out against the mutants of its reference that the mutation tool's last sample
(`python -m tools.mutants --sample 5`, CI's step before the learner check) saw the judge kill, and
reports the share its try-out flags. A try-out that lets a tenth of what the judge kills through
breaks its promise to show a mistake before the judge is run.

Only mutants killed by a failing test count: one that ran out of time would leave the notebook
cell running too (a learner sees no ✘ line there, and the check would wait for the cell's
timeout), and an invalid one never defines the function."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import List

TARGET = 0.9  # the share of the judge's killed mutants a try-out must flag
SAMPLE_COMMAND = "python -m tools.mutants {chapter} --sample 5"


@dataclass
class KilledSample:
    """An exercise's sampled mutants the judge killed, or why there are none to try."""

    mutants: list = field(default_factory=list)  # tools.mutants.operators.Mutant
    by: dict = field(default_factory=dict)  # mutant id -> the test that killed it, its message
    missing: str = ""  # why the judge's verdicts cannot be used (no sample run, a stale one)


def killed_sample(chapter: str, ex) -> KilledSample:
    """The mutants of `ex`'s current reference that the last sample saw the judge kill."""
    from judge.stubs import reference_source
    from tools.mutants.__main__ import results_dir
    from tools.mutants.operators import mutants

    path = results_dir() / "sample" / f"{ex.id}.json"
    rerun = SAMPLE_COMMAND.format(chapter=chapter)
    if not path.is_file():
        return KilledSample(
            missing=f"the judge has not judged a sample of its mutants: run `{rerun}`"
        )
    verdicts = {r["id"]: r for r in json.loads(path.read_text())["results"]}
    current = {m.id: m for m in mutants(reference_source(chapter, ex), ex.attr)}
    gone = sorted(set(verdicts) - set(current))
    if gone:  # a mutant id hashes the reference's code: the reference changed since the sample
        return KilledSample(
            missing=f"its reference changed since the judge's sample of its mutants "
            f"({', '.join(gone[:3])} no longer made): run `{rerun}` again"
        )
    killed = [current[mid] for mid, r in verdicts.items() if r["status"] == "killed"]
    return KilledSample(killed, {m.id: verdicts[m.id]["by"] for m in killed})


def share_line(ex_id: str, flagged: List[str], missed: List[object]) -> tuple[bool, str]:
    """(whether the share reaches TARGET, the line reporting it, naming each missed mutant)."""
    total = len(flagged) + len(missed)
    share = len(flagged) / total if total else 1.0
    line = (
        f"{ex_id}: its try-out flags {len(flagged)} of the {total} mutant(s) the judge killed "
        f"({100 * share:.0f} %)"
    )
    if missed:
        line += "; no ✘ for " + "; ".join(f"{m.id} ({m.description})" for m in missed)
    return share >= TARGET, line
