"""The Gated DeltaNet layer of Qwen3-Next and Qwen3.5: linear attention with a fixed-size state.

Per token: project the input to query, key and value channels (through a short causal
convolution), a gate z, a write strength b and a decay input a; run the gated delta rule
(minisgl/kernel/delta_rule.py) from the request's state; normalize each head's output and gate it
with silu(z); project back. The request's convolution window and delta-rule state live in the
engine's StatePool (minisgl/kvcache/state_pool.py), in its slot's row.

A prefill step runs each request's new tokens through the chunked delta rule from its row (zeros
when the step is the request's first: the model zeroes those rows before its layers run,
state_pool.reset_new_rows); a decode step runs one recurrence step for the whole batch at once,
gathering and scattering rows by slot (one launch per op, no Python loop: a CUDA graph can
capture it); on a GPU engine with fused kernels the decode step is two Triton launches that
update the rows in place, and a prefill chunk's recurrence one launch per request in place of the
chunked torch form (minisgl/kernel/triton_delta_rule.py).

The two families differ only in how the projections are stored: Qwen3.5 has in_proj_qkv, in_proj_z,
in_proj_b and in_proj_a; Qwen3-Next has in_proj_qkvz and in_proj_ba, grouped by key head (each key
head's query, key, its value heads' values, their z; then b and a likewise), which `_project`
reorders into Qwen3.5's layout.
"""

from __future__ import annotations

from typing import List, Tuple

import torch
import torch.nn.functional as F

from minisgl.core import get_global_ctx
from minisgl.kernel.delta_rule import (
    causal_conv1d,
    causal_conv1d_step,
    delta_rule_chunked,
    delta_rule_recurrent,
    l2_normalize,
)
from minisgl.kernel.dispatch import fused_for
from minisgl.kvcache.state_pool import StatePool
from minisgl.layers import BaseOP, Linear

from .hybrid_config import HybridConfig


class Conv1dWeight(BaseOP):
    """The depthwise convolution's weight, [channels, 1, kernel] as checkpoints store it."""

    def __init__(self, channels: int, kernel: int, dtype: torch.dtype, device: torch.device):
        self.weight = torch.empty(channels, 1, kernel, dtype=dtype, device=device)


