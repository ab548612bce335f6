"""The Gated DeltaNet kernels in Triton (minisgl/kernel/triton_delta_rule.py) against the torch
path they replace on a GPU: the fused recurrence over a prompt (delta_rule_chunked's place), and
the decode step (causal_conv1d_step, then the gates, the normalization and one step of
delta_rule_recurrent) (minisgl/kernel/delta_rule.py, minisgl/models/gated_deltanet.py).

On the CPU in Triton's interpreter (TRITON_INTERPRET=1, set by conftest), compiled with
`--device cuda`. Each case reads and writes a pool of more rows than requests, at rows out of
order: the requests' rows must hold the torch path's windows and states afterwards, the others
be untouched. Tolerances: float32 to float32 rounding (1e-5; the kernel sums in another order);
bfloat16 inputs against the float32 computation of the same inputs, 2e-2 of the output's scale
(the torch path rounds the convolution's products to bfloat16, the kernel sums them in float32;
the interpreter truncates where a GPU rounds).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from extras import module_needs_extra
from helpers import REPO, test_device
from minisgl.kernel.delta_rule import causal_conv1d_step, delta_rule_recurrent, l2_normalize

pytestmark = module_needs_extra("triton")  # before the imports that need it

from minisgl.kernel.triton_delta_rule import (  # noqa: E402
    conv_step_,
    delta_rule_fused_recurrent,
    delta_rule_step_,
)

ROWS = [3, 0, 5]  # three requests of a pool of 7 rows, not in order
POOL_ROWS = 7
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def rand(*shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """`got` within the dtype's tolerance of `want`, relative to want's largest value."""
    got, want = got.float().cpu(), want.float().cpu()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}"
    scale = want.abs().max().clamp_min(1e-6)
    err = ((got - want).abs().max() / scale).item()
    tol = TOLERANCE[dtype]
    assert err <= tol, f"{what}: {err:.2e} of the scale off (tolerance {tol})"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("channels,kernel", [(24, 4), (300, 4), (10, 3)])
def test_the_convolution_step_equals_the_torch_step_and_shifts_the_windows_in_place(
    channels, kernel, dtype
):
    # 300 channels: two blocks of 256, the second partly masked; a 3-wide convolution
    dev = test_device()
    x = rand(len(ROWS), channels, seed=1).to(dev, dtype)
    pool = rand(POOL_ROWS, channels, kernel - 1, seed=2).to(dev, dtype)
    weight = rand(channels, 1, kernel, seed=3, scale=0.5).to(dev, dtype)[:, 0]  # a strided view
    rows = torch.tensor(ROWS, device=dev)
    before = pool.clone()
    want, want_windows = causal_conv1d_step(x.float(), pool[rows].float(), weight.float())
    got = conv_step_(x, pool, rows, weight)
    assert got.dtype == dtype
    close(got, want, dtype, "silu(convolution)")
    # the window is shifted, not recomputed: its values move exactly, the new input comes last
    torch.testing.assert_close(pool[rows].float(), want_windows, atol=0, rtol=0)
    others = [r for r in range(POOL_ROWS) if r not in ROWS]
    assert torch.equal(pool[others], before[others]), "a row no request owns was written"


def torch_step(mixed, a, b, a_log, dt_bias, states, hk, dk, hv, dv):
    """The torch path of GatedDeltaNet for one decode token (its _rule_inputs, then
    delta_rule_recurrent), on the requests' states [B, Hv, Dk, Dv]."""
    key = hk * dk
    q, k, v = mixed.float().split([key, key, hv * dv], dim=-1)
    q, k = (l2_normalize(t.reshape(-1, hk, dk)).repeat_interleave(hv // hk, -2) for t in (q, k))
    g = -a_log.exp() * F.softplus(a.float() + dt_bias)
    beta = b.sigmoid().float()
    inputs = (q * dk**-0.5, k, v.reshape(-1, hv, dv), g, beta)
    out, after = delta_rule_recurrent(*(t.unsqueeze(1) for t in inputs), states)
    return out[:, 0], after


# (key heads, value heads, Dk, Dv): GQA 1 and 2, head sizes that are not powers of two, and Dv of
# two blocks of value columns (48: 32 + 16 masked)
HEADS = [(2, 2, 8, 16), (2, 4, 8, 12), (1, 2, 6, 48)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("hk,hv,dk,dv", HEADS)
def test_the_delta_rule_step_equals_the_torch_path_and_writes_the_states_in_place(
    hk, hv, dk, dv, dtype
):
    dev = test_device()
    n = len(ROWS)
    mixed = rand(n, 2 * hk * dk + hv * dv, seed=4).to(dev, dtype)
    a, b = rand(n, hv, seed=5).to(dev, dtype), rand(n, hv, seed=6).to(dev, dtype)
    a_log, dt_bias = rand(hv, seed=7, scale=0.5).to(dev), rand(hv, seed=8).to(dev)
    # softplus of a large input is the input (exp of it overflows float32): a slow decay of
    # 1 - 4.5e-3, where an overflow would give 0
    a[0, 0], a_log[0] = 100.0, -10.0
    pool = rand(POOL_ROWS, hv, dk, dv, seed=9).to(dev)
    rows = torch.tensor(ROWS, device=dev)
    before = pool.clone()
    want, want_states = torch_step(mixed, a, b, a_log, dt_bias, pool[rows], hk, dk, hv, dv)
    got = delta_rule_step_(mixed, a, b, a_log, dt_bias, pool, rows, hk)
    assert got.dtype == dtype and got.shape == (n, hv, dv)
    close(got, want, dtype, "the outputs")
    for i, r in enumerate(ROWS):  # float32, but beta is rounded to the inputs' dtype first
        close(pool[r], want_states[i], dtype, f"the state in row {r} (request {i})")
    others = [r for r in range(POOL_ROWS) if r not in ROWS]
    assert torch.equal(pool[others], before[others]), "a row no request owns was written"


def test_a_zero_state_and_beta_one_store_the_value_under_the_key():
    # one head, Dk = Dv = 4: from a zero state with beta = 1 the state maps k to v exactly, and the
    # output is q^T k v, whatever the decay (a zero state has nothing to fade)
    dev = test_device()
    k, q, v = rand(4, seed=10), rand(4, seed=11), rand(4, seed=12)
    mixed = torch.cat([q, k, v])[None].to(dev)
    big = torch.full((1, 1), 30.0, device=dev)  # sigmoid(30) = 1 in float32
    pool = torch.zeros(2, 1, 4, 4, device=dev)
    one = torch.ones(1, device=dev)
    out = delta_rule_step_(mixed, big, big, one, one, pool, torch.tensor([1], device=dev), 1)
    kn, qn = l2_normalize(k), l2_normalize(q) * 0.5
    torch.testing.assert_close(pool[1, 0].cpu(), torch.outer(kn, v), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out[0, 0].cpu(), (qn @ kn) * v, atol=1e-6, rtol=1e-5)
    assert torch.equal(pool[0].cpu(), torch.zeros(1, 4, 4)), "row 0 was written"


def test_shapes_that_do_not_fit_are_refused_naming_them():
    pool = torch.zeros(2, 4, 8, 16)
    with pytest.raises(ValueError, match="2 key heads of 8 and 4 value heads of 16"):
        delta_rule_step_(
            torch.zeros(1, 10), torch.zeros(1, 4), torch.zeros(1, 4), torch.zeros(4),
            torch.zeros(4), pool, torch.zeros(1, dtype=torch.long), 2,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"windows must be \[rows, C, K - 1\]"):
        conv_step_(torch.zeros(1, 6), torch.zeros(2, 6, 2), torch.zeros(1, dtype=torch.long),
                   torch.zeros(6, 4))  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [None, 5], ids=["whole-prompts", "chunks-of-5"])
@pytest.mark.parametrize("fused", [True, False], ids=["triton", "torch"])
@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_next-moe"])
def test_a_hybrid_engine_on_the_gpu_gives_transformers_tokens_with_cuda_graphs(name, fused, chunk):
    # Decode steps replay CUDA graphs, with the Triton step captured (fused) or the torch path;
    # prefill runs the fused recurrence (fused) or the chunked torch form, over whole prompts or
    # chunks of 5 tokens (the state carried from chunk to chunk); two slots for four requests, so
    # rows are reused and the batch's rows are not 0, 1, ...
    from helpers import assert_tokens_equal, build_llm, greedy, hf_greedy
    from hybrid_checkpoints import hybrid_checkpoint
    from test_hybrid import NEW_TOKENS, prompts

    if test_device() != "cuda":
        pytest.skip("needs --device cuda")
    ckpt = hybrid_checkpoint(name)
    llm = build_llm(
        ckpt, cache_type="naive", fused_kernels=fused, attention_backend="triton",
        use_cuda_graph=True, max_running_req=2,
        **({"max_extend_tokens": chunk} if chunk else {}),
    )  # fmt: skip
    assert (llm.engine.ctx.fused_kernels is not None) == fused
    got = [o["token_ids"] for o in llm.generate(prompts(), greedy(NEW_TOKENS))]
    assert llm.engine.graph_runner.replays > 0, "no decode step ran from a graph"
    want = hf_greedy(prompts(), NEW_TOKENS, model=ckpt)
    assert_tokens_equal(got, want, f"{name} on the GPU, Triton kernels {fused}, chunks {chunk}")
    llm.shutdown()


# (N, T, H, Dk, Dv): one token, a prompt past one value block (Dv 48), sizes not powers of two
PROMPTS = [(1, 1, 2, 8, 16), (2, 13, 3, 6, 48), (1, 40, 2, 16, 16)]


@pytest.mark.parametrize("n,length,heads,dk,dv", PROMPTS)
def test_the_fused_recurrence_over_a_prompt_equals_the_torch_recurrence(n, length, heads, dk, dv):
    dev = test_device()
    g = torch.Generator().manual_seed(length)
    q = l2_normalize(torch.randn(n, length, heads, dk, generator=g)) * dk**-0.5
    k = l2_normalize(torch.randn(n, length, heads, dk, generator=g))
    v = torch.randn(n, length, heads, dv, generator=g)
    decay = -torch.rand(n, length, heads, generator=g)
    beta = torch.rand(n, length, heads, generator=g)
    state = torch.randn(n, heads, dk, dv, generator=g)
    inputs = [t.to(dev) for t in (q, k, v, decay, beta, state)]
    before = inputs[-1].clone()
    want_out, want_state = delta_rule_recurrent(*inputs)
    out, final = delta_rule_fused_recurrent(*inputs)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final, want_state, atol=1e-5, rtol=1e-5)
    assert torch.equal(inputs[-1], before), "the given state was written"


def test_the_fused_recurrence_refuses_inputs_that_are_not_float32():
    x = torch.zeros(1, 2, 1, 4)
    with pytest.raises(ValueError, match="float32"):
        delta_rule_fused_recurrent(
            x.bfloat16(), x, x, x[..., 0], x[..., 0], torch.zeros(1, 1, 4, 4)
        )


COMPILE = """
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile

from minisgl.kernel import triton_delta_rule as kernels

strides = lambda *names: {n: "i32" for n in names}
cases = [
    (
        kernels._conv_step_kernel,
        dict(X="*bf16", WIN="*bf16", W="*bf16", ROWS="*i64", OUT="*bf16")
        | strides("stride_x", "stride_win_row", "stride_win_c", "stride_w_c", "stride_w_k")
        | strides("stride_out", "channels"),
        dict(K=4, BLOCK_C=256),
    ),
    (
        kernels._delta_rule_step_kernel,
        dict(MIXED="*bf16", A="*bf16", BETA_IN="*bf16", A_LOG="*fp32", DT_BIAS="*fp32")
        | dict(STATE="*fp32", ROWS="*i64", OUT="*bf16")
        | strides("stride_m", "stride_a", "stride_b", "stride_s_row", "stride_out")
        | dict(scale="fp32", eps="fp32"),
        dict(HV=16, R=2, DK=128, DV=128, BLOCK_K=128, BLOCK_V=32),
    ),
    (
        kernels._fused_recurrent_kernel,
        {name: "*fp32" for name in ("Q", "K", "V", "G", "BETA", "S0", "OUT", "S_OUT")}
        | dict(T="i32"),
        dict(H=16, DK=128, DV=128, BLOCK_K=128, BLOCK_V=32),
    ),
]
for kernel, signature, constants in cases:
    signature |= {name: "constexpr" for name in constants}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    compiled = compile(source, target=GPUTarget("cuda", 90, 32))
    assert compiled.asm.get("cubin"), f"{kernel.fn.__name__}: no cubin for sm_90"
"""


def test_the_kernels_compile_for_a_hopper_gpu_without_one():
    # The interpreter runs the kernels' Python, not Triton's compiler: a typing mistake (a
    # mixed-dtype where, a cast to a runtime dtype) passes it and fails only on a GPU. Compiling
    # for sm_90 needs no GPU (the bundled LLVM and ptxas make the cubin), but a process of its own
    # without TRITON_INTERPRET, which @triton.jit reads at import.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, textwrap.shorten(done.stderr[-3000:], 3000)
