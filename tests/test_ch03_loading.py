"""Chapter 3: reading config.json (both transformers layouts) and streaming a checkpoint into the
engine's merged weights. A broken checkpoint must fail loudly, naming the key or file at fault."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Callable, Dict, List

import pytest
import torch
from safetensors.torch import load_file, save_file

import minisgl.core as core
from helpers import MODEL, hf_logits, prompt_ids
from minisgl.attention import TorchAttentionBackend, prepare_metadata
from minisgl.core import Batch, Context, Req, SamplingParams
from minisgl.kvcache import KVCache
from minisgl.models import ModelConfig, create_model, load_weight
from minisgl.models.config import RopeScaling
from refusals import refuses

CPU = torch.device("cpu")
F32 = torch.float32

BASE = {
    "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 1000,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "attention_bias": True,
    "eos_token_id": [7, 8],
}
# float16, not bfloat16: the default dtype must not pass for a dtype that was read
TRANSFORMERS_4 = {**BASE, "torch_dtype": "float16", "rope_theta": 1_000_000.0, "rope_scaling": None}
TRANSFORMERS_5 = {
    **BASE,
    "dtype": "float16",
    "rope_parameters": {"rope_theta": 1_000_000.0, "rope_type": "default"},
}
# what BASE in either layout means; no field has its default value
BASE_CONFIG = ModelConfig(
    architecture="qwen3",
    vocab_size=1000,
    hidden_size=128,
    intermediate_size=256,
    num_layers=3,
    num_heads=8,
    num_kv_heads=2,
    head_dim=32,
    rms_norm_eps=1e-5,
    rope_theta=1_000_000.0,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    attention_bias=True,
    dtype=torch.float16,
    eos_token_ids=(7, 8),
)
# only the fields without a default
MINIMAL = {
    "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 1000,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
}


def assert_config(got: ModelConfig, want: ModelConfig, what: str) -> None:
    """Field by field, naming the first field that differs."""
    for field in dataclasses.fields(ModelConfig):
        g, w = getattr(got, field.name), getattr(want, field.name)
        assert g == w and type(g) is type(w), f"{what}: expected {field.name}={w!r}, got {g!r}"


# ---------------------------------------------------------------- ModelConfig


def test_config_from_both_transformers_layouts_is_the_same():
    assert_config(
        ModelConfig.from_hf(TRANSFORMERS_4), BASE_CONFIG, "config.json in the transformers 4 layout"
    )
    assert_config(
        ModelConfig.from_hf(TRANSFORMERS_5), BASE_CONFIG, "config.json in the transformers 5 layout"
    )


def test_llama_config_is_recognized():
    cfg = ModelConfig.from_hf({**TRANSFORMERS_4, "architectures": ["LlamaForCausalLM"]})
    assert cfg.architecture == "llama", (
        f"LlamaForCausalLM: expected architecture 'llama', got {cfg.architecture!r}"
    )


@pytest.mark.parametrize(
    "archs,want",
    [
        (["GPT2LMHeadModel", "LlamaForCausalLM"], "llama"),
        # two supported: the first, not the last one a loop over them leaves behind
        (["Qwen2ForCausalLM", "LlamaForCausalLM"], "qwen2"),
    ],
    ids=["after an unsupported one", "two supported"],
)
def test_the_first_supported_architecture_is_used(archs, want):
    cfg = ModelConfig.from_hf({**TRANSFORMERS_5, "architectures": archs})
    assert cfg.architecture == want, (
        f"architectures {archs}: expected {want!r} (the first supported), got {cfg.architecture!r}"
    )


def test_config_defaults():
    want = dataclasses.replace(
        BASE_CONFIG,
        num_kv_heads=8,
        head_dim=128 // 8,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attention_bias=False,
        dtype=torch.bfloat16,
        eos_token_ids=(),
    )
    assert_config(ModelConfig.from_hf(MINIMAL), want, "a config.json with only the required fields")


@pytest.mark.parametrize("head_dim", ["absent", "null"])
def test_head_dim_defaults_to_hidden_size_over_query_heads(head_dim):
    # with grouped-query attention (8 query heads, 2 KV heads) the two possible divisions differ
    raw = {k: v for k, v in TRANSFORMERS_5.items() if k != "head_dim"}
    if head_dim == "null":
        raw["head_dim"] = None  # some files write it so
    cfg = ModelConfig.from_hf(raw)
    assert cfg.head_dim == 128 // 8, (
        f"head_dim {head_dim}, hidden 128, 8 query heads, 2 KV heads: expected head_dim 16, "
        f"got {cfg.head_dim!r}"
    )


@pytest.mark.parametrize(
    "fields,want",
    [
        ({"dtype": "float32"}, torch.float32),  # transformers 5
        ({"torch_dtype": "float32"}, torch.float32),  # transformers 4
        # both: dtype wins, as in transformers
        (
            {"dtype": "float16", "torch_dtype": "float32"},
            torch.float16,
        ),
        ({"dtype": None}, torch.bfloat16),  # written as null: the default
        ({"torch_dtype": None}, torch.bfloat16),
    ],
    ids=["dtype", "torch_dtype", "both", "dtype-null", "torch_dtype-null"],
)
def test_dtype_is_read_from_either_layout(fields, want):
    cfg = ModelConfig.from_hf({**MINIMAL, **fields})
    assert cfg.dtype == want, f"config.json with {fields}: expected dtype {want}, got {cfg.dtype!r}"


@pytest.mark.parametrize(
    "fields,want",
    [
        ({"rope_theta": 5e5}, 5e5),  # transformers 4
        ({"rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}, 5e5),  # transformers 5
        # transformers 5 files may repeat it at the top level; rope_parameters wins, as in
        # transformers
        ({"rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}, "rope_theta": 7e5}, 5e5),
        ({"rope_parameters": {"rope_type": "default"}, "rope_theta": 7e5}, 7e5),
    ],
    ids=["top-level", "rope_parameters", "both", "rope_parameters-without-theta"],
)
def test_rope_theta_is_read_from_either_layout(fields, want):
    cfg = ModelConfig.from_hf({**MINIMAL, **fields})
    assert cfg.rope_theta == want, (
        f"config.json with {fields}: expected rope_theta {want}, got {cfg.rope_theta!r}"
    )


def test_config_of_the_test_model_agrees_with_transformers():
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(MODEL)
    cfg = ModelConfig.from_dir(MODEL)
    got = (
        cfg.vocab_size,
        cfg.hidden_size,
        cfg.num_layers,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.rms_norm_eps,
        cfg.tie_word_embeddings,
        cfg.dtype,
    )
    want = (
        hf.vocab_size,
        hf.hidden_size,
        hf.num_hidden_layers,
        hf.num_attention_heads,
        hf.num_key_value_heads,
        hf.head_dim,
        hf.rms_norm_eps,
        hf.tie_word_embeddings,
        hf.dtype,
    )
    assert got == want, f"the test model's config: transformers reads {want}, got {got}"
    assert_config(cfg, config_of(MODEL), "the test model's config.json")


@pytest.mark.parametrize("arch", [["GPT2LMHeadModel"], [], None])
def test_unsupported_architecture_raises(arch):
    with refuses(
        ValueError,
        f"ModelConfig.from_hf with architectures {arch!r}",
        match="GPT2LMHeadModel" if arch else None,
    ):
        ModelConfig.from_hf({**TRANSFORMERS_5, "architectures": arch})


@pytest.mark.parametrize(
    "changes,name",
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),  # transformers 4
        # older transformers 4 files
        (
            {"rope_scaling": {"type": "linear", "factor": 2.0}},
            "linear",
        ),
    ],
)
def test_rope_scaling_raises_transformers_4(changes, name):
    with refuses(ValueError, f"ModelConfig.from_hf with {changes}", match=name):
        ModelConfig.from_hf({**TRANSFORMERS_4, **changes})


def test_rope_scaling_raises_transformers_5():
    rope = {"rope_theta": 500000.0, "rope_type": "yarn", "factor": 8.0}
    with refuses(ValueError, f"ModelConfig.from_hf with rope_parameters {rope}", match="yarn"):
        ModelConfig.from_hf({**TRANSFORMERS_5, "rope_parameters": rope})


LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@pytest.mark.parametrize("layout", ["transformers 4", "transformers 5"])
def test_llama3_rope_scaling_is_read_from_either_layout(layout):
    # Llama 3.1/3.2 checkpoints: transformers 4 writes rope_scaling next to a top-level rope_theta,
    # transformers 5 puts both in rope_parameters.
    if layout == "transformers 4":
        raw = {
            **TRANSFORMERS_4,
            "architectures": ["LlamaForCausalLM"],
            "rope_theta": 5e5,
            "rope_scaling": LLAMA3_ROPE,
        }
    else:
        raw = {
            **TRANSFORMERS_5,
            "architectures": ["LlamaForCausalLM"],
            "rope_parameters": {**LLAMA3_ROPE, "rope_theta": 5e5},
        }
    cfg = ModelConfig.from_hf(raw)
    want = RopeScaling(
        factor=32.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    assert cfg.rope_scaling == want, (
        f"{layout} with llama3 RoPE: expected rope_scaling={want}, got {cfg.rope_scaling!r}"
    )
    assert cfg.rope_theta == 5e5, (
        f"{layout} with llama3 RoPE: expected rope_theta 500000.0, got {cfg.rope_theta!r}"
    )


@pytest.mark.parametrize(
    "eos,want",
    [(7, (7,)), ([7, 8, 9], (7, 8, 9)), (None, ()), ([], ())],
    ids=["one", "list", "null", "empty-list"],
)
def test_every_eos_id_of_a_list_is_kept(eos, want):
    # Instruct checkpoints list several end ids (Llama-3.x: end of text, end of message, end of
    # turn).
    cfg = ModelConfig.from_hf({**MINIMAL, "eos_token_id": eos})
    assert cfg.eos_token_ids == want, (
        f"eos_token_id {eos!r}: expected eos_token_ids {want}, got {cfg.eos_token_ids!r}"
    )


def test_qwen2_and_null_kv_heads_are_read():
    cfg = ModelConfig.from_hf(
        {
            **MINIMAL,
            "architectures": ["Qwen2ForCausalLM"],
            "num_key_value_heads": None,
            "mlp_bias": True,
        }
    )
    got = (cfg.architecture, cfg.num_kv_heads, cfg.mlp_bias)
    assert got == ("qwen2", 8, True), (
        "Qwen2ForCausalLM, num_key_value_heads null, mlp_bias true: expected ('qwen2', 8, "
        f"True), got {got}"
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"rope_scaling": None},
        {"rope_scaling": {}},
        {"rope_scaling": {"rope_type": "default"}},
        {"rope_scaling": {"type": "default"}},
        {"rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}},
        {"rope_parameters": {"rope_theta": 5e5}},
        {"rope_parameters": {"rope_theta": 5e5, "rope_type": None}},
    ],
    ids=[
        "scaling-null",
        "scaling-empty",
        "scaling-default",
        "scaling-type-default",
        "parameters-default",
        "parameters-no-type",
        "parameters-type-null",
    ],
)
def test_plain_rope_is_accepted_in_every_spelling(fields):
    try:
        ModelConfig.from_hf({**MINIMAL, **fields})
    except ValueError as e:
        pytest.fail(f"config.json with {fields} is plain RoPE, but it was refused: {e}")


def test_from_dir_reports_missing_and_invalid_config(tmp_path):
    with refuses(
        FileNotFoundError,
        "ModelConfig.from_dir of a folder without config.json",
        match="config.json",
    ):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with refuses(
        ValueError, "ModelConfig.from_dir of a config.json that is not JSON", match="config.json"
    ):
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
        architecture={
            "Qwen3ForCausalLM": "qwen3",
            "LlamaForCausalLM": "llama",
            "Qwen2ForCausalLM": "qwen2",
        }[raw["architectures"][0]],
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads", heads),
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=float(
            (raw.get("rope_parameters") or {}).get("rope_theta", raw.get("rope_theta", 10000.0))
        ),
        max_position_embeddings=raw.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", False)),
        dtype=getattr(torch, raw.get("dtype") or raw.get("torch_dtype") or "bfloat16"),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
    )


def empty_model(model_dir: Path = MODEL):
    """The model's ops on the meta device: the right names and shapes, no memory."""
    return create_model(config_of(model_dir), F32, torch.device("meta"))


