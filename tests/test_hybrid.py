"""Hybrid models: Qwen3.5 and Qwen3-Next (Gated DeltaNet layers between gated full-attention ones).

- The maths (minisgl/kernel/delta_rule.py): the chunked delta rule equals the token-by-token
  recurrence and transformers' reference; the convolution carries its window across chunks.
- The parity matrix: small random checkpoints that transformers wrote (tests/hybrid_checkpoints.py:
  GQA ratios, one KV head, tied and untied, partial RoPE, a 3-wide convolution, bfloat16, MoE on,
  off and every second layer for Qwen3-Next, the vision-language Qwen3.5's language model) give
  transformers' greedy tokens with overlap on and off, page sizes 1, 2 and 4, chunked prefill down
  to 3 tokens a chunk, and more requests than slots.
- The state pool: one row per slot, the KV cache only for the full-attention layers, the memory
  plan paying for the state; a reused slot's new owner computes from zeros, also with deferred CPU
  streams and the step in flight; the torture test on a hybrid checkpoint.
- Refusals by name: the radix cache, tensor parallelism, layer kinds and head counts the engine
  does not implement; every config field of the hybrid families decided.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
import torch

from helpers import assert_tokens_equal, build_llm, greedy, hf_greedy, test_device
from hybrid_checkpoints import HYBRID_RECIPES, hybrid_checkpoint
from minisgl import SamplingParams
from minisgl.engine.config import EngineConfig
from minisgl.engine.context import plan_pool, table_bytes_per_position
from minisgl.env import ENV
from minisgl.kernel.delta_rule import (
    causal_conv1d,
    causal_conv1d_step,
    delta_rule_chunked,
    delta_rule_recurrent,
    l2_normalize,
)
from minisgl.kvcache import KVCache
from minisgl.kvcache.state_pool import StatePool
from minisgl.llm import LLM
from minisgl.models.config import NO_EFFECT_FIELDS, READ_FIELDS, REFUSED_FIELDS, ModelConfig

NEW_TOKENS = 8


def prompts():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 256, (80,), generator=g).tolist()
    # lengths 5, 19, 15 and 80 (past one 64-token chunk of the delta rule)
    return [ids[:5], ids[5:24], ids[5:17] + ids[:3], ids]


# ---------------------------------------------------------------- the maths


def _rule_inputs(n: int, length: int, heads: int = 4, dk: int = 8, dv: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(n, length, heads, dk, generator=g)) * dk**-0.5
    k = l2_normalize(torch.randn(n, length, heads, dk, generator=g))
    v = torch.randn(n, length, heads, dv, generator=g)
    decay = -torch.rand(n, length, heads, generator=g)  # log space, <= 0
    beta = torch.rand(n, length, heads, generator=g)
    state = torch.randn(n, heads, dk, dv, generator=g)
    return q, k, v, decay, beta, state


@pytest.mark.parametrize("length,chunk", [(1, 64), (5, 4), (37, 16), (64, 64), (130, 64)])
def test_the_chunked_delta_rule_equals_the_recurrence(length, chunk):
    q, k, v, g, beta, state = _rule_inputs(2, length)
    want_out, want_state = delta_rule_recurrent(q, k, v, g, beta, state)
    out, new_state = delta_rule_chunked(q, k, v, g, beta, state, chunk=chunk)
    torch.testing.assert_close(out, want_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(new_state, want_state, atol=2e-5, rtol=1e-4)


def test_the_recurrence_equals_transformers_reference():
    from transformers.models.qwen3_next import modeling_qwen3_next as hf

    q, k, v, g, beta, state = _rule_inputs(2, 21, seed=3)
    # transformers normalizes and scales inside; give it the raw q and k (unit-norm already)
    want, want_state = hf.torch_recurrent_gated_delta_rule(
        q / q.shape[-1] ** -0.5, k, v, g=g, beta=beta, initial_state=state, output_final_state=True
    )
    out, new_state = delta_rule_recurrent(q, k, v, g, beta, state)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(new_state, want_state, atol=2e-5, rtol=1e-4)


def test_the_convolution_carries_its_window_across_chunks():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(11, 6, generator=g)
    weight = torch.randn(6, 4, generator=g)
    zeros = torch.zeros(6, 3)
    whole, window = causal_conv1d(x, zeros, weight)
    first, mid = causal_conv1d(x[:2], zeros, weight)  # shorter than the window
    second, end = causal_conv1d(x[2:], mid, weight)
    torch.testing.assert_close(torch.cat([first, second]), whole)
    torch.testing.assert_close(end, window)
    # one decode step from the window equals the next row of the whole sequence
    _, ten = causal_conv1d(x[:10], zeros, weight)
    step, after = causal_conv1d_step(x[10:11], ten[None], weight)
    torch.testing.assert_close(step, whole[10:11])
    torch.testing.assert_close(after[0], window)


# ---------------------------------------------------------------- the parity matrix

MODES = {
    "overlap, page 1": dict(page_size=1),
    "normal loop, page 4, chunks of 3 tokens": dict(page_size=4, max_extend_tokens=3),
    "overlap, page 2, chunks of 8, 2 slots for 4 requests": dict(
        page_size=2, max_extend_tokens=8, max_running_req=2
    ),
}


@pytest.mark.parametrize("name", sorted(HYBRID_RECIPES))
def test_greedy_tokens_equal_transformers_in_every_mode(name):
    ckpt = hybrid_checkpoint(name)
    want = hf_greedy(prompts(), NEW_TOKENS, model=ckpt)
    for mode, options in MODES.items():
        ENV.DISABLE_OVERLAP_SCHEDULING.value = mode.startswith("normal")  # put back by conftest
        llm = build_llm(ckpt, cache_type="naive", **options)
        got = [o["token_ids"] for o in llm.generate(prompts(), greedy(NEW_TOKENS))]
        assert_tokens_equal(got, want, f"checkpoint {name}, {mode}")
        llm.shutdown()


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_next-dense-tied"])
def test_decode_steps_replayed_from_cuda_graphs_give_transformers_tokens(name):
    """On a CPU the engine captures emulated graphs (minisgl/engine/graph_emulation.py): a replay
    runs the recorded operators only, on the static buffers, as a GPU's graph does. Decode steps
    of 1 to 4 requests (padded to a captured size, the padding in the scratch row's state) give
    transformers' tokens. (Qwen3-Next's experts are left out: the CPU's expert path is not
    capturable, for Qwen3-MoE alike; a GPU runs the fused kernel.)"""
    ckpt = hybrid_checkpoint(name)
    want = hf_greedy(prompts(), NEW_TOKENS, model=ckpt)
    llm = build_llm(ckpt, device="cpu", cache_type="naive", use_cuda_graph=True, max_running_req=4)
    got = [o["token_ids"] for o in llm.generate(prompts(), greedy(NEW_TOKENS))]
    assert llm.engine.graph_runner.replays > 0, "no decode step ran from a graph"
    assert_tokens_equal(got, want, f"checkpoint {name}, decode steps from emulated graphs")
    llm.shutdown()


def test_the_matrix_has_teeth():
    # The partial rotary factor must matter: read as full RoPE, the tokens differ.
    ckpt = hybrid_checkpoint("qwen3_5")
    want = hf_greedy(prompts(), NEW_TOKENS, model=ckpt)
    full = ckpt.parent / (ckpt.name + "-read-as-full-rope")
    if not full.is_dir():
        shutil.copytree(ckpt, full)
        raw = json.loads((full / "config.json").read_text())
        raw["rope_parameters"]["partial_rotary_factor"] = 1.0
        (full / "config.json").write_text(json.dumps(raw))
    llm = build_llm(full, cache_type="naive")
    got = [o["token_ids"] for o in llm.generate(prompts(), greedy(NEW_TOKENS))]
    assert got != want, "partial RoPE read as full RoPE still gives transformers' tokens"


# ---------------------------------------------------------------- the state pool


def test_only_full_attention_layers_keep_kv_and_each_slot_has_a_state_row():
    ckpt = hybrid_checkpoint("qwen3_5-kv1-tied-rot50-conv3")  # layers: full, linear, linear, full
    llm = build_llm(ckpt, cache_type="naive", max_running_req=3)
    engine = llm.engine
    assert engine.kv_cache.num_layers == 2, "the KV cache holds the two full-attention layers only"
    pool = engine.state_pool
    assert pool.rows == 4, "one state row per request slot, plus the scratch row"
    assert tuple(pool.conv.shape) == (2, 4, 2 * 16 + 2 * 16, 2)  # 2 layers, q|k|v channels, K - 1
    assert tuple(pool.recurrent.shape) == (2, 4, 2, 8, 16)
    assert pool.recurrent.dtype == torch.float32
    llm.shutdown()


def test_the_memory_plan_pays_for_the_state_pool_before_the_pages():
    ckpt = hybrid_checkpoint("qwen3_next-moe")
    model = ModelConfig.from_dir(ckpt)
    config = EngineConfig(model_path=str(ckpt), max_running_req=8, page_size=4)
    free = 64 << 20
    h = model.hybrid
    state = 9 * StatePool.bytes_per_row(
        3, h.conv_channels, h.conv_kernel, h.linear_v_heads, h.linear_k_dim, h.linear_v_dim,
        torch.float32,
    )  # fmt: skip
    per_page = KVCache.bytes_per_page(1, 4, model.num_kv_heads, model.head_dim, torch.float32)
    budget = int(free * config.memory_ratio) - state
    per_position = table_bytes_per_position(config, model)
    want = budget // (per_page + 4 * per_position)  # the pool shorter than the model's context
    want = (
        want
        if want * 4 < model.max_position_embeddings
        else ((budget - model.max_position_embeddings * per_position) // per_page)
    )
    got = plan_pool(config, model, torch.float32, free).num_pages
    assert got == want, (
        f"{got} pages planned, {want} expected: the state pool ({state} bytes for 9 rows) comes "
        "off the budget, and a page holds KV of the 1 full-attention layer, not of all 4"
    )


def test_a_state_pool_that_leaves_too_little_for_kv_is_refused_naming_max_running_req():
    ckpt = hybrid_checkpoint("qwen3_next-moe")
    model = ModelConfig.from_dir(ckpt)
    config = EngineConfig(model_path=str(ckpt), max_running_req=63, page_size=4)
    state = 64 * 9600  # 3 DeltaNet layers of 9600 bytes a row, float32
    with pytest.raises(ValueError, match="max_running_req=63"):
        plan_pool(config, model, torch.float32, int(state / config.memory_ratio))


def test_a_reused_slot_starts_from_zeros_with_the_step_in_flight_deferred():
    """One slot for four requests, overlap on, deferred CPU streams: each request's last step is
    still queued when the next one takes its slot (rule 3 keeps the slot until that step is
    handled). Every request computes transformers' tokens: none reads the state its predecessor
    left in the row."""
    ENV.DISABLE_OVERLAP_SCHEDULING.value = False
    ckpt = hybrid_checkpoint("qwen3_5")
    want = hf_greedy(prompts(), NEW_TOKENS, model=ckpt)
    llm = build_llm(
        ckpt, device="cpu", cpu_streams="deferred", cache_type="naive", max_running_req=1
    )
    got = [o["token_ids"] for o in llm.generate(prompts(), greedy(NEW_TOKENS))]
    assert_tokens_equal(got, want, "requests that take turns in one slot, deferred streams")
    llm.shutdown()


@pytest.mark.parametrize("variant", [None, "ch11_upstream_slot"])
def test_a_slot_goes_to_the_next_request_only_once_its_step_in_flight_is_done(variant):
    """Chapter 11's rule 3 on a hybrid model. Request A meets EOS while the step after it, which
    still holds A, is in flight; with deferred CPU streams that step runs only after the next
    request B was scheduled, and writes A's stale sample into the slot's row, A's state into the
    slot's state row. The reference keeps the slot from B until that step is handled, and B
    computes transformers' tokens (its first step starts from a zero state in stream order, after
    the stale step). The upstream variant hands the slot over at once: B's prompt in the row is
    overwritten, and its tokens are wrong."""
    from test_ch11_overlap import eos_at
    from test_ch11_variants import variant_llm

    ENV.DISABLE_OVERLAP_SCHEDULING.value = False
    ckpt = hybrid_checkpoint("qwen3_5")
    first = prompts()[1]
    ref_first = hf_greedy([first], 6, model=ckpt)[0]
    k, eos = eos_at(ref_first, 1)
    stale = len(first) + k + 1  # the position of the row the step in flight writes
    second = prompts()[3][: stale + 1]  # ... the last token of the next request's prompt
    options = dict(device="cpu", cpu_streams="deferred", cache_type="naive", max_running_req=1)
    if variant is not None:
        options["llm_class"] = variant_llm(variant)
    llm = build_llm(ckpt, **options)
    llm.eos_token_ids = {eos}
    a = llm.add_request(first, SamplingParams(max_tokens=6))
    b = llm.add_request(second, greedy(6))
    llm.run_until_idle()
    assert llm.results[a].token_ids == ref_first[: k + 1], "the request ending at EOS"
    right = llm.results[b].token_ids == hf_greedy([second], 6, model=ckpt)[0]
    if variant is None:
        assert right, "the request that took the freed slot computes other tokens than transformers"
    else:
        assert not right, "the slot reused with its step in flight went unnoticed: no teeth"
    llm.shutdown()


def test_the_torture_test_passes_on_a_hybrid_checkpoint():
    from torture.prompts import load_pool
    from torture.runner import run_workload
    from torture.workload import generate

    ckpt = hybrid_checkpoint("qwen3_next-moe")
    pool = load_pool(ckpt)
    for seed in range(8):
        wl = generate(seed, pool, max_requests=6)
        wl = replace(wl, setup=replace(wl.setup, cache_type="naive"))  # radix is refused
        result = run_workload(wl, pool, ckpt, test_device())
        assert result.failure is None, f"seed {seed}: {result.failure}"


# ---------------------------------------------------------------- refusals and config fields


def test_the_radix_cache_is_refused_naming_why():
    with pytest.raises(ValueError, match="radix.*DeltaNet.*naive"):
        LLM(hybrid_checkpoint("qwen3_5"), device="cpu")


def test_tensor_parallelism_is_refused_naming_the_layers():
    with pytest.raises(ValueError, match="tp_size=2.*DeltaNet"):
        LLM(hybrid_checkpoint("qwen3_5"), device="cpu", cache_type="naive", tp_size=2)


REFUSED = [
    ({"layer_types": ["sliding_attention"] + ["linear_attention"] * 3}, "sliding_attention"),
    ({"layer_types": ["linear_attention"] * 3}, "layer_types"),
    ({"layer_types": ["linear_attention"] * 4}, "full_attention"),
    ({"linear_num_value_heads": 3}, "linear_num_value_heads"),
    ({"linear_conv_kernel_dim": 0}, "linear_conv_kernel_dim"),
    ({"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.1}}, "partial_rotary"),
    ({"hidden_act": "gelu"}, "hidden_act"),
]


@pytest.mark.parametrize("fields,named", REFUSED, ids=[n for _, n in REFUSED])
def test_a_hybrid_config_the_engine_would_run_wrongly_is_refused_by_name(tmp_path, fields, named):
    model = tmp_path / "model"
    shutil.copytree(hybrid_checkpoint("qwen3_5"), model)
    raw = json.loads((model / "config.json").read_text())
    raw.update(fields)
    (model / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError) as e:
        ModelConfig.from_dir(model)
    assert named in str(e.value), f"{fields}: the error should name {named!r}, got: {e.value}"


def test_every_config_field_of_the_hybrid_families_is_decided():
    import transformers

    undecided = {}
    for cls_name in ("Qwen3NextConfig", "Qwen3_5TextConfig", "Qwen3_5Config"):
        fields = set(getattr(transformers, cls_name)().to_dict())
        rest = sorted(fields - READ_FIELDS - REFUSED_FIELDS - NO_EFFECT_FIELDS)
        if rest:
            undecided[cls_name] = rest
    assert not undecided, f"config fields neither read, refused nor harmless: {undecided}"
