"""Chapter 11 on a real GPU (run with `--device cuda`; skipped otherwise).

* the Triton paged-decode kernel against plain attention;
* float32 parity with Hugging Face, CUDA graphs on and off, overlap on and off;
* bfloat16 against Hugging Face in bfloat16, token for token while the reference's margins allow;
* the scheduler never waits for the engine stream except where it handles results;
* the upstream slot-reuse race, made deterministic by a sleep kernel on the engine stream: wrong
  tokens with upstream's logic, right tokens with the fix.
"""

from __future__ import annotations

import math
from typing import List

import pytest
import torch

import test_ch11_overlap as ch11
from helpers import MODEL, assert_tokens_equal, build_llm, greedy, hf_greedy, prompt_ids
from minisgl.llm import LLM
from test_ch11_variants import variant_llm

pytestmark = pytest.mark.gpu

# ~200 ms at the H200's ~2 GHz: far longer than the CPU needs to schedule the next step. 50 ms
# was not, once a step's handling grew (stops, seeds, logprobs): measured on the H200, upstream's
# slot reuse then gave right tokens at 100 M cycles and wrong ones at 400 M; the fix right at both.
SLEEP_CYCLES = 400_000_000


def slow_engine(base: type) -> type:
    """An LLM subclass whose engine stream sleeps before every step, so each step is still running
    long after the CPU launched it: what a busy GPU does now and then, every time."""

    class SlowEngine(base):
        def _forward(self, forward_input):
            self.engine.stream.launch(lambda: torch.cuda._sleep(SLEEP_CYCLES))
            return super()._forward(forward_input)

    SlowEngine.__name__ = f"Slow{base.__name__}"
    return SlowEngine


# ---------------------------------------------------------------- the kernel


def reference_decode(q, k_cache, v_cache, page_table, rows, seqlens, scale) -> torch.Tensor:
    """Plain float32 attention of each request's query over its own keys."""
    out = []
    for i in range(q.shape[0]):
        locs = page_table[rows[i], : seqlens[i]].long()
        k, v = k_cache[locs].float(), v_cache[locs].float()  # [L, Hkv, D]
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        w = torch.einsum("hd,lhd->hl", q[i].float(), k) * scale
        out.append(torch.einsum("hl,lhd->hd", w.softmax(-1), v))
    return torch.stack(out)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize(
    "batch,heads,kv_heads,head_dim", [(1, 16, 8, 128), (5, 8, 4, 32), (70, 16, 8, 128)]
)
def test_triton_decode_matches_plain_attention(dtype, tol, batch, heads, kv_heads, head_dim):
    from minisgl.kernel.triton_decode import paged_decode_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    locations, max_len, num_rows = 8192, 1100, batch + 3
    k_cache = torch.randn(locations, kv_heads, head_dim, generator=g, device="cuda").to(dtype)
    v_cache = torch.randn(locations, kv_heads, head_dim, generator=g, device="cuda").to(dtype)
    q = torch.randn(batch, heads, head_dim, generator=g, device="cuda").to(dtype)
    # scattered locations, rows in a shuffled order, lengths from 1 to past a thousand
    page_table = torch.randint(
        0, locations, (num_rows, max_len), generator=g, device="cuda", dtype=torch.int32
    )
    rows = torch.randperm(num_rows, generator=g, device="cuda")[:batch]
    seqlens = torch.randint(1, max_len + 1, (batch,), generator=g, device="cuda", dtype=torch.int32)
    seqlens[0] = 1
    scale = 1 / math.sqrt(head_dim)
    got = paged_decode_attention(q, k_cache, v_cache, page_table, rows, seqlens, scale)
    want = reference_decode(q, k_cache, v_cache, page_table, rows.tolist(), seqlens.tolist(), scale)
    assert got.dtype == dtype and got.shape == q.shape
    err = (got.float() - want).abs().max().item()
    assert err < tol, f"max abs error {err:.2e} > {tol:.0e}"


