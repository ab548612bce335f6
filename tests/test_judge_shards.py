"""How a run's tests are split over processes (judge/shards.py): every process computes the split
alone, so it must be a partition, the same in each, in the collected order, balanced by time."""

from __future__ import annotations

import random

import pytest

from judge.shards import share


@pytest.mark.parametrize("count", [1, 2, 3, 5, 40])
def test_the_shares_partition_the_tests_in_their_order(count):
    rng = random.Random(count)
    tests = [f"t{i}" for i in range(23)]
    cost = {t: rng.choice([0.01, 0.1, 1.0, 3.0]) for t in tests[:20]}  # three never measured
    shares = [share(tests, cost, i, count) for i in range(count)]
    assert sorted(t for s in shares for t in s) == sorted(tests)  # each test exactly once
    for s in shares:
        assert s == [t for t in tests if t in s]  # in the collected order
    assert shares == [share(list(tests), dict(cost), i, count) for i in range(count)]


def test_the_longest_tests_are_spread_first():
    tests = ["slow_a", "quick_1", "quick_2", "slow_b", "quick_3", "quick_4"]
    cost = {"slow_a": 4.0, "slow_b": 4.0, "quick_1": 1.0, "quick_2": 1.0, "quick_3": 1.0}
    first, second = share(tests, cost, 0, 2), share(tests, cost, 1, 2)
    assert {"slow_a", "slow_b"} - set(first) and {"slow_a", "slow_b"} - set(second)
    load = [sum(cost.get(t, 0.5) for t in s) for s in (first, second)]
    assert abs(load[0] - load[1]) <= 1.0, (first, second)
