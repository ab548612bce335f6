"""A CPU KV pool reads as zeros yet costs no memory until tokens are written (kvcache/pool.py
untouched_zeros): torch.zeros would make the whole pool resident at LLM()."""

from __future__ import annotations

import os

import pytest
import torch

from minisgl.kvcache import KVCache


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's /proc")
def test_a_cpu_pool_reads_as_zeros_and_is_resident_only_where_written():
    before = resident_mb()
    # 2 x 4 layers x 65,536 locations x 8 heads x 64 dims x 4 bytes = 1 GiB
    pool = KVCache(4, 65536, 1, 8, 64, torch.float32, torch.device("cpu"))
    grown = resident_mb() - before
    assert grown < 64, f"making a 1 GiB CPU pool made {grown:.0f} MB resident: it was written"
    assert not pool.k_cache(3)[-5:].any() and not pool.v_cache(0)[:5].any()
    pool.store_kv(torch.ones(2, 8, 64), torch.ones(2, 8, 64), torch.tensor([7, 65535]), 2)
    assert float(pool.k_cache(2)[[7, 65535]].sum()) == 2 * 8 * 64
    assert not pool.k_cache(2)[8:65535].any(), "a location nobody wrote must read 0"
    assert resident_mb() - before < 64