def reference_prefill(q, k_cache, v_cache, page_table, rows, cu, seqlens, scale) -> torch.Tensor:
    """Plain float32 causal attention of each request's new tokens over all of its keys."""
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for i in range(len(rows)):
        qi = q[cu[i] : cu[i + 1]].float()  # [Lq, H, D]
        len_q, len_k = qi.shape[0], seqlens[i]
        locs = page_table[rows[i], :len_k].long()
        k, v = k_cache[locs].float(), v_cache[locs].float()
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        w = torch.einsum("qhd,khd->hqk", qi, k) * scale
        visible = (
            torch.arange(len_k, device=q.device)[None, :]
            <= torch.arange(len_k - len_q, len_k, device=q.device)[:, None]
        )
        w = w.masked_fill(~visible, float("-inf"))
        out[cu[i] : cu[i + 1]] = torch.einsum("hqk,khd->qhd", w.softmax(-1), v)
    return out


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(16, 8, 128), (8, 4, 32)])
def test_triton_prefill_matches_plain_attention(dtype, tol, heads, kv_heads, head_dim):
    from minisgl.kernel.triton_prefill import paged_prefill_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    # new tokens / cached keys per request: a whole prompt, a chunk after a cached prefix, one
    # token, a chunk longer than a block after a prefix of odd length
    new, cached = [37, 64, 1, 150], [0, 100, 9, 77]
    locations, max_len, num_rows = 4096, 300, 6
    k_cache = torch.randn(locations, kv_heads, head_dim, generator=g, device="cuda").to(dtype)
    v_cache = torch.randn(locations, kv_heads, head_dim, generator=g, device="cuda").to(dtype)
    q = torch.randn(sum(new), heads, head_dim, generator=g, device="cuda").to(dtype)
    page_table = torch.randint(
        0, locations, (num_rows, max_len), generator=g, device="cuda", dtype=torch.int32
    )
    rows = torch.tensor([4, 0, 5, 2], device="cuda")
    cu = [0]
    for n in new:
        cu.append(cu[-1] + n)
    seqlens = [n + c for n, c in zip(new, cached)]
    scale = 1 / math.sqrt(head_dim)
    got = paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        page_table,
        rows,
        torch.tensor(cu, dtype=torch.int32, device="cuda"),
        torch.tensor(seqlens, dtype=torch.int32, device="cuda"),
        max(new),
        scale,
    )
    want = reference_prefill(q, k_cache, v_cache, page_table, rows.tolist(), cu, seqlens, scale)
    assert got.dtype == dtype and got.shape == q.shape
    err = (got.float() - want).abs().max().item()
    assert err < tol, f"max abs error {err:.2e} > {tol:.0e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_elementwise_kernels_match_the_torch_ops(dtype):
    from minisgl.kernel import ops, triton_ops
    from minisgl.kvcache import KVCache
    from minisgl.layers import RotaryEmbedding

    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    g = torch.Generator(device="cuda").manual_seed(1)

    def rand(*shape):
        return torch.randn(*shape, generator=g, device="cuda").to(dtype)

    x, res, w = rand(37, 1024), rand(37, 1024), rand(1024)
    torch.testing.assert_close(triton_ops.rms_norm(x, w, 1e-6), ops.rms_norm(x, w, 1e-6), **tol)
    for got, want in zip(
        triton_ops.fused_add_rms_norm(x, res, w, 1e-6), ops.fused_add_rms_norm(x, res, w, 1e-6)
    ):
        torch.testing.assert_close(got, want, **tol)
    gate_up = rand(37, 2 * 3072)
    torch.testing.assert_close(triton_ops.silu_and_mul(gate_up), ops.silu_and_mul(gate_up), **tol)
    # the one-row matrix product, for a narrow and a wide matrix and a ragged size; any row count
    # works
    for n, k in [(1024, 3072), (4096, 1024), (1000, 200)]:
        w2 = rand(n, k) / math.sqrt(k)
        for rows in (1, 3):
            xs = rand(rows, k)
            torch.testing.assert_close(
                triton_ops.small_batch_linear(xs, w2), torch.nn.functional.linear(xs, w2), **tol
            )
    # q/k norm, RoPE and the K/V store, from a merged qkv output, in one kernel
    rot = RotaryEmbedding(128, 4096, 1e6, torch.device("cuda"))
    heads, kv_heads, hd = 16, 8, 128
    qkv, qw, kw = rand(37, (heads + 2 * kv_heads) * hd), rand(hd), rand(hd)
    pos = torch.randint(0, 4096, (37,), generator=g, device="cuda")
    loc = torch.randperm(100, generator=g, device="cuda")[:37]
    q, k, v = (
        t.reshape(37, -1, hd) for t in qkv.split([heads * hd, kv_heads * hd, kv_heads * hd], dim=-1)
    )
    cos, sin = rot._cos[pos].to(dtype), rot._sin[pos].to(dtype)
    want_q = ops.apply_rope_neox(ops.rms_norm(q, qw, 1e-6), cos, sin)
    want_k = ops.apply_rope_neox(ops.rms_norm(k, kw, 1e-6), cos, sin)
    pool = KVCache(2, 100, 1, kv_heads, hd, dtype, torch.device("cuda"))
    want_pool = pool.buffer.clone().view(2, 2, 100, kv_heads, hd)
    want_pool[0, 1, loc], want_pool[1, 1, loc] = want_k, v
    got = qkv.clone()
    triton_ops.qk_norm_rope_store_(
        got,
        heads,
        kv_heads,
        qw,
        kw,
        rot._cos,
        rot._sin,
        pos,
        1e-6,
        pool.k_cache(1),
        pool.v_cache(1),
        loc,
    )
    # in place
    torch.testing.assert_close(got[:, : heads * hd].reshape(37, heads, hd), want_q, **tol)
    # k, v untouched
    torch.testing.assert_close(got[:, heads * hd :], qkv[:, heads * hd :], atol=0, rtol=0)
    # layer 1 only, at loc only
    torch.testing.assert_close(pool.buffer.view_as(want_pool), want_pool, **tol)
    # Llama: no q/k norm
    got = qkv.clone()
    triton_ops.qk_norm_rope_store_(
        got,
        heads,
        kv_heads,
        None,
        None,
        rot._cos,
        rot._sin,
        pos,
        1e-6,
        pool.k_cache(0),
        pool.v_cache(0),
        loc,
    )
    torch.testing.assert_close(
        got[:, : heads * hd].reshape(37, heads, hd), ops.apply_rope_neox(q, cos, sin), **tol
    )
    torch.testing.assert_close(pool.k_cache(0)[loc], ops.apply_rope_neox(k, cos, sin), **tol)


