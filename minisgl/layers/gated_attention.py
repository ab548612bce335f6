"""The full attention of Qwen3-Next and Qwen3.5: Qwen3's (GQA, per-head q/k RMSNorm) with two
changes. RoPE rotates only the first `rotary_dim` dimensions of each head (the rest pass through
unrotated), and the output is gated: q_proj is twice as tall, each head's query followed by its
gate, and each head's attention output is multiplied by sigmoid(gate) before o_proj."""

from __future__ import annotations

import torch

from minisgl.core import get_global_ctx

from .attention import AttentionLayer
from .linear import Linear
from .rotary import RotaryEmbedding


class GatedAttention(AttentionLayer):
    def __init__(
        self,
        layer_id: int,
        hidden: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        eps: float,
        rotary: RotaryEmbedding,
        rotary_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        bias: bool = False,
    ) -> None:
        """`layer_id`: the layer's index in the KV cache; `rotary`: a table `rotary_dim` wide."""
        super().__init__(
            layer_id,
            hidden,
            num_heads,
            num_kv_heads,
            head_dim,
            qk_norm=True,
            eps=eps,
            rotary=rotary,
            dtype=dtype,
            device=device,
            qkv_bias=bias,
            o_bias=bias,
        )
        # q|gate, k, v: the merged projection is one query's height taller
        height = 2 * self._q_size + 2 * self._kv_size
        self.qkv_proj = Linear(hidden, height, bias, dtype, device)
        self._rotary_dim = rotary_dim

    def _attend(self, qkv: torch.Tensor) -> torch.Tensor:
        ctx = get_global_ctx()
        heads, d = self._num_heads, self._head_dim
        q_gate = qkv[:, : 2 * self._q_size].view(-1, heads, 2 * d)
        q, gate = q_gate[..., :d], q_gate[..., d:]
        k, v = (
            t.reshape(-1, self._num_kv_heads, d)
            for t in qkv[:, 2 * self._q_size :].split(self._kv_size, dim=-1)
        )
        q, k = self.q_norm.forward(q), self.k_norm.forward(k)
        r = self._rotary_dim
        q_rot, k_rot = self._rotary.forward(ctx.batch.positions, q[..., :r], k[..., :r])
        q = torch.cat([q_rot, q[..., r:]], dim=-1)
        k = torch.cat([k_rot, k[..., r:]], dim=-1)
        out = ctx.attn_backend.forward(q, k, v, self._layer_id, ctx.batch)
        # gated per head, then flattened: the product is contiguous, so the reshape is a view (a
        # reshape of the strided gate would copy, which emulated graphs replayed wrongly)
        out = out.view(-1, heads, d) * torch.sigmoid(gate)
        return self.o_proj.forward(out.reshape(-1, self._q_size))