def test_load_weight_produces_exactly_the_model_keys_with_merges():
    model = empty_model()
    state = load_weight(model, MODEL, CPU)
    missing, extra = (
        sorted(set(model.state_dict()) - set(state)),
        sorted(set(state) - set(model.state_dict())),
    )
    assert not missing and not extra, (
        f"the state dict should have exactly the model's keys: missing {missing[:3]}, extra "
        f"{extra[:3]}"
    )
    hf = hf_tensors()
    for i in range(model.config.num_layers):
        p = f"model.layers.{i}."
        qkv = torch.cat([hf[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]).float()
        gate_up = torch.cat([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]]).float()
        assert torch.equal(state[p + "self_attn.qkv_proj.weight"], qkv), (
            f"{p}self_attn.qkv_proj.weight should be q_proj, k_proj and v_proj stacked in that "
            "order"
        )
        assert torch.equal(state[p + "mlp.gate_up_proj.weight"], gate_up), (
            f"{p}mlp.gate_up_proj.weight should be gate_proj and up_proj stacked in that order"
        )
        assert torch.equal(
            state[p + "input_layernorm.weight"], hf[p + "input_layernorm.weight"].float()
        ), f"{p}input_layernorm.weight should be the checkpoint's tensor"
    # and the model now holds them, in its own dtype
    attn = model.model.layers[0].self_attn
    w = attn.qkv_proj.weight
    assert w.dtype == F32 and w.device.type == "cpu", (
        f"the model's layer 0 qkv_proj.weight should be float32 on cpu, got {w.dtype} on {w.device}"
    )
    assert torch.equal(w, state["model.layers.0.self_attn.qkv_proj.weight"]), (
        "the model should hold the loaded weights (load_state_dict), not its own"
    )