# ---------------------------------------------------------------- parity with Hugging Face


LENGTHS = [12, 7, 10, 4]  # the decode batch shrinks 4 -> 3 -> 2 -> 1: padded graph replays


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("graphs", [True, False])
def test_float32_matches_hf_with_and_without_cuda_graphs(graphs, overlap):
    ch11.set_overlap(overlap)
    prompts = prompt_ids()
    want = [w[:n] for w, n in zip(hf_greedy(prompts, max(LENGTHS)), LENGTHS)]
    llm = build_llm(use_cuda_graph=graphs)
    assert (llm.engine.graph_runner is not None) == graphs
    got = [o["token_ids"] for o in llm.generate(prompts, [greedy(n) for n in LENGTHS])]
    assert_tokens_equal(
        got, want, f"graphs {'on' if graphs else 'off'}, overlap {'on' if overlap else 'off'}"
    )
    if graphs:
        assert llm.engine.graph_runner.replays > 0, "no decode step ran from a CUDA graph"
    ch11.assert_idle_and_clean(llm)


def test_page_size_4_chunked_prefill_with_graphs():
    prompts = prompt_ids()
    llm = build_llm(page_size=4, max_extend_tokens=7)
    got = [o["token_ids"] for o in llm.generate(prompts, greedy(12))]
    assert_tokens_equal(got, hf_greedy(prompts, 12), "page size 4, chunks of 7, graphs on")


