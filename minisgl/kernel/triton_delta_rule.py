"""A Gated DeltaNet layer's decode step in two Triton kernels (a GPU's; delta_rule.py's
causal_conv1d_step and delta_rule_recurrent are the reference, and what runs on a CPU).

In plain torch one layer's decode step is some twenty small kernels: gather the batch's windows
and states by slot, shift the window, the convolution and its SiLU, split and L2-normalize q and
k, repeat them for the value heads, the two gates, the decay, the prediction, the correction, the
read, then scatter the windows and states back. At batch 8 on Qwen3-0.6B's shape they made the
hybrid's step 3.3x the all-attention model's (benchmarks/results/2026-12-06-h100-hybrid.txt). Here
they are two launches, each reading and writing the state pool in place at the requests' rows:

* `conv_step_`: per request and block of channels, the short convolution of the new input with
  the row's window, SiLU, and the window shifted by one (its oldest input out, the new one in);
* `delta_rule_step_`: per request, value head and block of value columns, the gates (decay g and
  write strength beta from the projections a and b), q and k normalized, and the delta rule's
  step on the row's state: decay, correct, read. The state's columns are independent (column j's
  prediction, correction and read involve only column j), so a program holds a [Dk, BLOCK_V]
  slice of the state, not the whole [Dk, Dv] map: more programs, fewer registers each.

And, for prefill, `delta_rule_fused_recurrent`: delta_rule_recurrent's contract, the whole
recurrence over a prompt in one launch (one program per sequence, head and block of value
columns, the state slice in registers from the first token to the last). Not used by the engine
yet: benchmarks/hybrid_bench.py times it against the chunked torch form on a GPU, which decides.

The design follows flash-linear-attention's fused_recurrent_gated_delta_rule (one program per
head and block of value columns, the state in registers); that kernel loops over a sequence's
tokens, this one does the single token of a decode step and takes the gates, the normalization
and the pool's rows into the same launch.

Rounding: everything in float32 inside. Where the torch path rounds to the model's dtype (the
convolution's output, beta's sigmoid) the kernels round there too; the convolution's products
are summed in float32 where torch rounds each to the model's dtype, so bfloat16 results agree
within a rounding or two, float32 ones to float32 rounding.
"""

from __future__ import annotations

from typing import Any, Dict

import torch
import triton
import triton.language as tl

from .triton_launch import launch, next_pow2, settings

CONV_DEFAULTS: Dict[str, Any] = {"BLOCK_C": 256, "num_warps": 4}
RULE_DEFAULTS: Dict[str, Any] = {"BLOCK_V": 32, "num_warps": 4}


