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


def assert_metadata(
    meta: AttentionMetadata, page_table: torch.Tensor, rows: List[int], what: str, **want
) -> None:
    """Each field of `meta` against `want`, naming the first that differs; the page table must be
    the given rows of the engine's, cut to max_seqlen_k columns."""
    for name, value in want.items():
        got = getattr(meta, name)
        got = got.tolist() if torch.is_tensor(got) else got
        assert got == value, f"{what}: expected {name} {value}, got {got}"
    want_table = page_table[rows, : want["max_seqlen_k"]].tolist()
    assert meta.page_table.tolist() == want_table, (
        f"{what}: page_table should be rows {rows} of the engine's, cut to "
        f"{want['max_seqlen_k']} columns"
    )
    for name, dtype in (
        ("cu_seqlens_q", torch.int32),
        ("cache_seqlens", torch.int32),
        ("last_indices", torch.int64),
    ):
        t = getattr(meta, name)
        assert t.dtype == dtype and t.device.type == dev().type, (
            f"{what}: {name} should be {dtype} on {dev().type}, got {t.dtype} on {t.device.type}"
        )
    assert meta.page_table.device.type == dev().type, (
        f"{what}: page_table should be on {dev().type}"
    )


def test_prepare_metadata_of_a_mixed_prefill_batch():
    page_table = torch.arange(4 * MAX_LEN, dtype=torch.int32, device=dev()).view(4, MAX_LEN) + 1000
    # 1 new token
    reqs = [
        make_req(2, total_len=5, cached_len=0),  # a fresh prompt
        make_req(0, total_len=7, cached_len=4),  # a prefix-cache hit: 3 new tokens
        make_req(3, total_len=3, cached_len=2),
    ]
    meta = prepare_metadata(Batch(reqs, "prefill"), page_table, dev())
    assert_metadata(
        meta,
        page_table,
        [2, 0, 3],
        "a prefill batch of 5, 3 and 1 new tokens",
        cu_seqlens_q=[0, 5, 8, 9],
        cache_seqlens=[5, 7, 3],
        last_indices=[4, 7, 8],
        max_seqlen_q=5,
        max_seqlen_k=7,
    )


def test_prepare_metadata_of_a_decode_batch():
    page_table = torch.arange(3 * MAX_LEN, dtype=torch.int32, device=dev()).view(3, MAX_LEN)
    reqs = [make_req(1, total_len=9, cached_len=8), make_req(0, total_len=4, cached_len=3)]
    meta = prepare_metadata(Batch(reqs, "decode"), page_table, dev())
    assert_metadata(
        meta,
        page_table,
        [1, 0],
        "a decode batch of two requests",
        cu_seqlens_q=[0, 1, 2],
        cache_seqlens=[9, 4],
        last_indices=[0, 1],
        max_seqlen_q=1,
        max_seqlen_k=9,
    )


def test_key_lengths_count_the_token_still_in_flight():
    # With overlap scheduling (chapter 11) the next decode step is built before the last step's
    # token reaches the CPU: complete_one has counted it in device_len, input_ids lack it so far.
    # Its key is computed in this very step, so the key length is device_len.
    page_table = torch.arange(3 * MAX_LEN, dtype=torch.int32, device=dev()).view(3, MAX_LEN)
    reqs = [make_req(1, total_len=9, cached_len=8), make_req(0, total_len=4, cached_len=3)]
    for r in reqs:
        r.complete_one()  # the previous step was launched; its token has not arrived
    meta = prepare_metadata(Batch(reqs, "decode"), page_table, dev())
    assert_metadata(
        meta,
        page_table,
        [1, 0],
        "a decode batch whose last tokens are still in flight",
        cu_seqlens_q=[0, 1, 2],
        cache_seqlens=[10, 5],
        last_indices=[0, 1],
        max_seqlen_q=1,
        max_seqlen_k=10,
    )


