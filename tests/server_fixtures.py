"""Starting a live server for the tests of `python -m minisgl serve` (tests/test_server_*.py)."""

from __future__ import annotations

import time
from typing import Callable, Dict

import httpx

from helpers import test_device

# Small enough that a prompt can be too long and that 32 clients queue for slots; float32 as the
# offline reference, so greedy outputs match token for token.
SERVER_ARGS = (
    "--max-running-req",
    "8",
    "--max-seq-len",
    "256",
    "--num-pages",
    "4096",
    "--dtype",
    "float32",
    "--device",
    test_device(),
)
SERVER_ENV = {"OMP_NUM_THREADS": "1"}  # the bundled model's matmuls are tiny (see conftest.py)


def wait_for(
    what: str, probe: Callable[[], Dict], done: Callable[[Dict], bool], timeout: float = 30.0
) -> Dict:
    """Poll `probe()` until `done(result)` and return that result; fail saying what did not
    happen."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if done(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.1)


def scheduler_stats(url: str) -> Dict:
    return httpx.get(url + "/debug/scheduler", timeout=30).json()


def idle(stats: Dict) -> bool:
    return stats["running"] == 0 and stats["queued"] == 0 and not stats["in_flight"]


def assert_all_back(stats: Dict) -> None:
    assert stats["slots_free"] == stats["slots_total"], (
        f"expected every request slot back, {stats['slots_total'] - stats['slots_free']} still "
        "taken"
    )
    assert stats["pages_available"] == stats["pages_total"], (
        f"expected every KV page back, {stats['pages_total'] - stats['pages_available']} still held"
    )
    assert stats["idle_integrity"] == "ok", (
        f"the idle KV pool is inconsistent: {stats['idle_integrity']}"
    )
