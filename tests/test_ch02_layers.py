"""Chapter 2: the op layer. State-dict names come from attribute paths; loading is strict and says
which key is wrong; RMSNorm and RoPE agree with Hugging Face's Qwen3 modules."""

from __future__ import annotations

import json
import pytest
import torch
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (Qwen3RMSNorm, Qwen3RotaryEmbedding,
                                                      apply_rotary_pos_emb)

from helpers import MODEL

from minisgl.layers import BaseOP, Linear, LMHead, OPList, RMSNorm, RotaryEmbedding, VocabEmbedding
from minisgl.models import ModelConfig, create_model

CPU = torch.device("cpu")
F32 = torch.float32


class Block(BaseOP):
    """A small op tree: a sub-op, a list of sub-ops, a plain tensor and private attributes."""

    def __init__(self) -> None:
        self.proj = Linear(4, 6, True, F32, CPU)
        self.norms = OPList([RMSNorm(6, 1e-6, F32, CPU), RMSNorm(6, 1e-6, F32, CPU)])
        self.scale = torch.ones(3)
        self._cache = torch.zeros(5)  # private: never part of the state dict
        self._helper = RMSNorm(6, 1e-6, F32, CPU)  # a private sub-op is skipped too
        self._eps = 1e-6


class Tree(BaseOP):
    def __init__(self) -> None:
        self.blocks = OPList([Block(), Block()])
        self.head = Linear(6, 2, False, F32, CPU)


BLOCK_KEYS = ["proj.weight", "proj.bias", "norms.0.weight", "norms.1.weight", "scale"]


def block_state(**changes) -> dict:
    state = {"proj.weight": torch.randn(6, 4), "proj.bias": torch.randn(6), "norms.0.weight": torch.randn(6),
             "norms.1.weight": torch.randn(6), "scale": torch.randn(3)}
    state.update(changes)
    return {k: v for k, v in state.items() if v is not None}


# ---------------------------------------------------------------- names


def test_state_dict_names_follow_attribute_paths():
    assert sorted(Block().state_dict()) == sorted(BLOCK_KEYS)
    tree = Tree().state_dict()
    want = [f"blocks.{i}.{k}" for i in range(2) for k in BLOCK_KEYS] + ["head.weight"]
    assert sorted(tree) == sorted(want)


def test_state_dict_holds_the_weights_themselves():
    block = Block()
    state = block.state_dict()
    assert state["norms.1.weight"] is block.norms[1].weight  # no copies
    assert state["proj.bias"] is block.proj.bias


def test_private_attributes_are_not_weights():
    names = dict(Block().named_tensors())
    assert not any(n.startswith("_") or "._" in n for n in names)
    assert "_cache" not in names and not any("helper" in n for n in names)


def test_tied_lm_head_owns_no_weight():
    emb = VocabEmbedding(10, 4, F32, CPU)
    assert dict(LMHead(10, 4, F32, CPU, tied_to=emb).named_tensors()) == {}
    assert list(dict(LMHead(10, 4, F32, CPU).named_tensors())) == ["weight"]


@pytest.mark.parametrize("tied", [True, False])
def test_model_state_dict_names_match_hf_layout(tied):
    raw = json.loads((MODEL / "config.json").read_text())
    cfg = ModelConfig.from_hf({**raw, "tie_word_embeddings": tied})
    keys = set(create_model(cfg, F32, torch.device("meta")).state_dict())
    expected = {"model.embed_tokens.weight", "model.norm.weight"}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        expected |= {p + n for n in ["input_layernorm.weight", "post_attention_layernorm.weight",
                                     "self_attn.qkv_proj.weight", "self_attn.o_proj.weight",
                                     "self_attn.q_norm.weight", "self_attn.k_norm.weight",
                                     "mlp.gate_up_proj.weight", "mlp.down_proj.weight"]}
    if not tied:
        expected.add("lm_head.weight")
    assert keys == expected


# ---------------------------------------------------------------- loading


def test_load_state_dict_replaces_every_weight():
    block, state = Block(), block_state()
    block.load_state_dict(state)
    assert torch.equal(block.proj.weight, state["proj.weight"])
    assert torch.equal(block.norms[1].weight, state["norms.1.weight"])
    assert torch.equal(block.scale, state["scale"])


def test_load_state_dict_rejects_an_extra_key():
    with pytest.raises(KeyError, match="norms.2.weight"):
        Block().load_state_dict(block_state(**{"norms.2.weight": torch.randn(6)}))


