"""The judge: swaps a learner's functions into the reference engine and runs the chapter's tests.

    python judge.py ch11            # judge notebooks/ch11_*.ipynb (see `python judge.py --help`)
    judge.check("ch11")             # from a notebook's last cell: judge the live definitions

Importing this package is cheap (no torch, no engine): it runs inside learners' kernels.
"""

from __future__ import annotations

__all__ = ["check"]


def check(chapter: str, namespace=None, **options):
    """Judge the chapter's exercises as currently defined in the calling notebook (see
    judge/live.py)."""
    from .live import check as _check

    return _check(chapter, namespace=namespace, _depth=2, **options)
