"""The judge's MINISGL_* environment variables, defined like the engine's (minisgl/env.py: name,
allowed values, default, what it does). Read when used, not at import: tests point them elsewhere
for one test at a time."""

from __future__ import annotations

from minisgl.env import Setting, SettingError, flag

__all__ = ["SETTINGS", "Setting", "SettingError"]

DEBUG = flag(
    "MINISGL_JUDGE_DEBUG", False, "on: an internal error of the judge prints its traceback"
)
SPEC = Setting(
    "MINISGL_JUDGE_SPEC",
    "the spec file of a judged test process; the judge sets it for the process it "
    "starts (judge/protocol.py)",
)
REGISTRY = Setting(
    "MINISGL_JUDGE_REGISTRY", "the exercise registry to judge by; unset: `judge/exercises.toml`"
)
NOTEBOOKS = Setting(
    "MINISGL_JUDGE_NOTEBOOKS", "where the learner's notebooks are; unset: `notebooks/`"
)
VARIANTS = Setting(
    "MINISGL_JUDGE_VARIANTS", "where the known-wrong variants are; unset: `judge/variants/`"
)
PROGRESS = Setting(
    "MINISGL_JUDGE_PROGRESS",
    "where the learner's progress is recorded; unset: `.judge_progress.json`",
)
JOBS = Setting(
    "MINISGL_JUDGE_JOBS",
    "test processes a learner's run splits a chapter's tests over: `auto` one per CPU core, at "
    "most 4, on a CPU and 1 on a GPU (judge/runner.py default_jobs); a number sets it",
    ("auto",),
    "auto",
    count=True,
)
MUTANTS_RESULTS = Setting(
    "MINISGL_MUTANTS_RESULTS",
    "where `python -m tools.mutants` keeps each exercise's last run; unset: `build/mutants/`",
)

SETTINGS = (DEBUG, SPEC, REGISTRY, NOTEBOOKS, VARIANTS, PROGRESS, JOBS, MUTANTS_RESULTS)
