"""Chapter 3: reading config.json (both transformers layouts) and streaming a checkpoint into the
engine's merged weights. A broken checkpoint must fail loudly, naming the key or file at fault."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable, Dict, List

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import MODEL, hf_logits, prompt_ids

import minisgl.core as core
from minisgl.attention import TorchAttentionBackend, prepare_metadata
from minisgl.core import Batch, Context, Req, SamplingParams
from minisgl.kvcache import KVCache
from minisgl.models import ModelConfig, create_model, load_weight

CPU = torch.device("cpu")
F32 = torch.float32

BASE = {
    "architectures": ["Qwen3ForCausalLM"], "vocab_size": 1000, "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 3, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048,
    "tie_word_embeddings": True, "eos_token_id": [7, 8],
}
TRANSFORMERS_4 = {**BASE, "torch_dtype": "bfloat16", "rope_theta": 1_000_000.0, "rope_scaling": None}
TRANSFORMERS_5 = {**BASE, "dtype": "bfloat16", "rope_parameters": {"rope_theta": 1_000_000.0, "rope_type": "default"}}


# ---------------------------------------------------------------- ModelConfig


def test_config_from_both_transformers_layouts_is_the_same():
    old, new = ModelConfig.from_hf(TRANSFORMERS_4), ModelConfig.from_hf(TRANSFORMERS_5)
    assert old == new
    assert new.dtype == torch.bfloat16 and new.rope_theta == 1_000_000.0
    assert (new.architecture, new.num_layers, new.num_heads, new.num_kv_heads, new.head_dim) == ("qwen3", 3, 8, 2, 32)
    assert new.tie_word_embeddings and new.eos_token_id == 7  # the first of a list


def test_llama_config_is_recognized():
    cfg = ModelConfig.from_hf({**TRANSFORMERS_4, "architectures": ["LlamaForCausalLM"]})
    assert cfg.architecture == "llama"


def test_config_defaults():
    raw = {k: v for k, v in TRANSFORMERS_5.items() if k not in ("head_dim", "num_key_value_heads")}
    cfg = ModelConfig.from_hf(raw)
    assert cfg.head_dim == 128 // 8  # hidden / heads when head_dim is absent
    assert cfg.num_kv_heads == 8  # plain multi-head attention when kv heads are absent


def test_config_of_the_test_model_agrees_with_transformers():
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(MODEL)
    cfg = ModelConfig.from_dir(MODEL)
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == \
        (hf.vocab_size, hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim)
    assert cfg.rms_norm_eps == hf.rms_norm_eps and cfg.tie_word_embeddings == hf.tie_word_embeddings
    assert cfg == config_of(MODEL)


@pytest.mark.parametrize("arch", [["MistralForCausalLM"], [], None])
def test_unsupported_architecture_raises(arch):
    with pytest.raises(ValueError, match="MistralForCausalLM" if arch else None):
        ModelConfig.from_hf({**TRANSFORMERS_5, "architectures": arch})


@pytest.mark.parametrize("changes,name", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),  # transformers 4
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "linear"),  # older transformers 4 files
])
def test_rope_scaling_raises_transformers_4(changes, name):
    with pytest.raises(ValueError, match=name):
        ModelConfig.from_hf({**TRANSFORMERS_4, **changes})


def test_rope_scaling_raises_transformers_5():
    rope = {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0}
    with pytest.raises(ValueError, match="llama3"):
        ModelConfig.from_hf({**TRANSFORMERS_5, "rope_parameters": rope})


def test_from_dir_reports_missing_and_invalid_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json"):
        ModelConfig.from_dir(tmp_path)


# ---------------------------------------------------------------- load_weight


def hf_tensors(model_dir: Path = MODEL) -> Dict[str, torch.Tensor]:
    out: Dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def config_of(model_dir: Path) -> ModelConfig:
    """The checkpoint's config read field by field (transformers 4 or 5 layout, no rope scaling),
    so that the loading tests below judge load_weight alone, not from_hf too."""
    raw = json.loads((model_dir / "config.json").read_text())
    heads = raw["num_attention_heads"]
    eos = raw.get("eos_token_id")
    return ModelConfig(
        architecture={"Qwen3ForCausalLM": "qwen3", "LlamaForCausalLM": "llama"}[raw["architectures"][0]],
        vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"], num_layers=raw["num_hidden_layers"], num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads", heads),
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads, rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=float((raw.get("rope_parameters") or {}).get("rope_theta", raw.get("rope_theta", 10000.0))),
        max_position_embeddings=raw.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", False)),
        dtype=getattr(torch, raw.get("dtype") or raw.get("torch_dtype") or "bfloat16"),
        eos_token_id=eos[0] if isinstance(eos, list) else eos)


def empty_model(model_dir: Path = MODEL):
    """The model's ops on the meta device: the right names and shapes, no memory."""
    return create_model(config_of(model_dir), F32, torch.device("meta"))


def test_load_weight_produces_exactly_the_model_keys_with_merges():
    model = empty_model()
    state = load_weight(model, MODEL, CPU)
    assert set(state) == set(model.state_dict())
    hf = hf_tensors()
    for i in range(model.config.num_layers):
        p = f"model.layers.{i}."
        qkv = torch.cat([hf[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]).float()
        gate_up = torch.cat([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]]).float()
        assert torch.equal(state[p + "self_attn.qkv_proj.weight"], qkv)
        assert torch.equal(state[p + "mlp.gate_up_proj.weight"], gate_up)
        assert torch.equal(state[p + "input_layernorm.weight"], hf[p + "input_layernorm.weight"].float())
    # and the model now holds them, in its own dtype
    attn = model.model.layers[0].self_attn
    assert attn.qkv_proj.weight.dtype == F32 and attn.qkv_proj.weight.device.type == "cpu"
    assert torch.equal(attn.qkv_proj.weight, state["model.layers.0.self_attn.qkv_proj.weight"])