def test_bfloat16_graphs_on_and_off_agree():
    prompts = prompt_ids()
    outs = []
    for graphs in (True, False):
        llm = build_llm(dtype=torch.bfloat16, use_cuda_graph=graphs)
        # batch of 4: no padding
        outs.append([o["token_ids"] for o in llm.generate(prompts, greedy(24))])
        del llm
    assert_tokens_equal(outs[0], outs[1], "bf16, graphs on vs off")


# Largest logit gap (in HF's own bf16 logits) at which the two bf16 implementations may pick
# different tokens: beyond it the choice is clear and must agree.
BF16_MARGIN = 0.5


def hf_bf16_greedy(model, prompt: List[int], n: int):
    """Hugging Face in bf16 on the GPU: greedy tokens and each step's logits."""
    x = torch.tensor([prompt], device="cuda")
    tokens, logits = [], []
    with torch.no_grad():
        for _ in range(n):
            last = model(x).logits[0, -1].float()
            tokens.append(int(last.argmax()))
            logits.append(last)
            x = torch.cat([x, x.new_tensor([[tokens[-1]]])], dim=1)
    return tokens, logits


def test_bfloat16_matches_hf_bfloat16_where_margins_allow():
    prompts = prompt_ids()
    llm = build_llm(dtype=torch.bfloat16)
    got = [o["token_ids"] for o in llm.generate(prompts, greedy(24))]
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.bfloat16).cuda().eval()
    for i, prompt in enumerate(prompts):
        want, logits = hf_bf16_greedy(hf, prompt, 24)
        for j, (a, b) in enumerate(zip(got[i], want)):
            if a == b:
                continue
            gap = (logits[j][b] - logits[j][a]).item()
            assert gap <= BF16_MARGIN, (
                f"prompt {i}, token {j}: engine chose {a}, HF bf16 chose {b} "
                f"by a margin of {gap:.3f} logits (> {BF16_MARGIN})"
            )
            break  # past a legitimate divergence the two continuations differ


# ---------------------------------------------------------------- overlap on a real GPU


def test_scheduler_never_waits_for_the_step_it_just_launched():
    """With every step delayed on the engine stream, each overlap iteration must return while the
    step it launched is still running: nothing in scheduling or launching (prefill or decode)
    synchronizes with the GPU. Only handling results waits, and only for the previous step."""
    ch11.set_overlap(True)
    prompts = prompt_ids()
    llm = build_llm(llm_class=slow_engine(LLM))
    uids = [llm.add_request(p, greedy(5)) for p in prompts]
    phases = set()
    while llm.busy:
        llm.step()
        if llm._last_data is not None:
            forward_input, output = llm._last_data
            assert not output.copy_done.query(), (
                f"step {forward_input.batch.step} ({forward_input.batch.phase}) finished "
                "before the scheduler moved on"
            )
            phases.add(forward_input.batch.phase)
    assert phases == {"prefill", "decode"}
    got = [llm.results[u].token_ids for u in uids]
    assert_tokens_equal(got, hf_greedy(prompts, 5), "with a slow engine stream")


def test_slot_reuse_race_on_the_gpu_upstream_vs_fix():
    """The chapter's scenario (test_ch11_overlap.check_slot_race_gives_right_tokens_deferred) on
    real CUDA streams, with the engine stream delayed: upstream's immediate slot reuse lets the step
    in flight overwrite the next request's prompt; deferring the slot keeps it intact."""
    upstream = slow_engine(variant_llm("ch11_upstream_slot"))
    with pytest.raises(AssertionError):
        ch11.check_slot_race_gives_right_tokens_deferred(upstream)
    ch11.check_slot_race_gives_right_tokens_deferred(slow_engine(LLM))


def test_engine_defaults_on_cuda():
    llm = build_llm()
    assert llm.engine.backend_name == "triton"
    assert llm.engine.graph_runner is not None
    assert llm.engine.graph_runner.sizes == [1, 2, 4, 8]  # up to max_running_req (8 in the tests)
