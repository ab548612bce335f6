"""The maths of a Gated DeltaNet layer (Qwen3-Next, Qwen3.5) in plain torch: the short causal
convolution and the gated delta rule, in its recurrent form (one token after another: decode) and
its chunked form (the same numbers from a few matrix products per chunk: prefill).

The delta rule keeps, per value head, a state S [Dk, Dv]: a map from keys to values that each
token corrects a little. With the token's key k, value v, query q (k and q L2-normalized, q also
scaled by 1/sqrt(Dk)), decay g <= 0 (log space) and write strength beta in (0, 1):

    S   <- exp(g) * S                      forget a little of everything first
    S   <- S + k (beta * (v - k^T S))^T    store only what S mispredicts for k (the "delta")
    out  = q^T S

The decay comes first: the correction is measured against the state the token actually reads,
after it has faded. Everything here is float32: the state sums thousands of small updates.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dimension, as the FLA kernels (and transformers) do:
    eps inside the square root, not a max with the norm."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def causal_conv1d(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """One request's depthwise causal convolution over its new tokens, then SiLU.

    Token t sees itself and the K - 1 inputs before it; for the first tokens of a chunk some of
    those came in an earlier chunk, which `window` holds (zeros for a new request).

    Receives: `x` [T, C], the new tokens' channels, any float dtype; `window` [C, K - 1], the
        request's last K - 1 inputs so far (the oldest first); `weight` [C, K], one filter per
        channel, the newest input last.
    Returns: (silu(conv) [T, C] in x's dtype, the window after these tokens [C, K - 1]: the last
        K - 1 inputs of window and x together, so part of the old window when T < K - 1).
    Leaves: nothing changed (a pure function).
    Uses: only torch (`F.conv1d` with groups = C).
    Checked: in chunks (of 4, 1 and 6 tokens, of 2 and 9) equals one convolution over the whole
        sequence; the final window is the last K - 1 inputs, also after a chunk shorter than the
        window; bfloat16 in, bfloat16 out; inside the engine with 3-token prefill chunks.
    """
    seq = torch.cat([window.to(x.dtype), x.t()], dim=1).unsqueeze(0)  # [1, C, K - 1 + T]
    out = F.conv1d(seq, weight.unsqueeze(1).to(x.dtype), groups=weight.shape[0])  # [1, C, T]
    return F.silu(out[0].t()), seq[0, :, seq.shape[2] - window.shape[1] :]


def causal_conv1d_step(x: torch.Tensor, windows: torch.Tensor, weight: torch.Tensor):
    """One decode token for each of B requests at once: `x` [B, C], `windows` [B, C, K - 1].
    Returns (silu(conv) [B, C], the windows after the token [B, C, K - 1])."""
    seq = torch.cat([windows.to(x.dtype), x.unsqueeze(2)], dim=2)  # [B, C, K]
    out = (seq * weight.to(x.dtype)).sum(-1)
    return F.silu(out), seq[:, :, 1:]


def delta_rule_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
):
    """The gated delta rule one token at a time, for N sequences side by side.

    Per token and value head: decay S by exp(g), correct it by k (beta * (v - k^T S))^T, then
    read the output q^T S (the module docstring gives the rule and why the decay comes first).

    Receives: `q`, `k` [N, T, H, Dk] (normalized and scaled as the module docstring says); `v`
        [N, T, H, Dv]; `g`, `beta` [N, T, H]; `state` [N, H, Dk, Dv], the states before the first
        token (zeros for new sequences). All float32.
    Returns: (out [N, T, H, Dv], the states after the last token [N, H, Dk, Dv]).
    Leaves: `state` and every input as they were: the engine writes the returned state back to
        its state pool itself.
    Uses: only torch.
    Checked: outputs and final state equal transformers' recurrence (1, 2 and 7 tokens, nonzero
        initial state); with beta 1 the state maps the token's key to its value (decay first);
        the given state is not written; inside the engine (decode steps).
    """
    outs = []
    for t in range(q.shape[1]):
        state = state * g[:, t].exp()[..., None, None]  # decay first
        predicted = torch.einsum("nhk,nhkv->nhv", k[:, t], state)
        delta = beta[:, t, :, None] * (v[:, t] - predicted)
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        outs.append(torch.einsum("nhk,nhkv->nhv", q[:, t], state))
    return torch.stack(outs, dim=1), state


def delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk: int = 64,
):
    """The gated delta rule over whole chunks of tokens, the same numbers as the recurrence.

    A Python step per chunk instead of per token. Inside a chunk, token i's correction depends
    on the corrections of the tokens before it in the chunk (they changed S before i read it).
    Written out, the corrections u solve a unit lower triangular system (I + A) u = beta * (v -
    decayed k^T S0), A[i, j] = beta_i k_i^T k_j times the decay from j to i (j < i): one
    triangular solve per chunk (the "UT transform"). The outputs are then the read of S0 plus
    causal attention over the chunk's corrections, and S moves to the end of the chunk in one
    product.

    Receives: what `delta_rule_recurrent` receives, and `chunk`, the tokens per chunk (T need
        not be a multiple of it: the last chunk is padded).
    Returns: what `delta_rule_recurrent` returns, equal to it to float32 rounding.
    Leaves: `state` and every input as they were.
    Uses: only torch (`torch.linalg.solve_triangular`).
    Checked: equals transformers' recurrence at 1, 5, 11 and 8 tokens in chunks of 4 and 8 from
        a nonzero state; a single chunk reads the initial state; padding neither decays nor
        writes the state; inside the engine (prefill in 3-token chunks).
    """
    n, length, heads, dk = k.shape
    dv = v.shape[-1]
    pad = (-length) % chunk  # padding tokens: k = v = 0, g = 0 (no decay), beta = 0 (no write)
    q, k, v = (F.pad(x.transpose(1, 2), (0, 0, 0, pad)) for x in (q, k, v))  # [N, H, L, D]
    g, beta = (F.pad(x.transpose(1, 2), (0, pad)) for x in (g, beta))  # [N, H, L]
    shape = (n, heads, -1, chunk)
    q, k, v = (x.reshape(*shape, x.shape[-1]) for x in (q, k, v))  # [N, H, chunks, C, D]
    g, beta = g.reshape(shape), beta.reshape(shape)

    decay = g.cumsum(-1)  # log of the decay from the chunk's start through token i
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    # exp(decay_i - decay_j) for j <= i: what of token j's write survives until token i reads
    between = (decay[..., :, None] - decay[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    k_beta = k * beta[..., None]
    # A below the diagonal; a unitriangular solve reads only that part and takes the diagonal as
    # ones, so neither A's diagonal nor its (zero) upper part needs masking: it solves (I + A) u
    system = k_beta @ k.transpose(-1, -2) * between
    solve = lambda rhs: torch.linalg.solve_triangular(  # noqa: E731
        system, rhs, upper=False, unitriangular=True
    )
    u_from_v = solve(v * beta[..., None])  # the corrections if S0 were zero
    u_from_state = solve(k_beta * decay.exp()[..., None])  # times S0: what S0 already predicts
    attn = (q @ k.transpose(-1, -2)) * between  # causal, decayed, diagonal included
    q_decayed = q * decay.exp()[..., None]
    k_to_end = k * (decay[..., -1:] - decay).exp()[..., None]  # a write's decay to the chunk's end
    chunk_decay = decay[..., -1].exp()[..., None, None]

    out = torch.empty_like(v)
    for c in range(q.shape[2]):
        u = u_from_v[:, :, c] - u_from_state[:, :, c] @ state
        out[:, :, c] = q_decayed[:, :, c] @ state + attn[:, :, c] @ u
        state = state * chunk_decay[:, :, c] + k_to_end[:, :, c].transpose(-1, -2) @ u
    out = out.reshape(n, heads, -1, dv)[:, :, :length].transpose(1, 2)
    return out, state
