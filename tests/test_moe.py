"""Qwen3-MoE in the engine, beyond the parity matrix of test_checkpoints.py (which runs the four
MoE checkpoints of tests/checkpoints.py in every engine mode):

- the matrix has teeth: the router's renormalisation and its top-k change the tokens;
- the torch path equals transformers' own router and experts, and the capture-safe path equals it;
- both weight layouts (per expert, stacked) load the same model, and a broken expert is named;
- every MoE config field is read or refused by name; a harmless value is accepted;
- the tensor-parallel hook slices each expert's gate and up alike.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from checkpoints import checkpoint
from helpers import build_llm, greedy, hf_greedy
from minisgl.kernel.moe import group_by_expert, moe_experts, moe_experts_dense, route
from minisgl.llm import LLM
from minisgl.models import load_model
from minisgl.models.config import ModelConfig
from minisgl.models.moe import gate_up_shard
from test_checkpoints import NEW_TOKENS, prompts


def _with_config(tmp_path, name, **fields):
    model = tmp_path / "model"
    shutil.copytree(checkpoint(name), model)
    raw = json.loads((model / "config.json").read_text())
    raw.update(fields)
    (model / "config.json").write_text(json.dumps(raw))
    return model


def _tokens(model):
    return [o["token_ids"] for o in build_llm(model).generate(prompts(), greedy(NEW_TOKENS))]


# ---------------------------------------------------------------- the matrix has teeth


@pytest.mark.parametrize(
    "fields", [{"norm_topk_prob": False}, {"num_experts_per_tok": 1}], ids=["no-renorm", "top-1"]
)
def test_the_routing_settings_change_the_tokens(tmp_path, fields):
    # If the engine ignored these fields, the MoE rows of the matrix could pass by luck.
    want = hf_greedy(prompts(), NEW_TOKENS, model=checkpoint("qwen3-moe"))
    got = _tokens(_with_config(tmp_path, "qwen3-moe", **fields))
    assert got != want, f"qwen3-moe read with {fields} still gives the checkpoint's tokens"


# ---------------------------------------------------------------- the torch path


def _hf_block(norm: bool, experts=8, top_k=2, hidden=64, inter=32):
    import transformers
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = transformers.Qwen3MoeConfig(
        hidden_size=hidden,
        moe_intermediate_size=inter,
        num_experts=experts,
        num_experts_per_tok=top_k,
        norm_topk_prob=norm,
    )
    torch.manual_seed(0)
    block = Qwen3MoeSparseMoeBlock(cfg).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
    return block


@pytest.mark.parametrize("norm", [True, False], ids=["renormalised", "raw"])
def test_route_and_experts_equal_transformers(norm):
    block = _hf_block(norm)
    x = torch.randn(1, 11, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = block(x)[0]
        _, hf_weights, hf_ids = block.gate(x[0])
    weights, ids = route(x[0] @ block.gate.weight.t(), 2, norm)
    assert torch.equal(ids, hf_ids), "the chosen experts differ from transformers' router"
    torch.testing.assert_close(weights, hf_weights.float())
    got = moe_experts(
        x[0],
        block.experts.gate_up_proj.data,
        block.experts.down_proj.data,
        *route(x[0] @ block.gate.weight.t(), 2, norm),
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    dense = moe_experts_dense(
        x[0], block.experts.gate_up_proj.data, block.experts.down_proj.data, weights, ids
    )
    torch.testing.assert_close(dense, want, rtol=1e-5, atol=1e-5)


def test_grouping_puts_each_experts_choices_together():
    ids = torch.tensor([[3, 0], [0, 5], [5, 3]])
    order, counts = group_by_expert(ids, 6)
    assert order.tolist() == [1, 2, 0, 5, 3, 4] and counts.tolist() == [2, 0, 0, 2, 0, 2]


def test_zero_tokens_give_an_empty_output():
    x = torch.zeros(0, 8)
    w, ids = route(torch.zeros(0, 4), 2, True)
    out = moe_experts(x, torch.randn(4, 6, 8), torch.randn(4, 8, 3), w, ids)
    assert out.shape == (0, 8)


# ---------------------------------------------------------------- weight layouts


def _to_stacked_layout(src, dst):
    # The same weights, written as transformers 5 writes with save_original_format=False.
    shutil.copy(src / "config.json", dst)
    t = load_file(str(src / "model.safetensors"))
    experts = json.loads((src / "config.json").read_text())["num_local_experts"]
    for layer in range(3):
        base = f"model.layers.{layer}.mlp.experts"
        gate_up = [
            torch.cat([t.pop(f"{base}.{e}.gate_proj.weight"), t.pop(f"{base}.{e}.up_proj.weight")])
            for e in range(experts)
        ]
        down = [t.pop(f"{base}.{e}.down_proj.weight") for e in range(experts)]
        t[f"{base}.gate_up_proj"], t[f"{base}.down_proj"] = torch.stack(gate_up), torch.stack(down)
    save_file(t, str(dst / "model.safetensors"))


def test_both_layouts_load_the_same_weights(tmp_path):
    src = checkpoint("qwen3-moe")
    _to_stacked_layout(src, tmp_path)
    a = load_model(src, torch.float32, torch.device("cpu")).state_dict()
    b = load_model(tmp_path, torch.float32, torch.device("cpu")).state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs between the two layouts"
    assert a["model.layers.0.mlp.experts.gate_up_proj"].shape == (8, 64, 64)


def _broken(tmp_path, change):
    src = checkpoint("qwen3-moe")
    shutil.copy(src / "config.json", tmp_path)
    t = load_file(str(src / "model.safetensors"))
    change(t)
    save_file(t, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_a_missing_expert_weight_is_named(tmp_path):
    model = _broken(tmp_path, lambda t: t.pop("model.layers.2.mlp.experts.5.up_proj.weight"))
    with pytest.raises(KeyError, match=r"model\.layers\.2\.mlp\.experts\.5\.up_proj\.weight"):
        LLM(model, device="cpu")


def test_an_expert_the_config_does_not_declare_is_named(tmp_path):
    def extra(t):
        t["model.layers.0.mlp.experts.8.down_proj.weight"] = torch.zeros(64, 32)

    with pytest.raises(ValueError, match=r"experts\.8\.down_proj.*expert 8 does not exist"):
        LLM(_broken(tmp_path, extra), device="cpu")


def test_an_expert_of_another_shape_is_named(tmp_path):
    def wider(t):
        t["model.layers.1.mlp.experts.3.gate_proj.weight"] = torch.zeros(40, 64)

    with pytest.raises(ValueError, match=r"layers\.1\.mlp\.experts\.gate_up_proj.*differ in shape"):
        LLM(_broken(tmp_path, wider), device="cpu")


# ---------------------------------------------------------------- config fields

REFUSED = [
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"num_experts_per_tok": 0}, "num_experts_per_tok"),
    ({"moe_intermediate_size": None}, "moe_intermediate_size"),
    ({"norm_topk_prob": "true"}, "norm_topk_prob"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step"),
    ({"mlp_only_layers": [3]}, "mlp_only_layers"),
    ({"mlp_only_layers": "1"}, "mlp_only_layers"),
    ({"num_experts": 4}, "num_local_experts"),  # the file also says num_local_experts 8
    ({"num_local_experts": None}, "num_experts"),
    ({"hidden_act": "gelu"}, "hidden_act"),
]


@pytest.mark.parametrize("fields,named", REFUSED, ids=[str(f) for f, _ in REFUSED])
def test_a_moe_config_the_engine_would_run_wrongly_is_refused_naming_the_field(
    tmp_path, fields, named
):
    with pytest.raises(ValueError) as e:
        LLM(_with_config(tmp_path, "qwen3-moe", **fields), device="cpu")
    assert named in str(e.value), f"config.json with {fields}: expected {named!r} in: {e.value}"


def test_training_only_fields_and_one_expert_count_spelling_are_accepted(tmp_path):
    model = _with_config(
        tmp_path, "qwen3-moe", output_router_logits=True, router_aux_loss_coef=0.5, num_experts=8
    )
    cfg = ModelConfig.from_dir(model)
    assert cfg.moe is not None and cfg.moe.num_experts == 8 and cfg.moe.top_k == 2


def test_sparse_layers_follow_transformers_rule():
    cfg = ModelConfig.from_dir(checkpoint("qwen3-moe-sparse-step2-tf4"))
    assert cfg.moe.sparse_layers == (1, 3) and cfg.moe.num_experts == 8  # read as num_experts
    assert ModelConfig.from_dir(checkpoint("qwen3-moe-mlp-only-layers")).moe.sparse_layers == (0, 2)


def test_from_hf_alone_says_the_experts_are_missing():
    raw = json.loads((checkpoint("qwen3-moe") / "config.json").read_text())
    from minisgl.models import create_model

    with pytest.raises(ValueError, match="with_experts"):
        create_model(ModelConfig.from_hf(raw), torch.float32, torch.device("meta"))


# ---------------------------------------------------------------- tensor parallelism's hook


def test_gate_up_shard_takes_the_same_rows_of_gate_and_up():
    gate = torch.arange(2 * 4 * 3).reshape(2, 4, 3).float()
    up = -gate
    shard = gate_up_shard(torch.cat([gate, up], dim=1), rank=1, world=2)
    assert torch.equal(shard, torch.cat([gate[:, 2:], up[:, 2:]], dim=1))
    with pytest.raises(ValueError, match="does not split over 3"):
        gate_up_shard(torch.cat([gate, up], dim=1), 0, 3)
