"""Chapter 17: the engine's Triton attention kernels against the torch reference.

The paged decode kernel (split over each request's keys, then the combine of the slices' partial
softmaxes) and the paged prefill kernel, on scattered pages of several sizes, GQA ratios from 1 to
8 query heads per KV head, lengths from one key to several blocks, and split counts from 1 to 16.
On a CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by conftest), so the
shapes are small; with `--device cuda` they are compiled for the GPU.

Every location of the KV pool that no request owns holds NaN, and so does location 0, where the
page table's padding points: a kernel that reads one key too many, or a value it masked out,
returns NaN instead of a number that might pass.
"""

from __future__ import annotations

import math
from typing import List, Sequence

import pytest
import torch

pytest.importorskip("triton", reason='chapter 17 needs triton: pip install -e ".[triton]"')

from helpers import test_device  # noqa: E402
from minisgl.attention import TorchAttentionBackend, prepare_metadata  # noqa: E402
from minisgl.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from minisgl.core import Batch, Req, SamplingParams  # noqa: E402
from minisgl.kernel.triton_decode import num_splits, paged_decode_attention  # noqa: E402
from minisgl.kernel.triton_prefill import paged_prefill_attention  # noqa: E402
from minisgl.kvcache import KVCache  # noqa: E402

DIM = 16  # the smallest head the kernels take: one tensor-core tile
TOL = dict(atol=2e-5, rtol=2e-5)


def device() -> torch.device:
    return torch.device(test_device())


