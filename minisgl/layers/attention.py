from __future__ import annotations

import torch

from minisgl.core import get_global_ctx
from minisgl.kernel.dispatch import fused_for

from .base import BaseOP
from .linear import Linear
from .norm import RMSNorm
from .rotary import RotaryEmbedding


class AttentionLayer(BaseOP):
    """Self-attention with grouped-query heads. q/k/v come out of one merged projection; Qwen3 then
    RMS-normalizes each q and k head (Llama does not); RoPE rotates them; the attention backend
    stores k/v in the paged KV cache and attends over everything cached for each request. On a GPU
    one fused kernel does the norms, RoPE and the store, and the backend only attends."""

    def __init__(
        self,
        layer_id: int,
        hidden: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        qk_norm: bool,
        eps: float,
        rotary: RotaryEmbedding,
        dtype: torch.dtype,
        device: torch.device,
        qkv_bias: bool = False,
        o_bias: bool = False,
    ) -> None:
        self._layer_id = layer_id
        self._num_heads, self._num_kv_heads, self._head_dim = num_heads, num_kv_heads, head_dim
        self._q_size, self._kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.qkv_proj = Linear(hidden, self._q_size + 2 * self._kv_size, qkv_bias, dtype, device)
        self.o_proj = Linear(self._q_size, hidden, o_bias, dtype, device)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps, dtype, device)
            self.k_norm = RMSNorm(head_dim, eps, dtype, device)
        self._qk_norm = qk_norm
        self._eps = eps
        self._rotary = rotary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._attend(self.qkv_proj.forward(x))

    def forward_normed(self, norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor | None):
        """(attention(norm(x + residual)), x + residual), the norm inside the q|k|v product
        (RMSNorm.forward_into)."""
        qkv, residual = norm.forward_into(self.qkv_proj, x, residual)
        return self._attend(qkv), residual

    def _attend(self, qkv: torch.Tensor) -> torch.Tensor:
        ctx = get_global_ctx()
        q = qkv[:, : self._q_size].reshape(-1, self._num_heads, self._head_dim)  # a view into qkv
        fused = fused_for(q)
        if fused is not None:  # norms, RoPE and the K/V store in one kernel (q in place in qkv)
            rot, batch, kv = self._rotary, ctx.batch, ctx.kv_cache
            fused.qk_norm_rope_store_(
                qkv,
                self._num_heads,
                self._num_kv_heads,
                self.q_norm.weight if self._qk_norm else None,
                self.k_norm.weight if self._qk_norm else None,
                rot._cos,
                rot._sin,
                batch.positions,
                self._eps,
                kv.k_cache(self._layer_id),
                kv.v_cache(self._layer_id),
                batch.out_loc,
            )
            out = ctx.attn_backend.attend(q, self._layer_id, batch)
        else:
            k, v = (
                t.reshape(-1, self._num_kv_heads, self._head_dim)
                for t in qkv[:, self._q_size :].split(self._kv_size, dim=-1)
            )
            if self._qk_norm:
                q, k = self.q_norm.forward(q), self.k_norm.forward(k)
            q, k = self._rotary.forward(ctx.batch.positions, q, k)
            out = ctx.attn_backend.forward(q, k, v, self._layer_id, ctx.batch)
        return self.o_proj.forward(out.reshape(-1, self._q_size))
