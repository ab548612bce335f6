"""Qwen3-Next and Qwen3.5: decoders whose layers are mostly Gated DeltaNet (gated_deltanet.py),
with a full-attention layer every few (hybrid_config.py says which).

Their full attention is Qwen3's with partial RoPE and an output gate (minisgl/layers/
gated_attention.py).

Every RMSNorm but the DeltaNet output's scales by (1 + weight): checkpoints store the weight's
offset from 1. `load_state_dict` adds the 1 once, so the engine's RMSNorm (and its fused GPU
kernels) run unchanged.

Only the full-attention layers keep KV: their attention layer ids are their index among the
full-attention layers (0, 1, ...), the KV cache's layers. The DeltaNet layers keep a fixed-size
state per request slot in the engine's StatePool (`attach_state`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.core import get_global_ctx
from minisgl.kvcache.state_pool import StatePool, reset_new_rows
from minisgl.layers import (
    BaseOP,
    GatedAttention,
    Linear,
    LMHead,
    RMSNorm,
    RotaryEmbedding,
)

from .config import ModelConfig
from .decoder import MLP, CausalLM, DecoderBody
from .gated_deltanet import GatedDeltaNet, host_lengths
from .moe import SparseMoeBlock


class SplitMLP(BaseOP):
    """SwiGLU with gate and up kept apart: the shared expert's keys (`shared_expert.gate_proj`)
    are not the dense MLP's, which the loader merges into gate_up_proj."""

    def __init__(self, hidden: int, inter: int, dtype: torch.dtype, device: torch.device) -> None:
        self.gate_proj = Linear(hidden, inter, False, dtype, device)
        self.up_proj = Linear(hidden, inter, False, dtype, device)
        self.down_proj = Linear(inter, hidden, False, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj.forward(F.silu(self.gate_proj.forward(x)) * self.up_proj.forward(x))


class SharedExpertMoeBlock(SparseMoeBlock):
    """Qwen3-Next's sparse MLP: the routed experts plus a shared expert every token visits,
    weighted by sigmoid(shared_expert_gate(x))."""

    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype, device: torch.device):
        super().__init__(cfg.moe, layer_id, cfg.hidden_size, dtype, device)
        hidden, shared = cfg.hidden_size, cfg.hybrid.shared_expert_size
        self.shared_expert = SplitMLP(hidden, shared, dtype, device)
        self.shared_expert_gate = Linear(hidden, 1, False, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = torch.sigmoid(self.shared_expert_gate.forward(x)) * self.shared_expert.forward(x)
        return super().forward(x) + shared


class HybridDecoderLayer(BaseOP):
    def __init__(
        self,
        cfg: ModelConfig,
        layer_id: int,
        rotary: RotaryEmbedding,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        hybrid, eps = cfg.hybrid, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps, dtype, device)
        if hybrid.layer_types[layer_id] == "full_attention":
            self.self_attn = GatedAttention(
                hybrid.full_layers.index(layer_id),  # its layer in the KV cache
                cfg.hidden_size,
                cfg.num_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.rms_norm_eps,
                rotary,
                hybrid.rotary_dim,
                dtype,
                device,
                bias=cfg.attention_bias,
            )
        else:
            self.linear_attn = GatedDeltaNet(
                hybrid, cfg.architecture, cfg.hidden_size, eps, dtype, device
            )
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps, dtype, device)
        if cfg.moe is not None and layer_id in cfg.moe.sparse_layers:
            self.mlp = SharedExpertMoeBlock(cfg, layer_id, dtype, device)
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, False, dtype, device)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None):
        if hasattr(self, "self_attn"):
            x, residual = self.self_attn.forward_normed(self.input_layernorm, x, residual)
        else:
            x, residual = self.input_layernorm.forward_fused(x, residual)
            x = self.linear_attn.forward(x)
        if isinstance(self.mlp, MLP):
            return self.mlp.forward_normed(self.post_attention_layernorm, x, residual)
        x, residual = self.post_attention_layernorm.forward_fused(x, residual)
        return self.mlp.forward(x), residual


class HybridBody(DecoderBody):
    """A decoder body whose layers are DeltaNet or gated full attention by the config's layer
    kinds, with RoPE on part of each head (partial rotary)."""

    layer_class = HybridDecoderLayer

    @staticmethod
    def rotary_dim(cfg: ModelConfig) -> int:
        return cfg.hybrid.rotary_dim


class HybridCausalLM(CausalLM):
    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        max_positions: int | None = None,
    ) -> None:
        if cfg.hybrid is None:
            raise ValueError(
                f"a {cfg.architecture} ModelConfig needs its layer kinds and DeltaNet heads: "
                "build it with ModelConfig.from_dir"
            )
        self._config = cfg
        self.model = HybridBody(cfg, dtype, device, max_positions)
        tied = self.model.embed_tokens if cfg.tie_word_embeddings else None
        self.lm_head = LMHead(cfg.vocab_size, cfg.hidden_size, dtype, device, tied_to=tied)

    def load_state_dict(self, state_dict, strict: bool = True) -> None:
        """Load as any op, then turn the checkpoint's (1 + w) norms into plain weights: the model's
        own state dict holds 1 + w (module docstring)."""
        super().load_state_dict(state_dict, strict)
        norms = [self.model.norm]
        for layer in self.model.layers:
            norms += [layer.input_layernorm, layer.post_attention_layernorm]
            if hasattr(layer, "self_attn"):
                norms += [layer.self_attn.q_norm, layer.self_attn.k_norm]
        for norm in norms:
            norm.weight = (norm.weight.float() + 1.0).to(norm.weight.dtype)

    def attach_state(self, pool: StatePool) -> None:
        """Give each DeltaNet layer its part of the engine's state pool."""
        self._pool = pool
        for index, layer_id in enumerate(self._config.hybrid.linear_layers):
            self.model.layers[layer_id].linear_attn.attach_state(pool, index)

    def forward(self) -> torch.Tensor:
        """A prefill step first zeroes the rows of the requests it starts (reset_new_rows), inside
        the step: in stream order, after every step queued before it. A decode step starts no
        request (and a CUDA graph captures it: the rows it would zero are the replay's)."""
        batch = get_global_ctx().batch
        pool = getattr(self, "_pool", None)
        if not batch.is_decode and pool is not None and batch.attn_metadata is not None:
            meta = batch.attn_metadata
            cu, totals = host_lengths(meta)
            news = [end - start for start, end in zip(cu, cu[1:])]
            reset_new_rows(pool, meta.rows, news, totals)
        return super().forward()


class Qwen3NextForCausalLM(HybridCausalLM):
    """Qwen3-Next: gated attention and DeltaNet layers; its sparse MLPs add a shared expert."""

    def __init__(self, cfg, dtype, device, max_positions=None) -> None:
        assert cfg.architecture == "qwen3_next"
        super().__init__(cfg, dtype, device, max_positions)


class Qwen3_5ForCausalLM(HybridCausalLM):
    """Qwen3.5 (the language model of the vision-language one too): dense MLPs."""

    def __init__(self, cfg, dtype, device, max_positions=None) -> None:
        assert cfg.architecture == "qwen3_5"
        super().__init__(cfg, dtype, device, max_positions)
