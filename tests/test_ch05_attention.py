"""Chapter 5: attention over the paged KV cache. The varlen metadata of a batch, and the torch
backend against plain dense causal attention, for batches where part of each request is already
cached (a prefix-cache hit, or earlier decode steps) and the rest is new."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import pytest
import torch
import torch.nn.functional as F

from helpers import test_device

from minisgl.attention import AttentionMetadata, TorchAttentionBackend, prepare_metadata
from minisgl.core import Batch, Req, SamplingParams
from minisgl.kvcache import KVCache

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
MAX_LEN = 24  # columns of the page table


def dev() -> torch.device:
    return torch.device(test_device())


def make_req(table_idx: int, total_len: int, cached_len: int, uid: int = 0) -> Req:
    ids = torch.arange(total_len, dtype=torch.int32)
    return Req(ids, table_idx, cached_len, output_len=4, uid=uid, sampling_params=SamplingParams())


# ---------------------------------------------------------------- prepare_metadata


def test_prepare_metadata_of_a_mixed_prefill_batch():
    page_table = torch.arange(4 * MAX_LEN, dtype=torch.int32, device=dev()).view(4, MAX_LEN) + 1000
    reqs = [make_req(2, total_len=5, cached_len=0),  # a fresh prompt
            make_req(0, total_len=7, cached_len=4),  # a prefix-cache hit: 3 new tokens
            make_req(3, total_len=3, cached_len=2)]  # 1 new token
    meta = prepare_metadata(Batch(reqs, "prefill"), page_table, dev())
    assert meta.cu_seqlens_q.tolist() == [0, 5, 8, 9]
    assert meta.cache_seqlens.tolist() == [5, 7, 3]
    assert meta.last_indices.tolist() == [4, 7, 8]
    assert (meta.max_seqlen_q, meta.max_seqlen_k) == (5, 7)
    assert meta.page_table.tolist() == page_table[[2, 0, 3], :7].tolist()
    for t in (meta.cu_seqlens_q, meta.cache_seqlens, meta.last_indices, meta.page_table):
        assert t.device.type == dev().type


def test_prepare_metadata_of_a_decode_batch():
    page_table = torch.arange(3 * MAX_LEN, dtype=torch.int32, device=dev()).view(3, MAX_LEN)
    reqs = [make_req(1, total_len=9, cached_len=8), make_req(0, total_len=4, cached_len=3)]
    meta = prepare_metadata(Batch(reqs, "decode"), page_table, dev())
    assert meta.cu_seqlens_q.tolist() == [0, 1, 2]
    assert meta.cache_seqlens.tolist() == [9, 4]
    assert meta.last_indices.tolist() == [0, 1]
    assert (meta.max_seqlen_q, meta.max_seqlen_k) == (1, 9)
    assert meta.page_table.tolist() == page_table[[1, 0], :9].tolist()


# ---------------------------------------------------------------- the backend against dense attention


@dataclass
class Scenario:
    """Requests with random q/k/v for their whole sequence, laid out in a paged KV cache whose
    first `cached_len` tokens per request are already stored; the rest is this step's work."""

    kv: KVCache
    backend: TorchAttentionBackend
    page_table: torch.Tensor
    reqs: List[Req]
    q: List[torch.Tensor]
    k: List[torch.Tensor]
    v: List[torch.Tensor]
    locs: List[torch.Tensor]