def test_load_state_dict_rejects_a_missing_key():
    with pytest.raises(KeyError, match="norms.1.weight"):
        Block().load_state_dict(block_state(**{"norms.1.weight": None}))


def test_load_state_dict_rejects_a_wrong_shape():
    with pytest.raises(ValueError, match=r"proj\.weight.*\(4, 6\)"):
        Block().load_state_dict(block_state(**{"proj.weight": torch.randn(4, 6)}))


def test_load_state_dict_converts_to_the_op_dtype():
    block = Block()
    block.load_state_dict(block_state(scale=torch.randn(3, dtype=torch.float64)))
    assert block.scale.dtype == F32


# ---------------------------------------------------------------- RMSNorm


def hf_norm(size: int, eps: float, dtype=F32) -> Qwen3RMSNorm:
    torch.manual_seed(0)
    norm = Qwen3RMSNorm(size, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(size) * 0.5 + 1)
    return norm.to(dtype)


def ours(hf: Qwen3RMSNorm) -> RMSNorm:
    norm = RMSNorm(hf.weight.shape[0], hf.variance_epsilon, hf.weight.dtype, CPU)
    norm.load_state_dict({"weight": hf.weight.detach().clone()})
    return norm


@pytest.mark.parametrize("dtype", [F32, torch.bfloat16])
def test_rms_norm_matches_hf(dtype):
    hf = hf_norm(64, 1e-6, dtype)
    x = (torch.randn(7, 64) * 3).to(dtype)
    torch.testing.assert_close(ours(hf).forward(x), hf(x).detach())


def test_rms_norm_normalizes_each_head():
    # q/k norm: the same weight over the last dimension of [tokens, heads, head_dim].
    hf = hf_norm(16, 1e-6)
    x = torch.randn(5, 4, 16)
    torch.testing.assert_close(ours(hf).forward(x), hf(x).detach())


def test_fused_residual_rms_norm_matches_hf():
    hf = hf_norm(32, 1e-5)
    x, residual = torch.randn(6, 32), torch.randn(6, 32)
    out, new_residual = ours(hf).forward_fused(x, residual)
    torch.testing.assert_close(new_residual, x + residual)
    torch.testing.assert_close(out, hf(x + residual).detach())
    first, res0 = ours(hf).forward_fused(x, None)  # first layer: no residual yet
    torch.testing.assert_close(first, hf(x).detach())
    assert torch.equal(res0, x)


# ---------------------------------------------------------------- RoPE


@pytest.mark.parametrize("theta,head_dim", [(10000.0, 32), (1_000_000.0, 64)])
def test_rope_matches_hf(theta, head_dim):
    cfg = Qwen3Config(hidden_size=head_dim * 4, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=head_dim, max_position_embeddings=512, rope_theta=theta)
    hf_rot = Qwen3RotaryEmbedding(cfg)
    torch.manual_seed(1)
    positions = torch.tensor([0, 1, 2, 9, 40, 3, 511])  # unsorted: a batch of several requests
    q, k = torch.randn(7, 4, head_dim), torch.randn(7, 2, head_dim)
    cos, sin = hf_rot(q, positions.unsqueeze(0))  # [1, tokens, head_dim]
    # HF wants [batch, heads, tokens, head_dim]; ours is [tokens, heads, head_dim].
    hq, hk = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    oq, ok = RotaryEmbedding(head_dim, 512, theta, CPU).forward(positions, q, k)
    torch.testing.assert_close(oq, hq[0].transpose(0, 1))
    torch.testing.assert_close(ok, hk[0].transpose(0, 1))


def test_rope_rotates_pairs_of_first_and_second_half():
    rot = RotaryEmbedding(8, 16, 10000.0, CPU)
    x = torch.zeros(2, 1, 8)
    x[:, 0, 0] = 1.0  # a unit vector in dimension 0, paired with dimension 4 (NeoX layout)
    q, _ = rot.forward(torch.tensor([0, 1]), x, x)
    torch.testing.assert_close(q[0, 0], x[0, 0])  # position 0: unchanged
    angle = torch.tensor(1.0)  # position 1, pair 0: frequency theta^0 = 1
    want = torch.zeros(8)
    want[0], want[4] = angle.cos(), angle.sin()
    torch.testing.assert_close(q[1, 0], want)