class GatedNorm(BaseOP):
    """RMSNorm of each head's output (weight w, not 1 + w), then times silu(gate), as transformers'
    RMSNormGated: the norm in float32, cast to the model's dtype before the weight."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        self.weight = torch.empty(size, dtype=dtype, device=device)
        self._eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self._eps)).to(x.dtype)
        return (self.weight * normed * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(BaseOP):
    def __init__(
        self,
        hybrid: HybridConfig,
        family: str,
        hidden: int,
        eps: float,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        h = hybrid
        self._hk, self._hv, self._dk, self._dv = (
            h.linear_k_heads,
            h.linear_v_heads,
            h.linear_k_dim,
            h.linear_v_dim,
        )
        self._key_dim, self._value_dim = self._hk * self._dk, self._hv * self._dv
        self._family = family
        if family == "qwen3_next":
            self.in_proj_qkvz = Linear(
                hidden, 2 * self._key_dim + 2 * self._value_dim, False, dtype, device
            )
            self.in_proj_ba = Linear(hidden, 2 * self._hv, False, dtype, device)
        else:
            self.in_proj_qkv = Linear(
                hidden, 2 * self._key_dim + self._value_dim, False, dtype, device
            )
            self.in_proj_z = Linear(hidden, self._value_dim, False, dtype, device)
            self.in_proj_b = Linear(hidden, self._hv, False, dtype, device)
            self.in_proj_a = Linear(hidden, self._hv, False, dtype, device)
        self.conv1d = Conv1dWeight(h.conv_channels, h.conv_kernel, dtype, device)
        # the decay's parameters stay float32 whatever the model's dtype: exp(A_log) of a
        # float16 value can overflow, and the decay compounds over the whole sequence
        self.A_log = torch.empty(self._hv, dtype=torch.float32, device=device)
        self.dt_bias = torch.empty(self._hv, dtype=torch.float32, device=device)
        self.norm = GatedNorm(self._dv, eps, dtype, device)
        self.out_proj = Linear(self._value_dim, hidden, False, dtype, device)
        self._pool: StatePool | None = None
        self._slot_layer = -1  # this layer's index in the pool

    def attach_state(self, pool: StatePool, index: int) -> None:
        self._pool, self._slot_layer = pool, index

    def _project(self, x: torch.Tensor):
        """(qkv [T, 2 * key_dim + value_dim], z [T, Hv, Dv], b [T, Hv], a [T, Hv])."""
        t = x.shape[0]
        if self._family != "qwen3_next":
            qkv = self.in_proj_qkv.forward(x)
            z = self.in_proj_z.forward(x).view(t, self._hv, self._dv)
            return qkv, z, self.in_proj_b.forward(x), self.in_proj_a.forward(x)
        r, dk = self._hv // self._hk, self._dk
        grouped = self.in_proj_qkvz.forward(x).view(t, self._hk, 2 * dk + 2 * r * self._dv)
        q, k, v, z = grouped.split([dk, dk, r * self._dv, r * self._dv], dim=-1)
        qkv = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=-1)
        b, a = self.in_proj_ba.forward(x).view(t, self._hk, 2 * r).split([r, r], dim=-1)
        return qkv, z.reshape(t, self._hv, self._dv), b.reshape(t, -1), a.reshape(t, -1)

    def _rule_inputs(self, qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor):
        """The convolved q|k|v, split by head and prepared for the delta rule (float32): q and k
        L2-normalized, each key head repeated for its value heads, q scaled by 1/sqrt(Dk); the log
        decay g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b)."""
        shape = qkv.shape[:-1]
        q, k, v = qkv.split([self._key_dim, self._key_dim, self._value_dim], dim=-1)
        r = self._hv // self._hk
        q, k = (
            l2_normalize(t.reshape(*shape, self._hk, self._dk).float()).repeat_interleave(r, -2)
            for t in (q, k)
        )
        v = v.reshape(*shape, self._hv, self._dv).float()
        g = -self.A_log.exp() * F.softplus(a.float() + self.dt_bias)
        return q * self._dk**-0.5, k, v, g, b.sigmoid().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = self._pool
        if pool is None:
            raise RuntimeError(
                "a Gated DeltaNet layer runs with the engine's state pool: attach_state() first"
            )
        batch = get_global_ctx().batch
        meta = batch.attn_metadata
        if meta is None or meta.rows is None:
            raise RuntimeError(
                "a hybrid model needs the batch's slot rows (attn_metadata.rows) to find each "
                "request's state"
            )
        qkv, z, b, a = self._project(x)
        conv, rec = pool.conv[self._slot_layer], pool.recurrent[self._slot_layer]
        weight = self.conv1d.weight[:, 0]
        if batch.is_decode and fused_for(x) is not None:  # two Triton launches, rows in place
            out = self._decode_fused(qkv, b, a, conv, rec, meta.rows, weight)
            out = self.norm.forward(out, z)
            return self.out_proj.forward(out.reshape(x.shape[0], self._value_dim))
        windows, states = conv.index_select(0, meta.rows), rec.index_select(0, meta.rows)
        if batch.is_decode:  # one token per request: the whole batch in one recurrence step
            mixed, windows = causal_conv1d_step(qkv, windows, weight)
            q, k, v, g, beta = (t.unsqueeze(1) for t in self._rule_inputs(mixed, b, a))
            out, states = delta_rule_recurrent(q, k, v, g, beta, states)
            out = out[:, 0]
        else:
            out, windows, states = self._prefill(qkv, b, a, windows, states, meta, weight)
        conv.index_copy_(0, meta.rows, windows.to(conv.dtype))
        rec.index_copy_(0, meta.rows, states)
        out = self.norm.forward(out.to(x.dtype), z)
        return self.out_proj.forward(out.reshape(x.shape[0], self._value_dim))

    def _decode_fused(self, qkv, b, a, conv, rec, rows, weight):
        """The decode step's convolution and delta rule in Triton (minisgl/kernel/
        triton_delta_rule.py): what the torch path computes, the rows updated in place."""
        from minisgl.kernel.triton_delta_rule import conv_step_, delta_rule_step_

        mixed = conv_step_(qkv, conv, rows, weight)
        return delta_rule_step_(
            mixed, a.contiguous(), b.contiguous(), self.A_log, self.dt_bias, rec, rows, self._hk
        )

    def _prefill(self, qkv, b, a, windows, states, meta, weight):
        """Each request's new tokens through the convolution and the chunked delta rule, from its
        row (zeros for a request's first step: the model zeroed those rows before the layers,
        state_pool.reset_new_rows)."""
        cu = host_lengths(meta)[0]
        # On a GPU with the engine's fused kernels, a chunk's recurrence in one Triton launch:
        # 2.0-2.7x the chunked torch form's speed over 512-8192 tokens on an H100 (16 heads of
        # 128; benchmarks/hybrid_bench.py), the same function of the same inputs
        rule = delta_rule_chunked
        if fused_for(qkv) is not None:
            from minisgl.kernel.triton_delta_rule import delta_rule_fused_recurrent as rule
        outs: List[torch.Tensor] = []
        new_windows: List[torch.Tensor] = []
        new_states: List[torch.Tensor] = []
        for i in range(len(cu) - 1):
            start, end = cu[i], cu[i + 1]
            window, state = windows[i], states[i]
            mixed, window = causal_conv1d(qkv[start:end], window, weight)
            inputs = self._rule_inputs(mixed, b[start:end], a[start:end])
            q, k, v, g, beta = (t.unsqueeze(0) for t in inputs)
            out, state = rule(q, k, v, g, beta, state.unsqueeze(0))
            outs.append(out[0])
            new_windows.append(window)
            new_states.append(state[0])
        return torch.cat(outs), torch.stack(new_windows), torch.stack(new_states)


def host_lengths(meta) -> Tuple[List[int], List[int]]:
    """(cu_seqlens_q, cache_seqlens) as host lists: the metadata's host copies when it carries
    them (`.tolist()` of a GPU tensor would wait for the GPU)."""
    cu = meta.cu_seqlens_q_host
    lens = meta.cache_seqlens_host
    return (
        cu if cu is not None else meta.cu_seqlens_q.tolist(),
        lens if lens is not None else meta.cache_seqlens.tolist(),
    )
