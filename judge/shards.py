"""Splitting one run's tests into shares that processes run at the same time (runner.py).

Every process of a sharded run collects all the tests and keeps its own share, so the split must
come out the same in each without them talking: it depends only on the collected order and on the
reference's measured time of each test (budgets.json), longest first onto the least loaded share.
A one-off cost (the first engine a process builds) then lands once per share, which is why a run
is split into as many shares as there are cores to spare, and no more.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

UNMEASURED = 0.5  # seconds: a test budgets.json has no time for yet


def share(tests: Sequence[str], cost: Dict[str, float], index: int, count: int) -> List[str]:
    """The tests (in their given order) of share `index` of `count`; `cost`: test -> seconds."""
    if count <= 1:
        return list(tests)
    load = [0.0] * count
    owner: Dict[int, int] = {}
    for pos in sorted(range(len(tests)), key=lambda p: (-cost.get(tests[p], UNMEASURED), p)):
        target = min(range(count), key=lambda s: (load[s], s))
        owner[pos] = target
        load[target] += cost.get(tests[pos], UNMEASURED)
    return [t for p, t in enumerate(tests) if owner[p] == index]