class Scene:
    """A KV pool of `pages` pages of `page_size` locations with random keys and values at the
    locations the requests own and NaN everywhere else, a page table whose rows list each request's
    locations (its pages in a scattered order; 0 past its length), and the rows in a shuffled
    order."""

    def __init__(
        self,
        lengths: Sequence[int],
        page_size: int,
        kv_heads: int,
        seed: int = 0,
        key_scale: float = 1.0,
    ):
        g = torch.Generator().manual_seed(seed)
        need = sum(-(-n // page_size) for n in lengths)
        pages = need + 3  # page 0 (the padding's target) and two spare pages stay unused
        self.k_cache = torch.full((pages * page_size, kv_heads, DIM), float("nan"))
        self.v_cache = torch.full((pages * page_size, kv_heads, DIM), float("nan"))
        order = (torch.randperm(pages - 1, generator=g) + 1).tolist()  # page 0 is never handed out
        self.num_rows = len(lengths) + 2
        self.rows = torch.randperm(self.num_rows, generator=g)[: len(lengths)]
        width = max(lengths) + 5
        self.page_table = torch.zeros(self.num_rows, width, dtype=torch.int32)
        self.locations: List[torch.Tensor] = []
        for row, n in zip(self.rows.tolist(), lengths):
            own = [order.pop() for _ in range(-(-n // page_size))]
            locs = torch.tensor([own[p // page_size] * page_size + p % page_size for p in range(n)])
            self.page_table[row, :n] = locs.to(torch.int32)
            self.k_cache[locs] = torch.randn(n, kv_heads, DIM, generator=g) * key_scale
            self.v_cache[locs] = torch.randn(n, kv_heads, DIM, generator=g)
            self.locations.append(locs)
        self.g = g
        self.lengths = list(lengths)
        dev = device()
        self.k_cache, self.v_cache = self.k_cache.to(dev), self.v_cache.to(dev)
        self.page_table, self.rows = self.page_table.to(dev), self.rows.to(dev)

    def queries(self, tokens: int, heads: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(tokens, heads, DIM, generator=self.g) * scale).to(device())

    def reference(self, i: int, q: torch.Tensor, len_q: int) -> torch.Tensor:
        """Request i's last len_q queries q [len_q, H, D] attended causally over its keys, in
        float64 torch: what the kernels must give."""
        locs = self.locations[i].to(q.device)
        k, v = self.k_cache[locs].double(), self.v_cache[locs].double()
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        n = self.lengths[i]
        scores = torch.einsum("qhd,khd->hqk", q.double(), k) / math.sqrt(DIM)
        qpos = torch.arange(n - len_q, n, device=q.device)[:, None]
        scores = scores.masked_fill(torch.arange(n, device=q.device)[None, :] > qpos, -math.inf)
        return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).float()


def decode(scene: Scene, q: torch.Tensor, splits: int | None = None) -> torch.Tensor:
    seqlens = torch.tensor(scene.lengths, dtype=torch.int32, device=q.device)
    tuning = None if splits is None else {"splits": splits}
    return paged_decode_attention(
        q, scene.k_cache, scene.v_cache, scene.page_table, scene.rows, seqlens, DIM**-0.5, tuning
    )


def decode_reference(scene: Scene, q: torch.Tensor) -> torch.Tensor:
    return torch.stack([scene.reference(i, q[i : i + 1], 1)[0] for i in range(q.shape[0])])


def prefill(scene: Scene, q: torch.Tensor, new: Sequence[int]) -> torch.Tensor:
    cu = [0]
    for n in new:
        cu.append(cu[-1] + n)
    dev = q.device
    return paged_prefill_attention(
        q,
        scene.k_cache,
        scene.v_cache,
        scene.page_table,
        scene.rows,
        torch.tensor(cu, dtype=torch.int32, device=dev),
        torch.tensor(scene.lengths, dtype=torch.int32, device=dev),
        max(new),
        DIM**-0.5,
    )


def prefill_reference(scene: Scene, q: torch.Tensor, new: Sequence[int]) -> torch.Tensor:
    parts, start = [], 0
    for i, n in enumerate(new):
        parts.append(scene.reference(i, q[start : start + n], n))
        start += n
    return torch.cat(parts)


# ---------------------------------------------------------------- decode


@pytest.mark.parametrize("page_size", [1, 4], ids=["page1", "page4"])
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 2), (8, 1)], ids=["gqa1", "gqa2", "gqa8"])
def test_decode_equals_attention_over_each_requests_own_keys(page_size, heads, kv_heads):
    # one key, a few, exactly one block of 32 (the float32 block), and past two blocks
    scene = Scene([1, 7, 32, 70], page_size, kv_heads, seed=page_size * 10 + heads)
    q = scene.queries(4, heads)
    got = decode(scene, q)
    assert got.shape == q.shape and got.dtype == q.dtype
    torch.testing.assert_close(got, decode_reference(scene, q), **TOL)


@pytest.mark.parametrize("splits", [1, 2, 4, 16], ids=lambda n: f"splits{n}")
def test_every_split_count_gives_the_same_attention(splits):
    # with 16 slices of a 9-key request most slices are empty; the 100-key one has full and
    # partial slices
    scene = Scene([9, 100, 33], 4, 2, seed=splits)
    q = scene.queries(3, 4)
    torch.testing.assert_close(decode(scene, q, splits), decode_reference(scene, q), **TOL)


def test_the_default_split_count_depends_on_the_batch_alone():
    assert num_splits(1, 8) == 16 and num_splits(64, 8) == 2 and num_splits(128, 8) == 1
    assert num_splits(3, 2) == num_splits(4, 2)  # a batch padded to 4 for a CUDA graph splits alike


def test_decode_with_large_scores_rescales_by_the_running_max():
    # scores of a few hundred: exp of one overflows float32, so each block and each slice must
    # be weighted relative to a maximum; the largest scores sit in the last keys (a later block,
    # a later slice), where the running maximum changes
    scene = Scene([90, 50], 1, 2, seed=3, key_scale=4.0)
    q = scene.queries(2, 4, scale=12.0)
    for splits in (1, 4):
        got = decode(scene, q, splits)
        assert torch.isfinite(got).all(), f"{splits} slices: not finite"
        torch.testing.assert_close(got, decode_reference(scene, q), atol=1e-4, rtol=1e-4)


def test_decode_of_a_slice_whose_keys_outweigh_the_others():
    # one key of request 0 matches its query far better than the rest, and sits in the last of
    # 4 slices: the combine must give that slice almost all the weight, not a quarter of it
    scene = Scene([64], 1, 1, seed=5)
    q = scene.queries(1, 1)
    loc = scene.locations[0][60]
    scene.k_cache[loc] = q[0] * 8.0
    got = decode(scene, q, 4)
    want = decode_reference(scene, q)
    torch.testing.assert_close(got, want, **TOL)
    assert (got[0, 0] - scene.v_cache[loc, 0]).abs().max() < 0.05  # almost exactly that value


# ---------------------------------------------------------------- prefill


@pytest.mark.parametrize("page_size", [1, 4], ids=["page1", "page4"])
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 2), (8, 1)], ids=["gqa1", "gqa2", "gqa8"])
def test_prefill_is_causal_after_each_requests_cached_prefix(page_size, heads, kv_heads):
    # a fresh prompt; a chunk after a cached prefix; one new token after a prefix; a chunk longer
    # than a query block (32) after a prefix of odd length
    new, cached = [6, 9, 1, 40], [0, 5, 3, 13]
    scene = Scene([n + c for n, c in zip(new, cached)], page_size, kv_heads, seed=heads)
    q = scene.queries(sum(new), heads)
    got = prefill(scene, q, new)
    assert got.shape == q.shape and got.dtype == q.dtype
    torch.testing.assert_close(got, prefill_reference(scene, q, new), **TOL)


def test_the_first_token_of_a_fresh_prompt_attends_to_itself_alone():
    scene = Scene([5], 1, 1, seed=7)
    q = scene.queries(5, 2)
    got = prefill(scene, q, [5])
    first = scene.v_cache[scene.locations[0][0]]  # [1, D]: its own value, for both query heads
    torch.testing.assert_close(got[0], first.expand(2, DIM), **TOL)
    torch.testing.assert_close(got, prefill_reference(scene, q, [5]), **TOL)


def test_a_chunk_sees_the_whole_cached_prefix():
    # 2 new tokens after 60 cached keys: the last key of the prefix outweighs everything, so both
    # new tokens must return (almost) its value
    scene = Scene([62], 1, 1, seed=8)
    q = scene.queries(2, 1)
    loc = scene.locations[0][59]
    scene.k_cache[loc] = (q[0] + q[1]) * 8.0
    got = prefill(scene, q, [2])
    torch.testing.assert_close(got, prefill_reference(scene, q, [2]), **TOL)
    assert (got[:, 0] - scene.v_cache[loc, 0]).abs().max() < 0.05


# ---------------------------------------------------------------- the backends


def test_triton_backend_equals_the_torch_backend_through_the_engines_metadata():
    """Prefill then decode, as the engine runs them: its KV pool, its page table, metadata from
    prepare_metadata; the Triton backend against the torch reference backend."""
    dev = device()
    page, heads, kv_heads = 4, 4, 2
    pool = KVCache(1, 24, page, kv_heads, DIM, torch.float32, dev)
    table = torch.zeros(4, 40, dtype=torch.int32, device=dev)
    free = [9, 2, 17, 5, 11, 0, 21, 7, 14, 3, 19, 1, 12, 6, 23, 8]
    g = torch.Generator().manual_seed(11)
    specs = [(3, 13, 5), (0, 7, 0), (1, 20, 19)]  # (row, length, cached) before the step
    reqs, new_kv = [], []
    for uid, (row, length, cached) in enumerate(specs):
        pages = [free.pop(0) for _ in range(-(-length // page))]
        locs = torch.tensor([pages[p // page] * page + p % page for p in range(length)])
        table[row, :length] = locs.to(torch.int32).to(dev)
        k = torch.randn(length, kv_heads, DIM, generator=g).to(dev)
        v = torch.randn(length, kv_heads, DIM, generator=g).to(dev)
        pool.k_cache(0)[locs.to(dev)] = k
        pool.v_cache(0)[locs.to(dev)] = v
        ids = torch.arange(length, dtype=torch.int32)
        reqs.append(Req(ids, row, cached, 4, uid, SamplingParams()))
        new_kv.append(locs)
    torch_backend = TorchAttentionBackend(pool, heads, kv_heads, DIM)
    triton_backend = TritonAttentionBackend(pool, heads, kv_heads, DIM, table)
    prefill_reqs = reqs[:2]
    batch = Batch(prefill_reqs, "prefill")
    batch.attn_metadata = prepare_metadata(batch, table, dev)
    tokens = sum(r.extend_len for r in prefill_reqs)
    q = torch.randn(tokens, heads, DIM, generator=g).to(dev)
    torch.testing.assert_close(
        triton_backend.attend(q, 0, batch), torch_backend.attend(q, 0, batch), **TOL
    )
    batch = Batch(reqs[2:] + reqs[:1], "decode")  # request 0 now decodes its 13th token
    reqs[0].cached_len = reqs[0].device_len - 1
    batch.attn_metadata = prepare_metadata(batch, table, dev)
    q = torch.randn(2, heads, DIM, generator=g).to(dev)
    torch.testing.assert_close(
        triton_backend.attend(q, 0, batch), torch_backend.attend(q, 0, batch), **TOL
    )