def copy_checkpoint(dst: Path, edit: Callable[[Dict[str, torch.Tensor]], None], src: Path = MODEL) -> Path:
    """Copy a checkpoint directory, changing its tensors with `edit`."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    tensors = hf_tensors(src)
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def load_into_fresh_model(model_dir: Path):
    model = empty_model(model_dir)
    load_weight(model, model_dir, CPU)
    return model


def test_a_missing_part_of_a_merged_weight_is_named(tmp_path):
    ckpt = copy_checkpoint(tmp_path, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(KeyError, match=r"layers\.1\.self_attn\.qkv_proj"):
        load_into_fresh_model(ckpt)


def test_a_missing_weight_is_named(tmp_path):
    ckpt = copy_checkpoint(tmp_path, lambda t: t.pop("model.norm.weight"))
    with pytest.raises(KeyError, match=r"model\.norm\.weight"):
        load_into_fresh_model(ckpt)


def test_an_extra_weight_is_named(tmp_path):
    def add(t):
        t["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(4, 4)

    with pytest.raises(KeyError, match=r"model\.layers\.0\.mlp\.extra_proj\.weight"):
        load_into_fresh_model(copy_checkpoint(tmp_path, add))


def test_a_wrongly_shaped_weight_is_named(tmp_path):
    def shrink(t):
        key = "model.layers.0.post_attention_layernorm.weight"
        t[key] = t[key][:-1].clone()

    with pytest.raises(ValueError, match=r"model\.layers\.0\.post_attention_layernorm\.weight"):
        load_into_fresh_model(copy_checkpoint(tmp_path, shrink))


def test_a_wrongly_shaped_part_of_a_merged_weight_is_named(tmp_path):
    def shrink(t):
        key = "model.layers.0.self_attn.v_proj.weight"
        t[key] = t[key][:-2].clone()

    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.qkv_proj"):
        load_into_fresh_model(copy_checkpoint(tmp_path, shrink))


def test_a_truncated_file_is_named(tmp_path):
    ckpt = copy_checkpoint(tmp_path, lambda t: None)
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors"):
        load_into_fresh_model(ckpt)


def test_no_safetensors_file_is_reported(tmp_path):
    shutil.copy(MODEL / "config.json", tmp_path / "config.json")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_into_fresh_model(tmp_path)


def test_a_sharded_checkpoint_loads_the_same(tmp_path):
    tensors = hf_tensors()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for fname, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / fname))
    weight_map = {k: fname for fname, keys in shards.items() for k in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shutil.copy(MODEL / "config.json", tmp_path / "config.json")
    whole = load_weight(empty_model(), MODEL, CPU)
    sharded = load_weight(empty_model(tmp_path), tmp_path, CPU)
    assert set(whole) == set(sharded)
    assert all(torch.equal(whole[k], sharded[k]) for k in whole)


# ---------------------------------------------------------------- the loaded model computes the right thing


def last_logits(model, prompts: List[List[int]]) -> torch.Tensor:
    """Run one prefill batch of `prompts` through a loaded model: each prompt's last-position logits."""
    cfg = model.config
    max_len = max(map(len, prompts))
    kv = KVCache(cfg.num_layers, len(prompts) * max_len, 1, cfg.num_kv_heads, cfg.head_dim, F32, CPU)
    backend = TorchAttentionBackend(kv, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    # request i keeps its tokens at locations i * max_len + position
    page_table = torch.arange(len(prompts) * max_len, dtype=torch.int32).view(len(prompts), max_len)
    reqs = [Req(torch.tensor(p, dtype=torch.int32), i, 0, 1, i, SamplingParams()) for i, p in enumerate(prompts)]
    batch = Batch(reqs, "prefill")
    batch.input_ids = torch.cat([r.input_ids for r in reqs])
    batch.positions = torch.cat([torch.arange(len(p)) for p in prompts])
    batch.out_loc = torch.cat([page_table[i, : len(p)] for i, p in enumerate(prompts)]).to(torch.int64)
    batch.attn_metadata = prepare_metadata(batch, page_table, CPU)
    saved = core._GLOBAL_CTX
    ctx = Context(1, kv, backend)
    core.set_global_ctx(ctx)
    try:
        with torch.no_grad(), ctx.forward_batch(batch):
            return model.forward()
    finally:
        core.set_global_ctx(saved)


def test_loaded_qwen3_matches_hf_logits():
    prompts = prompt_ids()[:2]
    got = last_logits(load_into_fresh_model(MODEL), prompts)
    for i, p in enumerate(prompts):
        torch.testing.assert_close(got[i], hf_logits(p)[-1], atol=1e-4, rtol=1e-4)


def test_llama_checkpoint_loads_and_matches_hf(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hf_cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=False, initializer_range=0.2)
    hf = LlamaForCausalLM(hf_cfg).eval()
    hf.save_pretrained(tmp_path)
    model = load_into_fresh_model(tmp_path)
    assert model.config.architecture == "llama" and not model.config.tie_word_embeddings
    assert "lm_head.weight" in model.state_dict()  # untied: a head of its own
    prompts = [[5, 17, 99, 3, 42, 8, 64], [1, 2, 3]]
    got = last_logits(model, prompts)
    with torch.no_grad():
        for i, p in enumerate(prompts):
            want = hf(torch.tensor([p])).logits[0, -1]
            assert want.std() > 0.1  # a check with teeth: the logits are not all near zero
            torch.testing.assert_close(got[i], want, atol=1e-4, rtol=1e-4)
