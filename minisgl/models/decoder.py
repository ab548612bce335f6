"""The decoder-only transformer shared by Qwen3, Llama and Qwen2: embeddings, N pre-norm blocks of
(attention, SwiGLU MLP), a final norm and the LM head. The families differ only in switches: Qwen3
normalizes q and k per head, Qwen2 has biases on q, k and v; `attention_bias` puts biases on q, k, v
and o, `mlp_bias` on the MLP's three projections. Qwen3-MoE is Qwen3 whose sparse layers have a
router and experts in place of the dense MLP (moe.py)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import ContextManager

import torch

from minisgl.core import get_global_ctx
from minisgl.kernel.dispatch import silu_and_mul
from minisgl.layers import (
    AttentionLayer,
    BaseOP,
    Linear,
    LMHead,
    OPList,
    RMSNorm,
    RotaryEmbedding,
    VocabEmbedding,
)

from .config import ModelConfig
from .moe import SparseMoeBlock


class MLP(BaseOP):
    def __init__(
        self, hidden: int, intermediate: int, bias: bool, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias, dtype, device)
        self.down_proj = Linear(intermediate, hidden, bias, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj.forward(silu_and_mul(self.gate_up_proj.forward(x)))

    def forward_normed(self, norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor | None):
        """(MLP(norm(x + residual)), x + residual), the norm and the SiLU·mul inside the gate|up
        product (RMSNorm.forward_into)."""
        h, residual = norm.forward_into(self.gate_up_proj, x, residual, gated=True)
        return self.down_proj.forward(h), residual


class DecoderLayer(BaseOP):
    def __init__(
        self,
        cfg: ModelConfig,
        layer_id: int,
        rotary: RotaryEmbedding,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        eps = cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps, dtype, device)
        self.self_attn = AttentionLayer(
            layer_id,
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            qk_norm=cfg.architecture in ("qwen3", "qwen3_moe"),
            eps=eps,
            rotary=rotary,
            dtype=dtype,
            device=device,
            qkv_bias=cfg.attention_bias or cfg.architecture == "qwen2",
            o_bias=cfg.attention_bias,
        )
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps, dtype, device)
        if cfg.moe is not None and layer_id in cfg.moe.sparse_layers:
            self.mlp = SparseMoeBlock(cfg.moe, layer_id, cfg.hidden_size, dtype, device)
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, dtype, device)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None):
        # each norm is handed the projection that reads it: forward_fused, then the projection,
        # except one row on a GPU, where the two are one kernel (chapter 19)
        x, residual = self.self_attn.forward_normed(self.input_layernorm, x, residual)
        if isinstance(self.mlp, MLP):
            return self.mlp.forward_normed(self.post_attention_layernorm, x, residual)
        x, residual = self.post_attention_layernorm.forward_fused(x, residual)
        return self.mlp.forward(x), residual


class DecoderBody(BaseOP):
    # What a family of models changes in the body (models/hybrid.py): the layer at each position
    # of the stack, and how many dimensions of a head the rotary table turns
    layer_class = DecoderLayer

    @staticmethod
    def rotary_dim(cfg: ModelConfig) -> int:
        return cfg.head_dim

    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        max_positions: int | None = None,
    ) -> None:
        # The rotary table is computed for real even when the weights live on the meta device. Its
        # length: `max_positions` (the engine's context length), else the model's limit.
        rope_device = torch.device("cpu") if device.type == "meta" else device
        if max_positions is None:
            max_positions = cfg.max_position_embeddings
        self._rotary = RotaryEmbedding(
            self.rotary_dim(cfg), max_positions, cfg.rope_theta, rope_device, cfg.rope_scaling
        )
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, dtype, device)
        self.layers = OPList(
            [self.layer_class(cfg, i, self._rotary, dtype, device) for i in range(cfg.num_layers)]
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)

    def _rows_for_step(self, x: torch.Tensor) -> ContextManager[None]:
        """On a CPU, RoPE's rows looked up once for all layers. A GPU's fused kernel reads the
        table itself (and a CUDA graph must not reuse a tensor made outside it)."""
        if x.is_cuda:
            return nullcontext()
        return self._rotary.rows_held(get_global_ctx().batch.positions, x.dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens.forward(input_ids), None
        with self._rows_for_step(x):
            for layer in self.layers:
                x, residual = layer.forward(x, residual)
        x, _ = self.norm.forward_fused(x, residual)
        return x


class CausalLM(BaseOP):
    """`forward()` runs the batch in the global context and returns logits for each request's next
    token: [num_reqs, vocab]."""

    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        max_positions: int | None = None,
    ) -> None:
        self._config = cfg
        self.model = DecoderBody(cfg, dtype, device, max_positions)
        tied = self.model.embed_tokens if cfg.tie_word_embeddings else None
        self.lm_head = LMHead(cfg.vocab_size, cfg.hidden_size, dtype, device, tied_to=tied)

    @property
    def config(self) -> ModelConfig:
        return self._config

    def move_rotary(self, device: torch.device) -> None:
        rot = self.model._rotary
        rot._cos, rot._sin = rot._cos.to(device), rot._sin.to(device)

    def size_rotary(self, max_positions: int, device: torch.device) -> None:
        """RoPE's table for positions [0, max_positions), on `device` (the engine's context
        length)."""
        self.model._rotary.resize(max_positions, device)

    def forward(self) -> torch.Tensor:
        batch = get_global_ctx().batch
        hidden = self.model.forward(batch.input_ids)
        return self.lm_head.forward(hidden)