def copy_checkpoint(
    dst: Path, edit: Callable[[Dict[str, torch.Tensor]], None], src: Path = MODEL
) -> Path:
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
    with refuses(
        KeyError,
        "load_weight of a checkpoint without layer 1's k_proj",
        match=r"layers\.1\.self_attn\.qkv_proj",
    ):
        load_into_fresh_model(ckpt)


def test_a_missing_weight_is_named(tmp_path):
    ckpt = copy_checkpoint(tmp_path, lambda t: t.pop("model.norm.weight"))
    with refuses(
        KeyError,
        "load_weight of a checkpoint without model.norm.weight",
        match=r"model\.norm\.weight",
    ):
        load_into_fresh_model(ckpt)


def test_an_extra_weight_is_named(tmp_path):
    def add(t):
        t["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(4, 4)

    with refuses(
        KeyError,
        "load_weight of a checkpoint with an extra model.layers.0.mlp.extra_proj.weight",
        match=r"model\.layers\.0\.mlp\.extra_proj\.weight",
    ):
        load_into_fresh_model(copy_checkpoint(tmp_path, add))


def test_a_wrongly_shaped_weight_is_named(tmp_path):
    def shrink(t):
        key = "model.layers.0.post_attention_layernorm.weight"
        t[key] = t[key][:-1].clone()

    with refuses(
        ValueError,
        "load_weight of a checkpoint whose layer 0 post_attention_layernorm is one short",
        match=r"model\.layers\.0\.post_attention_layernorm\.weight",
    ):
        load_into_fresh_model(copy_checkpoint(tmp_path, shrink))


def test_a_wrongly_shaped_part_of_a_merged_weight_is_named(tmp_path):
    def shrink(t):
        key = "model.layers.0.self_attn.v_proj.weight"
        t[key] = t[key][:-2].clone()

    with refuses(
        ValueError,
        "load_weight of a checkpoint whose layer 0 v_proj is two rows short",
        match=r"model\.layers\.0\.self_attn\.qkv_proj",
    ):
        load_into_fresh_model(copy_checkpoint(tmp_path, shrink))


def test_a_transposed_part_of_a_merged_weight_is_named(tmp_path):
    # k_proj stored [in, out] instead of [out, in]: the parts no longer fit together along dim 0.
    def transpose(t):
        key = "model.layers.1.self_attn.k_proj.weight"
        t[key] = t[key].t().contiguous()

    try:
        load_into_fresh_model(copy_checkpoint(tmp_path, transpose))
    except ValueError as e:
        assert "layers.1.self_attn.qkv_proj" in str(e), (
            f"the error should name layers.1.self_attn.qkv_proj, got: {e}"
        )
    except Exception as e:  # noqa: BLE001 - torch.cat's RuntimeError names no weight
        pytest.fail(
            "a transposed k_proj should be a ValueError naming the merged weight, got "
            f"{type(e).__name__}: {e}"
        )
    else:
        pytest.fail("a checkpoint with a transposed k_proj loaded without an error")


def test_a_truncated_file_is_named(tmp_path):
    ckpt = copy_checkpoint(tmp_path, lambda t: None)
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with refuses(
        ValueError, "load_weight of a model.safetensors cut in half", match="model.safetensors"
    ):
        load_into_fresh_model(ckpt)


def test_no_safetensors_file_is_reported(tmp_path):
    shutil.copy(MODEL / "config.json", tmp_path / "config.json")
    with refuses(
        FileNotFoundError,
        "load_weight of a folder without a .safetensors file",
        match="safetensors",
    ):
        load_into_fresh_model(tmp_path)


def test_a_sharded_checkpoint_loads_the_same(tmp_path):
    tensors = hf_tensors()
    # The first shard holds one whole merged weight, so a merge completes before any other tensor
    # is read; the parts of the other merges are spread over two shards.
    first = ["model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"]
    names = sorted(set(tensors) - set(first))
    shards = {
        "model-00001-of-00003.safetensors": first,
        "model-00002-of-00003.safetensors": names[::2],
        "model-00003-of-00003.safetensors": names[1::2],
    }
    for fname, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / fname))
    weight_map = {k: fname for fname, keys in shards.items() for k in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shutil.copy(MODEL / "config.json", tmp_path / "config.json")
    whole = load_weight(empty_model(), MODEL, CPU)
    sharded = load_weight(empty_model(tmp_path), tmp_path, CPU)
    assert set(whole) == set(sharded), (
        f"a sharded copy gave other keys: {sorted(set(whole) ^ set(sharded))[:3]}..."
    )
    differ = [k for k in whole if not torch.equal(whole[k], sharded[k])]
    assert not differ, f"a sharded copy loads {len(differ)} weight(s) differently, e.g. {differ[0]}"


def test_a_stray_part_of_a_merged_weight_is_named(tmp_path):
    # A q_proj bias alone, in a model without biases: its merge never completes and the model has no
    # such weight, so only the check for unfinished merges can catch it. It must not be dropped
    # silently.
    ckpt = copy_checkpoint(
        tmp_path, lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(8)})
    )
    try:
        load_into_fresh_model(ckpt)
    except KeyError as e:
        assert "layers.0.self_attn" in str(e), f"the error should name the stray weight, got: {e}"
        return
    pytest.fail(
        "a checkpoint with a stray model.layers.0.self_attn.q_proj.bias loaded: expected a KeyError"
    )


