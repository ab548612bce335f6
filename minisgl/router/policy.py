"""Which worker a request goes to: round robin, shortest queue, or cache aware (SGLang's rule).

Cache aware, as SGLang's router decides it (sgl-router's cache_aware policy):
1. Load first. The system is imbalanced when the busiest and the idlest worker differ by more than
   `balance_abs` requests AND the busiest has more than `balance_rel` times the idlest's. Then the
   request goes to the least loaded worker, cache or not: one worker drowning in a popular tenant's
   requests would otherwise take every request of that tenant and leave the others idle.
2. Else the cache. The worker whose tree matches the longest prefix of the request wins, if that
   match covers more than `cache_threshold` of the request (a prompt that shares only "You are"
   with a worker's history gains nothing there).
3. Else room. The worker with the smallest tree takes a prompt no one has: it has the most cache
   to spare, and new tenants spread across the workers.
Ties go to the worker listed first: a decision is a function of its inputs (the tests rely on it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence


@dataclass(frozen=True)
class Balance:
    """SGLang's defaults: 64 requests apart and 1.5 times; a match over 30 % of the prompt."""

    abs_threshold: int = 64
    rel_threshold: float = 1.5
    cache_threshold: float = 0.3

    def __post_init__(self) -> None:
        if self.abs_threshold < 0:
            raise ValueError(f"balance abs threshold must be >= 0, got {self.abs_threshold}")
        if self.rel_threshold < 1:
            raise ValueError(f"balance rel threshold must be >= 1, got {self.rel_threshold}")
        if not 0 <= self.cache_threshold <= 1:
            raise ValueError(f"cache threshold must be in [0, 1], got {self.cache_threshold}")


def least(values: Sequence[float]) -> int:
    """The index of the smallest value, the first of equals."""
    return min(range(len(values)), key=lambda i: values[i])


def cache_aware(
    matches: Sequence[int],
    key_len: int,
    loads: Sequence[int],
    sizes: Sequence[int],
    balance: Balance,
) -> int:
    """The index of the worker to send a request to, by SGLang's rule (this module's docstring).

    Receives: `matches[i]`, how many leading elements of the request's key worker i's tree holds;
        `key_len`, the key's length; `loads[i]`, requests in flight at worker i; `sizes[i]`, its
        tree's size; `balance`, the thresholds. One match, load and size per worker, at least one.
    Returns: an index into those lists.
    Leaves: nothing changed (a pure function; the caller inserts the key into the chosen tree).
    Raises: ValueError when the three lists differ in length or are empty, naming their lengths
        ("one match, load and size per worker: got 1, 2, 2").
    Uses: `least` (the index of the smallest value, the first of equals).
    Checked: imbalanced means the busiest is more than `abs_threshold` above the idlest AND more
        than `rel_threshold` times it (either alone is not), and then the least loaded worker
        wins whatever it holds; else the longest match wins if it covers more than
        `cache_threshold` of the key (exactly that much is not enough), else the smallest tree
        does, never the best match; an empty key goes to the smallest tree; ties go to the
        worker listed first.
    """
    if not (len(matches) == len(loads) == len(sizes)) or not matches:
        raise ValueError(
            f"one match, load and size per worker: got {len(matches)}, {len(loads)}, {len(sizes)}"
        )
    busiest, idlest = max(loads), min(loads)
    if busiest - idlest > balance.abs_threshold and busiest > idlest * balance.rel_threshold:
        return least(loads)
    best = max(range(len(matches)), key=lambda i: (matches[i], -i))
    if key_len and matches[best] / key_len > balance.cache_threshold:
        return best
    return least(sizes)


class RoundRobin:
    def __init__(self) -> None:
        self.next = 0

    def choose(self, n: int) -> int:
        i = self.next % n
        self.next = i + 1
        return i


def shortest_queue(loads: List[int]) -> int:
    return least(loads)


POLICIES = ("cache_aware", "round_robin", "shortest_queue")