@triton.jit
def _conv_step_kernel(
    X,  # [B, C]: this step's projected q|k|v, the model's dtype
    WIN,  # the layer's windows, [rows, C, K - 1]
    W,  # [C, K]: one filter per channel (any strides), the newest input last
    ROWS,  # [B]: each request's row of the pool
    OUT,  # [B, C]: silu(convolution), X's dtype
    stride_x,
    stride_win_row,
    stride_win_c,
    stride_w_c,
    stride_w_k,
    stride_out,
    channels,
    K: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """One request's channels [BLOCK_C block] of the convolution step, the window updated in place.

    Every value of the window is read before any is written, and each channel belongs to one
    program: no program reads what another writes."""
    b = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = cols < channels
    row = tl.load(ROWS + b).to(tl.int64)
    x = tl.load(X + b * stride_x + cols, mask=ok, other=0.0)
    win = WIN + row * stride_win_row + cols * stride_win_c
    newest = tl.load(W + cols * stride_w_c + (K - 1) * stride_w_k, mask=ok, other=0.0)
    acc = x.to(tl.float32) * newest.to(tl.float32)
    for j in tl.static_range(K - 1):  # the window's inputs, oldest first
        old = tl.load(win + j, mask=ok, other=0.0)
        w = tl.load(W + cols * stride_w_c + j * stride_w_k, mask=ok, other=0.0)
        acc += old.to(tl.float32) * w.to(tl.float32)
        if j > 0:  # input j moves to position j - 1 (stored after every load of this column)
            tl.store(win + (j - 1), old, mask=ok)
    if K > 1:
        tl.store(win + (K - 2), x.to(WIN.dtype.element_ty), mask=ok)
    conv = acc.to(X.dtype.element_ty).to(tl.float32)  # torch's convolution ends in the dtype
    silu = conv / (1.0 + tl.exp(-conv))
    tl.store(OUT + b * stride_out + cols, silu.to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _delta_rule_step_kernel(
    MIXED,  # [B, 2 * Hk * Dk + Hv * Dv]: the convolved q|k|v
    A,  # [B, Hv]: the decay's input
    BETA_IN,  # [B, Hv]: the write strength's input
    A_LOG,  # [Hv] float32
    DT_BIAS,  # [Hv] float32
    STATE,  # the layer's states, [rows, Hv, Dk, Dv] float32, contiguous per row
    ROWS,  # [B]
    OUT,  # [B, Hv, Dv]
    stride_m,
    stride_a,
    stride_b,
    stride_s_row,
    stride_out,
    scale,
    eps,
    HV: tl.constexpr,
    R: tl.constexpr,  # value heads per key head
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """One request, value head and block of BLOCK_V value columns: the gated delta rule's step."""
    bh = tl.program_id(0)
    b = bh // HV
    h = bh % HV
    hk = h // R
    ks = tl.arange(0, BLOCK_K)
    vs = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    k_ok = ks < DK
    v_ok = vs < DV
    row = tl.load(ROWS + b).to(tl.int64)

    base = MIXED + b * stride_m
    q = tl.load(base + hk * DK + ks, mask=k_ok, other=0.0).to(tl.float32)
    k = tl.load(base + HV // R * DK + hk * DK + ks, mask=k_ok, other=0.0).to(tl.float32)
    v = tl.load(base + 2 * (HV // R) * DK + h * DV + vs, mask=v_ok, other=0.0).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, 0) + eps) * scale  # delta_rule.l2_normalize, eps in the root
    k = k * tl.rsqrt(tl.sum(k * k, 0) + eps)

    # g = -exp(A_log) * softplus(a + dt_bias), softplus as torch's (linear above 20)
    a = tl.load(A + b * stride_a + h).to(tl.float32) + tl.load(DT_BIAS + h)
    softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
    decay = tl.exp(-tl.exp(tl.load(A_LOG + h)) * softplus)
    b_in = tl.load(BETA_IN + b * stride_b + h)
    # the torch path takes the sigmoid in the input's dtype, then float32
    beta = (1.0 / (1.0 + tl.exp(-b_in.to(tl.float32)))).to(b_in.dtype).to(tl.float32)

    at = STATE + row * stride_s_row + h * DK * DV + ks[:, None] * DV + vs[None, :]
    ok = k_ok[:, None] & v_ok[None, :]
    s = tl.load(at, mask=ok, other=0.0) * decay  # decay first
    predicted = tl.sum(k[:, None] * s, 0)  # k^T S: what the state answers for k
    s += k[:, None] * (beta * (v - predicted))[None, :]
    tl.store(at, s, mask=ok)
    out = tl.sum(q[:, None] * s, 0)  # read after the write
    tl.store(OUT + b * stride_out + h * DV + vs, out.to(OUT.dtype.element_ty), mask=v_ok)


def conv_step_(
    x: torch.Tensor,
    windows: torch.Tensor,
    rows: torch.Tensor,
    weight: torch.Tensor,
    tuning: Dict[str, Any] | None = None,
) -> torch.Tensor:
    """What causal_conv1d_step computes for the requests' rows of `windows`, and the shifted
    windows written back in place.

    Receives: `x` [B, C] (unit stride in C); `windows` [rows, C, K - 1] (the pool's, one layer),
        unit stride in its last dimension; `rows` [B] (distinct, except the scratch row of CUDA
        graphs' padding); `weight` [C, K].
    Returns: silu(convolution) [B, C] in x's dtype.
    Leaves: `windows[rows[i]]` the window after the token; the other rows as they were.
    """
    n, channels = x.shape
    kernel = weight.shape[1]
    if windows.shape[1:] != (channels, kernel - 1) or rows.shape != (n,):
        raise ValueError(
            f"conv_step_: x {tuple(x.shape)}, windows {tuple(windows.shape)}, rows "
            f"{tuple(rows.shape)} and weight {tuple(weight.shape)} do not fit: windows must be "
            "[rows, C, K - 1] and rows [B]"
        )
    assert x.stride(1) == 1 and windows.stride(2) == 1
    meta = settings(CONV_DEFAULTS, tuning)
    out = torch.empty_like(x)
    launch(
        _conv_step_kernel,
        (n, triton.cdiv(channels, meta["BLOCK_C"])),
        x,
        windows,
        weight,
        rows,
        out,
        x.stride(0),
        windows.stride(0),
        windows.stride(1),
        weight.stride(0),
        weight.stride(1),
        out.stride(0),
        channels,
        K=kernel,
        **meta,
    )
    return out


def delta_rule_step_(
    mixed: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    states: torch.Tensor,
    rows: torch.Tensor,
    k_heads: int,
    eps: float = 1e-6,
    tuning: Dict[str, Any] | None = None,
) -> torch.Tensor:
    """One decode token of the gated delta rule for each request, its state updated in place.

    What GatedDeltaNet's torch path computes from the convolved q|k|v: q and k L2-normalized
    (q also scaled by 1/sqrt(Dk)) and repeated for their value heads, g = -exp(A_log) *
    softplus(a + dt_bias), beta = sigmoid(b), then delta_rule_recurrent for one token.

    Receives: `mixed` [B, 2 * Hk * Dk + Hv * Dv] (unit stride); `a`, `b` [B, Hv]; `a_log`,
        `dt_bias` [Hv] float32; `states` [rows, Hv, Dk, Dv] float32, each row contiguous (the
        pool's, one layer); `rows` [B]; `k_heads` Hk.
    Returns: the outputs [B, Hv, Dv] in mixed's dtype.
    Leaves: `states[rows[i]]` the state after the token; the other rows as they were.
    """
    n = mixed.shape[0]
    _, heads, dk, dv = states.shape
    if heads % k_heads or mixed.shape[1] != 2 * k_heads * dk + heads * dv:
        raise ValueError(
            f"delta_rule_step_: mixed {tuple(mixed.shape)} is not q|k|v of {k_heads} key heads "
            f"of {dk} and {heads} value heads of {dv} (states {tuple(states.shape)})"
        )
    if states.dtype != torch.float32 or not states[0].is_contiguous():
        raise ValueError("delta_rule_step_: the states must be float32, each row contiguous")
    assert mixed.stride(1) == 1 and a.stride(1) == 1 and b.stride(1) == 1
    meta = settings(RULE_DEFAULTS, tuning)
    meta["BLOCK_V"] = min(meta["BLOCK_V"], next_pow2(dv))
    out = torch.empty(n, heads, dv, dtype=mixed.dtype, device=mixed.device)
    launch(
        _delta_rule_step_kernel,
        (n * heads, triton.cdiv(dv, meta["BLOCK_V"])),
        mixed,
        a,
        b,
        a_log,
        dt_bias,
        states,
        rows,
        out,
        mixed.stride(0),
        a.stride(0),
        b.stride(0),
        states.stride(0),
        out.stride(0),
        dk**-0.5,
        eps,
        HV=heads,
        R=heads // k_heads,
        DK=dk,
        DV=dv,
        BLOCK_K=next_pow2(dk),
        **meta,
    )
    return out


@triton.jit
def _fused_recurrent_kernel(
    Q,  # [N, T, H, DK] float32, contiguous
    K,
    V,  # [N, T, H, DV]
    G,  # [N, T, H]
    BETA,
    S0,  # [N, H, DK, DV]: read only
    OUT,  # [N, T, H, DV]
    S_OUT,  # [N, H, DK, DV]
    T,
    H: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """One sequence, head and block of value columns: every token of the recurrence in order."""
    nh = tl.program_id(0)
    n = nh // H
    h = nh % H
    ks = tl.arange(0, BLOCK_K)
    vs = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    k_ok = ks < DK
    v_ok = vs < DV
    ok = k_ok[:, None] & v_ok[None, :]
    tile = ks[:, None] * DV + vs[None, :]
    s = tl.load(S0 + nh * DK * DV + tile, mask=ok, other=0.0)
    for t in range(T):
        tok = (n * T + t) * H + h  # this token's (sequence, position, head) index
        q = tl.load(Q + tok * DK + ks, mask=k_ok, other=0.0)
        k = tl.load(K + tok * DK + ks, mask=k_ok, other=0.0)
        v = tl.load(V + tok * DV + vs, mask=v_ok, other=0.0)
        s = s * tl.exp(tl.load(G + tok))  # decay first
        predicted = tl.sum(k[:, None] * s, 0)
        s += k[:, None] * (tl.load(BETA + tok) * (v - predicted))[None, :]
        tl.store(OUT + tok * DV + vs, tl.sum(q[:, None] * s, 0), mask=v_ok)
    tl.store(S_OUT + nh * DK * DV + tile, s, mask=ok)


def delta_rule_fused_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    tuning: Dict[str, Any] | None = None,
):
    """delta_rule_recurrent in one launch: the same receives, returns and leaves (float32 inputs
    of [N, T, H, Dk], [N, T, H, Dv], [N, T, H] and a state [N, H, Dk, Dv] left as it was)."""
    n, length, heads, dk = k.shape
    dv = v.shape[-1]
    tensors = (q, k, v, g, beta, state)
    if any(t.dtype != torch.float32 for t in tensors):
        raise ValueError("delta_rule_fused_recurrent: every input must be float32")
    if q.shape != k.shape or v.shape[:3] != k.shape[:3] or g.shape != k.shape[:3]:
        raise ValueError(
            f"delta_rule_fused_recurrent: q {tuple(q.shape)}, k {tuple(k.shape)}, v "
            f"{tuple(v.shape)}, g {tuple(g.shape)} do not share [N, T, H]"
        )
    if beta.shape != g.shape or state.shape != (n, heads, dk, dv):
        raise ValueError(
            f"delta_rule_fused_recurrent: beta {tuple(beta.shape)} must be [N, T, H] and state "
            f"{tuple(state.shape)} [N, H, Dk, Dv] = {(n, heads, dk, dv)}"
        )
    q, k, v, g, beta, state = (t.contiguous() for t in tensors)
    meta = settings(RULE_DEFAULTS, tuning)
    meta["BLOCK_V"] = min(meta["BLOCK_V"], next_pow2(dv))
    out = torch.empty_like(v)
    final = torch.empty_like(state)
    launch(
        _fused_recurrent_kernel,
        (n * heads, triton.cdiv(dv, meta["BLOCK_V"])),
        q,
        k,
        v,
        g,
        beta,
        state,
        out,
        final,
        length,
        H=heads,
        DK=dk,
        DV=dv,
        BLOCK_K=next_pow2(dk),
        **meta,
    )
    return out, final
