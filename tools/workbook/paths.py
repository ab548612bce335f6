"""Where everything lives. The tool runs from any directory; paths are relative to the
repository."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHAPTERS = REPO / "chapters"
NOTEBOOKS = REPO / "notebooks"  # learner notebooks (generated, committed)
SOLUTIONS = REPO / "solutions"  # executed solution notebooks (generated, committed)
SITE_DOCS = REPO / "build" / "site_docs"  # the mkdocs docs_dir (generated, ignored by git)
NOTEBOOK_PROGRESS = REPO / "build" / "notebook_progress.json"  # where notebook runs record judging