def save_config(model_dir: Path, **changes) -> None:
    path = model_dir / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("extra", ["rotary_emb.inv_freq", "lm_head.weight"])
def test_extra_tensors_of_a_tied_checkpoint_are_skipped(tmp_path, extra):
    # Old checkpoints saved RoPE's inverse frequencies; some tied ones still carry a copy of the
    # head. Neither is a weight of the engine's model (the bundled one is tied): both must be
    # skipped.
    def add(t):
        if extra == "lm_head.weight":
            t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()
        else:
            for i in range(config_of(MODEL).num_layers):
                t[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = torch.ones(16)

    ckpt = copy_checkpoint(tmp_path, add)
    try:
        state = load_weight(empty_model(ckpt), ckpt, CPU)
    except (KeyError, ValueError) as e:
        pytest.fail(f"a tied checkpoint with {extra} must load (skip it), but: {e}")
    assert not [k for k in state if k.endswith(extra)], (
        f"{extra} should be skipped, not put in the state dict"
    )


def test_biases_of_merged_projections_are_merged_too(tmp_path):
    # With attention_bias, q/k/v (and o) have biases; q/k/v's are merged into qkv_proj.bias like the
    # weights.
    g = torch.Generator().manual_seed(0)
    cfg = config_of(MODEL)
    sizes = {
        "q": cfg.num_heads * cfg.head_dim,
        "k": cfg.num_kv_heads * cfg.head_dim,
        "v": cfg.num_kv_heads * cfg.head_dim,
        "o": cfg.hidden_size,
    }

    def add(t):
        for i in range(cfg.num_layers):
            for n, size in sizes.items():
                t[f"model.layers.{i}.self_attn.{n}_proj.bias"] = torch.randn(size, generator=g)

    ckpt = copy_checkpoint(tmp_path, add)
    save_config(ckpt, attention_bias=True)
    hf = hf_tensors(ckpt)
    try:
        state = load_weight(empty_model(ckpt), ckpt, CPU)
    except (KeyError, ValueError) as e:
        pytest.fail(f"a checkpoint with q/k/v/o biases (attention_bias) must load, but: {e}")
    for i in range(cfg.num_layers):
        key = f"model.layers.{i}.self_attn.qkv_proj.bias"
        want = torch.cat([hf[f"model.layers.{i}.self_attn.{n}_proj.bias"] for n in "qkv"])
        assert key in state and torch.equal(state[key], want), (
            f"{key} should be the q, k and v biases, in that order"
        )


def test_a_part_of_a_merged_weight_seen_twice_is_refused(tmp_path):
    # Two shards both hold layer 0's q_proj: the second copy arrives while its merge is still
    # waiting for v_proj. Keeping either copy silently could load the wrong one.
    tensors = hf_tensors()
    dup = "model.layers.0.self_attn.q_proj.weight"
    save_file({dup: tensors[dup]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(tensors, str(tmp_path / "model-00002-of-00002.safetensors"))
    weight_map = {k: "model-00002-of-00002.safetensors" for k in tensors}
    weight_map[dup] = "model-00001-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shutil.copy(MODEL / "config.json", tmp_path / "config.json")
    try:
        load_weight(empty_model(tmp_path), tmp_path, CPU)
    except ValueError as e:
        assert "layers.0.self_attn" in str(e), (
            f"the error should name the weight seen twice, got: {e}"
        )
        return
    pytest.fail(f"{dup} is in the checkpoint twice: expected a ValueError, it loaded")


# ---------------------------------------------------------------- the loaded model computes the
# right thing


def last_logits(model, prompts: List[List[int]]) -> torch.Tensor:
    """Run one prefill batch of `prompts` through a loaded model: each prompt's last-position
    logits."""
    cfg = model.config
    max_len = max(map(len, prompts))
    kv = KVCache(
        cfg.num_layers, len(prompts) * max_len, 1, cfg.num_kv_heads, cfg.head_dim, F32, CPU
    )
    backend = TorchAttentionBackend(kv, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    # request i keeps its tokens at locations i * max_len + position
    page_table = torch.arange(len(prompts) * max_len, dtype=torch.int32).view(len(prompts), max_len)
    reqs = [
        Req(torch.tensor(p, dtype=torch.int32), i, 0, 1, i, SamplingParams())
        for i, p in enumerate(prompts)
    ]
    batch = Batch(reqs, "prefill")
    batch.input_ids = torch.cat([r.input_ids for r in reqs])
    batch.positions = torch.cat([torch.arange(len(p)) for p in prompts])
    batch.out_loc = torch.cat([page_table[i, : len(p)] for i, p in enumerate(prompts)]).to(
        torch.int64
    )
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
        torch.testing.assert_close(
            got[i],
            hf_logits(p)[-1],
            atol=1e-4,
            rtol=1e-4,
            msg=lambda m: (
                f"prompt {i}: the loaded model's last logits differ from transformers': {m}"
            ),
        )


def test_llama_checkpoint_loads_and_matches_hf(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hf_cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        initializer_range=0.2,
    )
    hf = LlamaForCausalLM(hf_cfg).eval()
    hf.save_pretrained(tmp_path)
    model = load_into_fresh_model(tmp_path)
    assert model.config.architecture == "llama" and not model.config.tie_word_embeddings, (
        "a Llama, untied"
    )
    assert "lm_head.weight" in model.state_dict(), "an untied model has a head of its own"
    prompts = [[5, 17, 99, 3, 42, 8, 64], [1, 2, 3]]
    got = last_logits(model, prompts)
    with torch.no_grad():
        for i, p in enumerate(prompts):
            want = hf(torch.tensor([p])).logits[0, -1]
            assert want.std() > 0.1, (
                "the test model's logits are all near zero: the test has no teeth"
            )
            torch.testing.assert_close(
                got[i],
                want,
                atol=1e-4,
                rtol=1e-4,
                msg=lambda m: (
                    f"prompt {i}: the loaded Llama's last logits differ from transformers': {m}"
                ),
            )


def test_weights_land_on_the_requested_device_in_the_models_dtype():
    # A float64 model and the meta device: neither is the checkpoint's (bfloat16, read on the CPU),
    # so a weight that kept the file's dtype or stayed where it was read shows up. (Last in the
    # file: torch.cat on the meta device imports torch._dynamo, which the transformers tests above
    # load anyway.)
    model = create_model(config_of(MODEL), torch.float64, torch.device("meta"))
    state = load_weight(model, MODEL, torch.device("meta"))
    for what, weights in (("the returned state dict", state), ("the model", model.state_dict())):
        wrong = {
            k: f"{t.dtype} on {t.device}"
            for k, t in weights.items()
            if (t.dtype, t.device.type) != (torch.float64, "meta")
        }
        assert not wrong, (
            f"{what}: {len(wrong)} weight(s) not float64 on the requested meta device, "
            f"e.g. {next(iter(wrong))}: {next(iter(wrong.values()))}"
        )
