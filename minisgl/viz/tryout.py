"""Trying an exercise out in a notebook before it is written.

The lines after an exercise's function run it inside the engine. While the function is still the
stub, that raises its `NotImplementedError("chNN.name: ...")`; `attempt` turns exactly that into a
short note, so "Run All" in JupyterLab goes on to the end of the notebook. Any other error, such
as one in the learner's own code, is raised as usual.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


@contextmanager
def attempt(exercise: str) -> Iterator[None]:
    try:
        yield
    except NotImplementedError as e:
        if not str(e).startswith(f"{exercise}:"):
            raise
        print(f"{exercise} is not written yet ({str(e)[len(exercise) + 2:]}).\n"
              "Write the function above and run this cell again; the cells below do not need it.")
