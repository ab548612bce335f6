"""Which notebook is whose, for which chapter.

A submission is a notebook (`.ipynb`). Its student is the first folder under the folder given on
the command line (`class/alice/ch01_core.ipynb` -> alice), or the file's name for a notebook
straight in it or given itself (`class/alice.ipynb` -> alice). Its chapter is the one its
exercise cells are tagged with (`metadata.minisgl.exercise = "ch01.complete_one"`), or, when
it has none (a notebook whose metadata was lost), the only chapter asked for.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

CHAPTER = re.compile(r"^ch\d\d$")


class SubmissionError(ValueError):
    """The command line names something that is not a class's submissions."""


@dataclass(frozen=True)
class Submission:
    student: str
    chapter: str
    path: Path
    sha256: str

    @property
    def key(self) -> str:
        return f"{self.student}/{self.chapter}"


def tagged_chapters(path: Path) -> List[str]:
    """The chapters a notebook's exercise cells are tagged with ([] if unreadable or none)."""
    try:
        cells = json.loads(path.read_bytes()).get("cells", [])
    except (ValueError, OSError, AttributeError):
        return []
    found = []
    for cell in cells if isinstance(cells, list) else []:
        meta = cell.get("metadata", {}) if isinstance(cell, dict) else {}
        tag = meta.get("minisgl", {}).get("exercise") if isinstance(meta, dict) else None
        if isinstance(tag, str) and CHAPTER.match(tag.split(".")[0]):
            chapter = tag.split(".")[0]
            if chapter not in found:
                found.append(chapter)
    return found


def _notebooks(root: Path) -> List[Tuple[str, Path]]:
    if root.is_file():
        if root.suffix != ".ipynb":
            raise SubmissionError(f"{root} is not a notebook (.ipynb)")
        return [(root.stem, root)]
    if not root.is_dir():
        raise SubmissionError(f"{root}: no such file or folder")
    found = []
    for path in sorted(root.rglob("*.ipynb")):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):  # .ipynb_checkpoints, .git
            continue
        found.append((rel.parts[0] if len(rel.parts) > 1 else path.stem, path))
    return found


def discover(chapters: Sequence[str], roots: Sequence[Path]) -> Tuple[List[Submission], List[str]]:
    """The submissions under `roots` for `chapters`, and one line per notebook left out (why)."""
    if not chapters:
        raise SubmissionError("name at least one chapter to grade (e.g. ch01)")
    if not roots:
        raise SubmissionError("name the submissions: notebooks, or folders of them")
    chosen: Dict[Tuple[str, str], Submission] = {}
    skipped = []
    for root in roots:
        listed = _notebooks(Path(root))
        if not listed:
            raise SubmissionError(f"{root} holds no notebook (.ipynb)")
        for student, path in listed:
            chapter = _chapter_of(path, chapters)
            if chapter is None:
                tagged = ", ".join(tagged_chapters(path)) or "no chapter"
                skipped.append(
                    f"{path}: its exercises are of {tagged}, not of {', '.join(chapters)}"
                )
                continue
            data = path.read_bytes()
            sub = Submission(student, chapter, path.resolve(), hashlib.sha256(data).hexdigest())
            if (student, chapter) in chosen:
                raise SubmissionError(
                    f"two notebooks for {student}, {chapter}: {chosen[student, chapter].path} and "
                    f"{sub.path}; give each student one notebook per chapter"
                )
            chosen[student, chapter] = sub
    return sorted(chosen.values(), key=lambda s: (s.student, s.chapter)), skipped


def _chapter_of(path: Path, chapters: Sequence[str]) -> Optional[str]:
    tagged = tagged_chapters(path)
    for chapter in tagged:
        if chapter in chapters:
            return chapter
    if not tagged and len(chapters) == 1:
        return chapters[0]  # judged all the same: the verdict will say what is missing
    return None
