"""The fused MoE Triton kernel (minisgl/kernel/triton_moe.py) against the torch path.

On a CPU it runs under Triton's interpreter (TRITON_INTERPRET=1, read when triton is imported,
so in a process of its own), when triton is installed (`pip install -e ".[triton]"`); on a GPU
(`--device cuda`) it runs compiled, in bfloat16 and float32, and a Qwen3-MoE engine with fused
kernels gives transformers' tokens.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from extras import needs_extra
from helpers import REPO, assert_tokens_equal, build_llm, greedy, hf_greedy, test_device

# Cases: (tokens, hidden, inter, experts, top_k): a decode step of one, a batch where some experts
# get nothing, more entries than one block of a busy expert holds, shapes that are not multiples
# of the kernel's tiles.
CASES = [(1, 64, 32, 8, 2), (13, 64, 32, 8, 2), (40, 48, 24, 4, 3), (7, 80, 40, 16, 1)]

CHECK = """
import torch
from minisgl.kernel.moe import moe_experts, route
from minisgl.kernel.triton_moe import align_by_expert, fused_moe

def check(tokens, hidden, inter, experts, top_k, dtype, device, tol):
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=g).to(device, dtype)
    gate_up = (torch.randn(experts, 2 * inter, hidden, generator=g) * 0.2).to(device, dtype)
    down = (torch.randn(experts, hidden, inter, generator=g) * 0.2).to(device, dtype)
    weights, ids = route(torch.randn(tokens, experts, generator=g).to(device), top_k, True)
    want = moe_experts(x, gate_up, down, weights, ids)
    got = fused_moe(x, gate_up, down, weights, ids)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    else:
        # In 16 bits the two paths round in different places (the torch path rounds each expert's
        # activations and output, the kernel sums in float32), so each is held to the float32
        # product of the same inputs, its largest error against the output's largest value: a
        # wrong expert, weight or row is off by the whole scale.
        ref = moe_experts(x.float(), gate_up.float(), down.float(), weights, ids)
        scale = ref.abs().max().clamp_min(1e-6)
        for name, out in (("fused kernel", got), ("torch path", want)):
            err = ((out.float() - ref).abs().max() / scale).item()
            assert err <= tol, f"{name}: {err:.2e} of the output's scale off float32 (tol {tol})"
    # the layout the kernel reads: every entry once, each block within one expert's run
    entries, block_expert = align_by_expert(ids, experts, 16)
    real = entries[entries < tokens * top_k]
    assert sorted(real.tolist()) == list(range(tokens * top_k)), "an entry lost or doubled"
    for b, e in enumerate(block_expert.tolist()):
        block = entries[b * 16 : (b + 1) * 16]
        block = block[block < tokens * top_k]
        if e < 0:
            assert block.numel() == 0, f"block {b} past the end holds entries"
        else:
            assert (ids.reshape(-1)[block] == e).all(), f"block {b} mixes experts"
"""


@needs_extra("triton")
def test_fused_moe_interpreted_on_the_cpu_equals_the_torch_path():
    # float16 too: the kernel rounds each product as the torch path does; only the sum over a
    # token's experts rounds once, not once per expert: an ulp apart at most, from top-3 on (the
    # interpreter's bfloat16 dot products are not right: bfloat16 is checked on a GPU only)
    script = CHECK + "".join(
        f"check({t}, {h}, {i}, {e}, {k}, torch.{dtype}, 'cpu', {tol})\n"
        for t, h, i, e, k in CASES
        for dtype, tol in (("float32", 1e-5), ("float16", 4e-3))
    )
    script += "x = torch.zeros(0, 8)\n"
    script += "w, ids = route(torch.zeros(0, 4), 2, True)\n"
    script += (
        "assert fused_moe(x, torch.ones(4, 6, 8), torch.ones(4, 8, 3), w, ids).shape == (0, 8)\n"
    )
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, textwrap.shorten(done.stderr[-3000:], 3000)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 2e-2), (torch.float32, 1e-4)])
def test_fused_moe_compiled_on_the_gpu_equals_the_torch_path(dtype, tol):
    if test_device() != "cuda":
        pytest.skip("needs --device cuda")
    namespace: dict = {}
    exec(CHECK, namespace)
    for case in CASES + [(300, 256, 128, 64, 8)]:  # 2400 entries: the 64-row blocks
        namespace["check"](*case, dtype, "cuda", tol)


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False], ids=["fused-kernel", "torch-path"])
def test_a_moe_engine_on_the_gpu_gives_transformers_tokens_with_cuda_graphs(fused):
    # Decode steps replay CUDA graphs: the fused kernel is captured as it is, the torch path
    # switches to its sync-free form while a graph is captured.
    if test_device() != "cuda":
        pytest.skip("needs --device cuda")
    from checkpoints import checkpoint
    from test_checkpoints import NEW_TOKENS, prompts

    ckpt = checkpoint("qwen3-moe")
    llm = build_llm(ckpt, fused_kernels=fused, attention_backend="triton", use_cuda_graph=True)
    assert (llm.engine.ctx.fused_kernels is not None) == fused
    assert llm.engine.graph_runner is not None, "the engine captured no CUDA graphs"
    got = [o["token_ids"] for o in llm.generate(prompts(), greedy(NEW_TOKENS))]
    want = hf_greedy(prompts(), NEW_TOKENS, model=ckpt)
    assert_tokens_equal(got, want, f"qwen3-moe on the GPU, fused kernels {fused}")