def test_optional_metadata_fields_agree_with_the_tensors():
    # rows and the host copies are optional, but a GPU backend or the prefill loop reads them
    # when they are there: then they must say the same as the tensors.
    page_table = torch.arange(4 * MAX_LEN, dtype=torch.int32, device=dev()).view(4, MAX_LEN)
    reqs = [make_req(2, total_len=5, cached_len=0), make_req(0, total_len=7, cached_len=4)]
    meta = prepare_metadata(Batch(reqs, "prefill"), page_table, dev())
    for name, want in (
        ("rows", [2, 0]),
        ("cu_seqlens_q_host", [0, 5, 8]),
        ("cache_seqlens_host", [5, 7]),
    ):
        got = getattr(meta, name)
        if got is None:
            continue
        got = got.tolist() if torch.is_tensor(got) else list(got)
        assert got == want, f"{name} is optional, but when given it must be {want}, got {got}"
    if meta.rows is not None:
        assert meta.rows.device.type == dev().type, (
            f"rows should be on {dev().type}, got {meta.rows.device.type}"
        )


# ---------------------------------------------------------------- the backend against dense
# attention


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
        loc = torch.tensor(
            [pages[i // page_size] * page_size + i % page_size for i in range(total)]
        )
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
        cu_seqlens_q=cu.to(dev()),
        cache_seqlens=torch.tensor(total, dtype=torch.int32, device=dev()),
        page_table=s.page_table[rows.to(dev()), : max(total)],
        last_indices=(cu[1:] - 1).long().to(dev()),
        max_seqlen_q=max(new),
        max_seqlen_k=max(total),
    )


def run_backend(
    s: Scenario, phase: str, use_prepare_metadata: bool = False, advance_requests: bool = False
) -> List[torch.Tensor]:
    batch = Batch(s.reqs, phase)
    batch.out_loc = torch.cat([loc[r.cached_len :] for r, loc in zip(s.reqs, s.locs)]).to(dev())
    batch.attn_metadata = (
        prepare_metadata(batch, s.page_table, dev()) if use_prepare_metadata else manual_metadata(s)
    )
    new = lambda xs: torch.cat([x[r.cached_len :] for r, x in zip(s.reqs, xs)]).to(dev())  # noqa: E731
    q, k, v = new(s.q), new(s.k), new(s.v)
    tokens = sum(r.extend_len for r in s.reqs)
    if advance_requests:
        # As the scheduler does right after launching a step. With overlap scheduling the step's
        # work may run only after this, so the backend must take every length from the metadata.
        for r in s.reqs:
            r.complete_one()
    out = s.backend.forward(q, k, v, layer_id=0, batch=batch)
    assert out.shape == (tokens, HEADS, HEAD_DIM), (
        f"the output should be [{tokens} tokens, {HEADS} heads, {HEAD_DIM}] like q, got "
        f"{list(out.shape)}"
    )
    cu = batch.attn_metadata.cu_seqlens_q.tolist()
    return [out[cu[i] : cu[i + 1]].cpu() for i in range(len(s.reqs))]


def dense_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of a whole sequence with itself: [len, heads, dim]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    )
    return out.transpose(0, 1)


def assert_matches_dense(
    s: Scenario, outs: List[torch.Tensor], cached: List[int] | None = None
) -> None:
    """`cached`: each request's cached length in the step (default: what the requests say now)."""
    cached = cached or [r.cached_len for r in s.reqs]
    for i, (c, out) in enumerate(zip(cached, outs)):
        want = dense_causal(s.q[i], s.k[i], s.v[i])[c:]
        torch.testing.assert_close(
            out,
            want,
            atol=1e-5,
            rtol=1e-5,
            msg=lambda m: f"request {i} (cached {c} of {len(s.q[i])}): {m}",
        )


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


def test_prefill_takes_lengths_from_the_metadata_only():
    s = make_scenario(MIXED, page_size=4, seed=6)
    cached = [r.cached_len for r in s.reqs]
    assert_matches_dense(s, run_backend(s, "prefill", advance_requests=True), cached)


def test_decode_takes_lengths_from_the_metadata_only():
    s = make_scenario(DECODE, page_size=4, seed=7)
    cached = [r.cached_len for r in s.reqs]
    assert_matches_dense(s, run_backend(s, "decode", advance_requests=True), cached)


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
    assert not torch.allclose(a, b), (
        "two requests with different cached prefixes got the same output: one saw the other's keys"
    )
    assert_matches_dense(s, [a, b])
