"""CI's checks after the newcomer's path (.ci/run runs this with [dev] installed): each stage with
the stages it waits for and the cores it keeps busy; tools/stages.py runs them side by side as the
machine's cores allow, each stage's log kept in build/ci/, and fails if any stage fails.

    python3 .ci/stages.py                       # every stage, on all the machine's cores
    python3 .ci/stages.py --only lint check     # some of them
    python3 .ci/stages.py --cores 2             # as on a 2-core machine

`cores=None` is a stage that spreads its work over the machine (`{cores}` in its command): one such
stage at a time, with the others beside it in half the cores (tools/stages.py says why); 1 is one
that keeps about one core busy (a pytest process, a notebook kernel at a time). Within each lane
the plan's order is the order they start: mutants first (the learner check waits for it), then
the longest.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.stages import Stage, main  # noqa: E402

# the site's pages to look at: the index, the teachers' page, one page per solution notebook
SITE_PAGES = (
    "index.html teachers/ $(cd solutions && for nb in *.ipynb; do echo ${nb%.ipynb}/; done)"
)

STAGES = [
    Stage(
        "mutants",
        "python3 -m tools.mutants --sample 5 --check --workers {cores}",
        "mutation testing, a sample: five mutants of every exercise must each fail a test "
        "(judge/README.md); the learner check tries the killed ones",
        cores=None,
    ),
    Stage(
        "selfcheck",
        "python3 judge.py --selfcheck --workers {cores}",
        "judge self-check: reference green, each stub red on exactly its tests, variants caught",
        cores=None,
    ),
    Stage(
        "nbval",
        "MINISGL_JUDGE_PROGRESS=build/notebook_progress.json MINISGL_PROGRESS=off "
        "OMP_NUM_THREADS=1 python3 -m pytest -q -p nbval --nbval-lax --nbval-current-env "
        "solutions/",
        "the solution notebooks run top to bottom (nbval; tagged cells give the committed output)",
    ),
    Stage(
        "needs_extra",
        "python3 -m pytest -q -m needs_extra -n 2",
        "the tests that need an extra the README's set-up leaves out (pytest -m needs_extra)",
        # two test processes, so that schemathesis's one long test runs beside the rest; together
        # they keep about one core busy (176 CPU s in 263 s on a busy 2-core machine: that test
        # mostly waits on its live server), so one core is what it holds back from the others
    ),
    Stage(
        "learner",
        "python3 -m tools.workbook learner --jobs {cores}",
        "the learner notebooks as a learner meets them (stubs, no error to the end; each checking "
        "try-out ✔ with only its exercise written, ✘ with each known-wrong variant and 90 % of "
        "the sample's killed mutants); a chapter per core",
        after=["mutants"],
        cores=None,
    ),
    Stage(
        "lint",
        "python3 -m ruff check . && python3 -m ruff format --check .",
        "ruff check and ruff format --check (settings in pyproject.toml)",
    ),
    Stage(
        "check",
        "python3 -m tools.workbook check",
        "the generated notebooks match their chapter sources",
    ),
    Stage(
        "site",
        "python3 -m tools.workbook site && NO_MKDOCS_2_WARNING=1 python3 -m mkdocs build --strict"
        f" && python3 tools/site_check.py --pages {SITE_PAGES}",
        "the site's pages from the solutions, mkdocs build --strict, then a look in Chromium",
    ),
    Stage(
        "browser",
        "python3 -m tools.browser --out build/browser_check",
        "JupyterLab (ch11 Run All, light and dark; a saved solution) and the site at 390 and "
        "1400 px (tools/browser)",
        after=["site"],
    ),
]

if __name__ == "__main__":
    sys.exit(main(STAGES))