def make_scenario(specs, page_size: int, seed: int = 0) -> Scenario:
    """specs: (table_idx, total_len, cached_len) per request."""
    g = torch.Generator().manual_seed(seed)
    num_pages = 4 * MAX_LEN // page_size
    kv = KVCache(1, num_pages, page_size, KV_HEADS, HEAD_DIM, torch.float32, dev())
    backend = TorchAttentionBackend(kv, HEADS, KV_HEADS, HEAD_DIM)
    page_table = torch.zeros(4, MAX_LEN, dtype=torch.int32)
    free_pages = torch.randperm(num_pages, generator=g).tolist()  # scattered, like a busy pool
    reqs, qs, ks, vs, locs = [], [], [], [], []
    for uid, (row, total, cached) in enumerate(specs):
        pages = [free_pages.pop() for _ in range(-(-total // page_size))]
        loc = torch.tensor([pages[i // page_size] * page_size + i % page_size for i in range(total)])
        page_table[row, :total] = loc
        q = torch.randn(total, HEADS, HEAD_DIM, generator=g)
        k = torch.randn(total, KV_HEADS, HEAD_DIM, generator=g)
        v = torch.randn(total, KV_HEADS, HEAD_DIM, generator=g)
        kv.k_cache(0)[loc[:cached].to(dev())] = k[:cached].to(dev())  # what earlier steps stored
        kv.v_cache(0)[loc[:cached].to(dev())] = v[:cached].to(dev())
        reqs.append(make_req(row, total, cached, uid))
        qs.append(q), ks.append(k), vs.append(v), locs.append(loc)
    return Scenario(kv, backend, page_table.to(dev()), reqs, qs, ks, vs, locs)


def manual_metadata(s: Scenario) -> AttentionMetadata:
    """The metadata written out by hand, so the backend is judged on its own."""
    new = [r.extend_len for r in s.reqs]
    total = [r.device_len for r in s.reqs]
    cu = torch.tensor([0] + new).cumsum(0).to(torch.int32)
    rows = torch.tensor([r.table_idx for r in s.reqs])
    return AttentionMetadata(
        cu_seqlens_q=cu.to(dev()), cache_seqlens=torch.tensor(total, dtype=torch.int32, device=dev()),
        page_table=s.page_table[rows.to(dev()), : max(total)], last_indices=(cu[1:] - 1).long().to(dev()),
        max_seqlen_q=max(new), max_seqlen_k=max(total))


def run_backend(s: Scenario, phase: str, use_prepare_metadata: bool = False) -> List[torch.Tensor]:
    batch = Batch(s.reqs, phase)
    batch.out_loc = torch.cat([loc[r.cached_len:] for r, loc in zip(s.reqs, s.locs)]).to(dev())
    batch.attn_metadata = (prepare_metadata(batch, s.page_table, dev()) if use_prepare_metadata
                           else manual_metadata(s))
    new = lambda xs: torch.cat([x[r.cached_len:] for r, x in zip(s.reqs, xs)]).to(dev())  # noqa: E731
    out = s.backend.forward(new(s.q), new(s.k), new(s.v), layer_id=0, batch=batch)
    assert out.shape == (sum(r.extend_len for r in s.reqs), HEADS, HEAD_DIM)
    cu = batch.attn_metadata.cu_seqlens_q.tolist()
    return [out[cu[i]: cu[i + 1]].cpu() for i in range(len(s.reqs))]


def dense_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of a whole sequence with itself: [len, heads, dim]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    return out.transpose(0, 1)


def assert_matches_dense(s: Scenario, outs: List[torch.Tensor]) -> None:
    for i, (r, out) in enumerate(zip(s.reqs, outs)):
        want = dense_causal(s.q[i], s.k[i], s.v[i])[r.cached_len:]
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5,
                                   msg=lambda m: f"request {i} (cached {r.cached_len} of {r.device_len}): {m}")


# (table_idx, total_len, cached_len): a fresh prompt, a prefix-cache hit, and a one-token extend
MIXED = [(2, 9, 0), (0, 13, 8), (3, 6, 5)]
DECODE = [(1, 10, 9), (3, 3, 2), (0, 17, 16)]


@pytest.mark.parametrize("page_size", [1, 4])
def test_prefill_with_cached_prefixes_matches_dense_attention(page_size):
    s = make_scenario(MIXED, page_size)
    assert_matches_dense(s, run_backend(s, "prefill"))


@pytest.mark.parametrize("page_size", [1, 4])
def test_decode_batch_matches_dense_attention(page_size):
    s = make_scenario(DECODE, page_size, seed=1)
    assert_matches_dense(s, run_backend(s, "decode"))


@pytest.mark.parametrize("page_size", [1, 4])
def test_prepared_metadata_drives_the_backend_correctly(page_size):
    s = make_scenario(MIXED, page_size, seed=2)
    assert_matches_dense(s, run_backend(s, "prefill", use_prepare_metadata=True))
    d = make_scenario(DECODE, page_size, seed=3)
    assert_matches_dense(d, run_backend(d, "decode", use_prepare_metadata=True))


def test_backend_stores_this_steps_keys_and_values():
    s = make_scenario(MIXED, page_size=4, seed=4)
    run_backend(s, "prefill")
    for i, loc in enumerate(s.locs):  # every token, cached before or new now, is in the cache
        torch.testing.assert_close(s.kv.k_cache(0)[loc.to(dev())].cpu(), s.k[i])
        torch.testing.assert_close(s.kv.v_cache(0)[loc.to(dev())].cpu(), s.v[i])


def test_prefill_ignores_other_requests_keys():
    # Two requests with identical new tokens but different cached prefixes must differ: attention
    # must not mix requests (nor read beyond a request's own cache_seqlens).
    s = make_scenario([(0, 8, 5), (1, 8, 5)], page_size=1, seed=5)
    for t in (s.q, s.k, s.v):
        t[1][5:] = t[0][5:]
    a, b = run_backend(s, "prefill")
    assert not torch.allclose(a, b)
    assert_matches_dense(s, [a, b])
