"""Chapter 2: the op layer. State-dict names come from attribute paths; loading is strict and says
which key is wrong; RMSNorm and RoPE agree with Hugging Face's Qwen3 modules."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    apply_rotary_pos_emb,
)

from helpers import MODEL
from minisgl.layers import BaseOP, Linear, LMHead, OPList, RMSNorm, RotaryEmbedding, VocabEmbedding
from minisgl.models import ModelConfig, create_model
from refusals import refuses

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
        self.size = 6  # public but not a tensor or an op: not a weight either


class Tree(BaseOP):
    def __init__(self) -> None:
        self.blocks = OPList([Block(), Block()])
        self.head = Linear(6, 2, False, F32, CPU)


BLOCK_KEYS = ["proj.weight", "proj.bias", "norms.0.weight", "norms.1.weight", "scale"]


def block_state(**changes) -> dict:
    state = {
        "proj.weight": torch.randn(6, 4),
        "proj.bias": torch.randn(6),
        "norms.0.weight": torch.randn(6),
        "norms.1.weight": torch.randn(6),
        "scale": torch.randn(3),
    }
    state.update(changes)
    return {k: v for k, v in state.items() if v is not None}


# ---------------------------------------------------------------- names


def diff(got, want) -> str:
    """The keys one list has and the other lacks, in a few words."""
    extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
    return f"unexpected {extra[:4]}, missing {missing[:4]}"


def test_state_dict_names_follow_attribute_paths():
    block = sorted(Block().state_dict())
    assert block == sorted(BLOCK_KEYS), f"a Block's weight names: {diff(block, BLOCK_KEYS)}"
    tree = sorted(Tree().state_dict())
    want = [f"blocks.{i}.{k}" for i in range(2) for k in BLOCK_KEYS] + ["head.weight"]
    assert tree == sorted(want), f"a Tree of Blocks' weight names: {diff(tree, want)}"


class Mixed(BaseOP):
    """Tensors before and after a sub-op, names out of alphabetical order."""

    def __init__(self) -> None:
        self.z_gain = torch.ones(2)
        self._private = torch.zeros(1)
        self.inner = Linear(2, 2, True, F32, CPU)
        self.a_shift = torch.zeros(2)


def test_named_tensors_follow_attribute_order():
    # Depth first, in the order __init__ set the attributes (self.__dict__'s order).
    got = [k for k, _ in Mixed().named_tensors("m.")]
    want = ["m.z_gain", "m.inner.weight", "m.inner.bias", "m.a_shift"]
    assert got == want, f"named_tensors('m.') must yield {want} in attribute order, got {got}"


def test_state_dict_holds_the_weights_themselves():
    block = Block()
    state = block.state_dict()
    assert state["norms.1.weight"] is block.norms[1].weight, (
        "state_dict()['norms.1.weight'] is a copy: named_tensors must yield the op's own tensors"
    )
    assert state["proj.bias"] is block.proj.bias, (
        "state_dict()['proj.bias'] is a copy: named_tensors must yield the op's own tensors"
    )


def test_private_attributes_are_not_weights():
    names = dict(Block().named_tensors())
    private = [n for n in names if n.startswith("_") or "._" in n or "helper" in n]
    assert not private, (
        f"private attributes (names starting with '_') are not weights, got {private}"
    )


def test_tied_lm_head_owns_no_weight():
    emb = VocabEmbedding(10, 4, F32, CPU)
    tied = list(dict(LMHead(10, 4, F32, CPU, tied_to=emb).named_tensors()))
    assert tied == [], (
        f"a tied LM head owns no weight (the embedding's is private to it), got {tied}"
    )
    own = list(dict(LMHead(10, 4, F32, CPU).named_tensors()))
    assert own == ["weight"], f"an untied LM head owns exactly ['weight'], got {own}"


@pytest.mark.parametrize("tied", [True, False])
def test_model_state_dict_names_match_hf_layout(tied):
    raw = json.loads((MODEL / "config.json").read_text())
    cfg = ModelConfig.from_hf({**raw, "tie_word_embeddings": tied})
    keys = set(create_model(cfg, F32, torch.device("meta")).state_dict())
    expected = {"model.embed_tokens.weight", "model.norm.weight"}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        expected |= {
            p + n
            for n in [
                "input_layernorm.weight",
                "post_attention_layernorm.weight",
                "self_attn.qkv_proj.weight",
                "self_attn.o_proj.weight",
                "self_attn.q_norm.weight",
                "self_attn.k_norm.weight",
                "mlp.gate_up_proj.weight",
                "mlp.down_proj.weight",
            ]
        }
    if not tied:
        expected.add("lm_head.weight")
    assert keys == expected, (
        f"the model's state dict (tie_word_embeddings={tied}): {diff(keys, expected)}"
    )


# ---------------------------------------------------------------- loading


def test_load_state_dict_replaces_every_weight():
    block, state = Block(), block_state()
    block.load_state_dict(state)
    assert torch.equal(block.proj.weight, state["proj.weight"])
    assert torch.equal(block.norms[1].weight, state["norms.1.weight"])
    assert torch.equal(block.scale, state["scale"])


def test_load_state_dict_rejects_an_extra_key():
    with refuses(
        KeyError, "load_state_dict with an extra key norms.2.weight", match="norms.2.weight"
    ):
        Block().load_state_dict(block_state(**{"norms.2.weight": torch.randn(6)}))


def test_load_state_dict_rejects_a_missing_key():
    with refuses(KeyError, "load_state_dict without norms.1.weight", match="norms.1.weight"):
        Block().load_state_dict(block_state(**{"norms.1.weight": None}))


def test_load_state_dict_rejects_a_wrong_shape():
    with refuses(
        ValueError,
        "load_state_dict with proj.weight of shape (4, 6)",
        match=r"proj\.weight.*\(4, 6\)",
    ):
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


def test_rms_norm_matches_hf():
    hf = hf_norm(64, 1e-6)
    x = torch.randn(7, 64) * 3
    torch.testing.assert_close(
        ours(hf).forward(x),
        hf(x).detach(),
        msg="RMSNorm differs from Hugging Face's Qwen3RMSNorm in float32",
    )


def test_rms_norm_in_bfloat16_rounds_like_hf():
    # Computed in float32 and cast back to bfloat16 before the weight, as Hugging Face does, the
    # result is Hugging Face's to the last bit. bfloat16 arithmetic anywhere on the way (the
    # squares, the mean, the scaling, or the product with the weight) changes a good share of the
    # outputs.
    hf = hf_norm(128, 1e-6, torch.bfloat16)
    x = (torch.randn(64, 128) * 3).bfloat16()
    got = ours(hf).forward(x)
    assert got.dtype == torch.bfloat16, f"bfloat16 input must give bfloat16 output, got {got.dtype}"
    differ = (got != hf(x).detach()).float().mean().item()
    assert differ < 0.005, (
        f"in bfloat16, {differ:.1%} of the outputs differ from Hugging Face's: compute in "
        "float32 and cast back to x's dtype before multiplying by the weight"
    )


def test_rms_norm_normalizes_each_head():
    # q/k norm: the same weight over the last dimension of [tokens, heads, head_dim].
    hf = hf_norm(16, 1e-6)
    x = torch.randn(5, 4, 16)
    torch.testing.assert_close(
        ours(hf).forward(x),
        hf(x).detach(),
        msg="on [tokens, heads, head_dim], each head must be normalized on its own",
    )


def test_fused_residual_rms_norm_matches_hf():
    hf = hf_norm(32, 1e-5)
    x, residual = torch.randn(6, 32), torch.randn(6, 32)
    out, new_residual = ours(hf).forward_fused(x, residual)
    torch.testing.assert_close(
        new_residual, x + residual, msg="forward_fused's new residual must be x + residual"
    )
    torch.testing.assert_close(
        out,
        hf(x + residual).detach(),
        msg="forward_fused must return the norm of x + residual, as Hugging Face computes it",
    )
    first, res0 = ours(hf).forward_fused(x, None)  # first layer: no residual yet
    torch.testing.assert_close(
        first, hf(x).detach(), msg="forward_fused(x, None) must return the norm of x"
    )
    assert torch.equal(res0, x), "forward_fused(x, None) must return x itself as the residual"


# ---------------------------------------------------------------- RoPE


@pytest.mark.parametrize(
    "theta,head_dim,dtype",
    [(10000.0, 32, F32), (1_000_000.0, 64, F32), (10000.0, 32, torch.bfloat16)],
    ids=["float32", "float32-theta1e6-dim64", "bfloat16"],
)
def test_rope_matches_hf(theta, head_dim, dtype):
    cfg = Qwen3Config(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=512,
        rope_theta=theta,
    )
    hf_rot = Qwen3RotaryEmbedding(cfg)
    torch.manual_seed(1)
    positions = torch.tensor([0, 1, 2, 9, 40, 3, 511])  # unsorted: a batch of several requests
    q, k = torch.randn(7, 4, head_dim).to(dtype), torch.randn(7, 2, head_dim).to(dtype)
    cos, sin = hf_rot(q, positions.unsqueeze(0))  # [1, tokens, head_dim], in q's dtype
    # HF wants [batch, heads, tokens, head_dim]; ours is [tokens, heads, head_dim].
    hq, hk = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    oq, ok = RotaryEmbedding(head_dim, 512, theta, CPU).forward(positions, q, k)
    name = str(dtype).replace("torch.", "")
    assert oq.dtype == dtype, (
        f"{name} q must give {name} output (cos and sin come in x's dtype), got {oq.dtype}"
    )
    # Rotating in float32 and rounding once is fine too: bfloat16 gets a tolerance of a few ulps.
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(
        oq,
        hq[0].transpose(0, 1),
        **tol,
        msg=f"rotated q differs from Hugging Face's ({name}, theta {theta:g})",
    )
    torch.testing.assert_close(
        ok,
        hk[0].transpose(0, 1),
        **tol,
        msg=f"rotated k differs from Hugging Face's ({name}, theta {theta:g})",
    )


def test_rope_rotates_pairs_of_first_and_second_half():
    rot = RotaryEmbedding(8, 16, 10000.0, CPU)
    x = torch.zeros(2, 1, 8)
    x[:, 0, 0] = 1.0  # a unit vector in dimension 0, paired with dimension 4 (NeoX layout)
    q, _ = rot.forward(torch.tensor([0, 1]), x, x)
    torch.testing.assert_close(q[0, 0], x[0, 0], msg="position 0 must leave the vector unchanged")
    angle = torch.tensor(1.0)  # position 1, pair 0: frequency theta^0 = 1
    want = torch.zeros(8)
    want[0], want[4] = angle.cos(), angle.sin()
    torch.testing.assert_close(
        q[1, 0],
        want,
        msg=f"unit vector in dim 0 at position 1: expected "
        "cos 1 in dim 0 and sin 1 in dim 4 (NeoX pairs i with i + 4), got "
        f"{[round(v, 3) for v in q[1, 0].tolist()]}",
    )
