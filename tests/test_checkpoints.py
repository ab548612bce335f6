"""Real checkpoints load right or are refused.

- The parity matrix: small random checkpoints that transformers wrote (tests/checkpoints.py: Qwen3,
  Llama, Qwen2, Mistral, Qwen3-MoE (more of it in test_moe.py); tied and untied, bfloat16,
  head_dim != hidden / heads, one KV head, biases, Llama-3 RoPE scaling, sharded, the
  transformers-4 layout, a Mistral window null or longer than the context) give transformers'
  greedy tokens in every mode: overlap on and off, page sizes 1 and 4, chunked prefill, the
  naive cache and a warm radix cache.
- Every field of the supported architectures' configs is either read, refused unless harmless, or
  known to change nothing (minisgl/models/config.py), and a refused one is named.
- End of generation as transformers does it: every id of an EOS list, generation_config.json.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from checkpoints import RECIPES, checkpoint
from helpers import assert_tokens_equal, build_llm, greedy, hf_greedy
from minisgl import SamplingParams
from minisgl.env import ENV
from minisgl.llm import LLM
from minisgl.models.config import NO_EFFECT_FIELDS, READ_FIELDS, REFUSED_FIELDS, ModelConfig

NEW_TOKENS = 8


def prompts():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 256, (24,), generator=g).tolist()
    # the third shares the second's first 12 tokens: the radix cache has something to find
    return [ids[:5], ids[5:24], ids[5:17] + ids[:3]]


# ---------------------------------------------------------------- the parity matrix

MODES = {
    "overlap, page 1, radix cache (cold, then warm)": dict(page_size=1, cache_type="radix"),
    "normal loop, page 4, chunked prefill, naive cache": dict(
        page_size=4, cache_type="naive", max_extend_tokens=8
    ),
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_greedy_tokens_equal_transformers_in_every_mode(name):
    ckpt = checkpoint(name)
    want = hf_greedy(prompts(), NEW_TOKENS, model=ckpt)
    for mode, options in MODES.items():
        ENV.DISABLE_OVERLAP_SCHEDULING.value = mode.startswith("normal")  # put back by conftest
        llm = build_llm(ckpt, **options)
        runs = 2 if options["cache_type"] == "radix" else 1
        for run in range(runs):
            got = [o["token_ids"] for o in llm.generate(prompts(), greedy(NEW_TOKENS))]
            assert_tokens_equal(got, want, f"checkpoint {name}, {mode}, run {run + 1}")
        llm.shutdown()
        llm.cache_manager.check_integrity()


def test_the_matrix_has_teeth():
    # Each variant must change what the model computes; otherwise its row proves nothing. The
    # llama3 RoPE variant, read as plain RoPE, must give other tokens than transformers.
    ckpt = checkpoint("llama3-rope")
    want = hf_greedy(prompts(), NEW_TOKENS, model=ckpt)
    plain = ckpt.parent / (ckpt.name + "-read-as-plain-rope")
    if not plain.is_dir():
        shutil.copytree(ckpt, plain)
        raw = json.loads((plain / "config.json").read_text())
        raw["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "default"}
        (plain / "config.json").write_text(json.dumps(raw))
    got = [o["token_ids"] for o in build_llm(plain).generate(prompts(), greedy(NEW_TOKENS))]
    assert got != want, (
        "llama3 RoPE scaling read as plain RoPE still gives transformers' tokens: the test model "
        "is too small to show the scaling"
    )


# ---------------------------------------------------------------- every config field decided


def test_every_config_field_of_the_supported_architectures_is_decided():
    import transformers

    undecided = {}
    for cls_name in (
        "Qwen3Config",
        "LlamaConfig",
        "Qwen2Config",
        "MistralConfig",
        "Qwen3MoeConfig",
    ):
        fields = set(getattr(transformers, cls_name)().to_dict())
        rest = sorted(fields - READ_FIELDS - REFUSED_FIELDS - NO_EFFECT_FIELDS)
        if rest:
            undecided[cls_name] = rest
    assert not undecided, (
        f"config fields the engine neither reads, refuses nor lists as harmless "
        f"(minisgl/models/config.py): {undecided}"
    )


def test_the_field_lists_do_not_overlap():
    both = (
        (READ_FIELDS & REFUSED_FIELDS)
        | (READ_FIELDS & NO_EFFECT_FIELDS)
        | (REFUSED_FIELDS & NO_EFFECT_FIELDS)
    )
    assert not both, f"a config field is in two of the lists: {sorted(both)}"


REFUSED = [
    ({"hidden_act": "gelu_pytorch_tanh"}, "hidden_act"),
    ({"use_sliding_window": True, "sliding_window": 16}, "use_sliding_window"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"pretraining_tp": 2}, "pretraining_tp"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}}, "yarn"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0}}, "factor"),
    ({"vocab_size": None}, "vocab_size"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"dtype": "float8_e4m3fn"}, "dtype"),
    ({"eos_token_id": "2"}, "eos_token_id"),
    # values of the wrong type or range that a float() or bool() would quietly accept
    ({"rms_norm_eps": "1e-6"}, "rms_norm_eps"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": -1.0}}, "rope_theta"),
    ({"max_position_embeddings": 0}, "max_position_embeddings"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
    ({"attention_bias": 1}, "attention_bias"),
    ({"architectures": None}, "architectures"),
    ({"architectures": "Qwen3ForCausalLM"}, "architectures"),
    ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
    ({"sliding_window": "4096"}, "sliding_window"),
    # this file has rope_parameters (transformers 5); a transformers-4 entry saying otherwise
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling"),
]


@pytest.mark.parametrize("fields,named", REFUSED, ids=[str(f) for f, _ in REFUSED])
def test_a_config_the_engine_would_run_wrongly_is_refused_naming_the_field(tmp_path, fields, named):
    model = tmp_path / "model"
    shutil.copytree(checkpoint("qwen3"), model)
    raw = json.loads((model / "config.json").read_text())
    raw.update(fields)
    (model / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError) as e:
        LLM(model, device="cpu")
    assert named in str(e.value), (
        f"config.json with {fields}: the error should name {named!r}, got: {e.value}"
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"hidden_act": "swish"},
        {"use_sliding_window": False, "sliding_window": 4096},
        {"layer_types": ["full_attention", "full_attention"]},
        {"pretraining_tp": 1},
        {"partial_rotary_factor": 1.0},
        {"num_key_value_heads": None},
    ],
    ids=["swish", "window-off", "full-layers", "tp1", "partial-1", "kv-null"],
)
def test_harmless_values_of_refused_fields_are_accepted(tmp_path, fields):
    # Real files carry these (Qwen3 writes sliding_window 4096 with use_sliding_window false).
    model = tmp_path / "model"
    shutil.copytree(checkpoint("qwen3"), model)
    raw = json.loads((model / "config.json").read_text())
    raw.update(fields)
    (model / "config.json").write_text(json.dumps(raw))
    try:
        ModelConfig.from_dir(model)
    except ValueError as e:
        pytest.fail(f"config.json with {fields} changes nothing, but it was refused: {e}")


# ---------------------------------------------------------------- checkpoint files


def test_two_complete_safetensors_files_without_an_index_are_refused(tmp_path):
    src = checkpoint("qwen3")
    shutil.copy(src / "config.json", tmp_path)
    tensors = load_file(str(src / "model.safetensors"))
    save_file(tensors, str(tmp_path / "a.safetensors"))
    # e.g. a fine-tune
    save_file({k: v + 1 for k, v in tensors.items()}, str(tmp_path / "b.safetensors"))
    with pytest.raises(ValueError) as e:
        LLM(tmp_path, device="cpu")
    assert "a.safetensors" in str(e.value) and "b.safetensors" in str(e.value), (
        f"the error should name both files that hold the same weight, got: {e.value}"
    )


def test_weights_split_across_files_without_an_index_load(tmp_path):
    src = checkpoint("qwen3")
    shutil.copy(src / "config.json", tmp_path)
    tensors = load_file(str(src / "model.safetensors"))
    keys = sorted(tensors)
    save_file({k: tensors[k] for k in keys[::2]}, str(tmp_path / "a.safetensors"))
    save_file({k: tensors[k] for k in keys[1::2]}, str(tmp_path / "b.safetensors"))
    got = [o["token_ids"] for o in build_llm(tmp_path).generate(prompts(), greedy(NEW_TOKENS))]
    assert_tokens_equal(
        got, hf_greedy(prompts(), NEW_TOKENS, model=src), "weights split over two files, no index"
    )


def _two_set_to(value):
    def change(t):
        t = t.clone()
        t[0, :2] = value
        return t

    return change


@pytest.mark.parametrize(
    "change,words",
    [
        (_two_set_to(float("nan")), "holds 2 NaN or infinite value"),
        (_two_set_to(float("inf")), "holds 2 NaN or infinite value"),
        (lambda t: t.to(torch.int32), "is int32"),
        (lambda t: t.to(torch.float8_e4m3fn), "is float8_e4m3fn"),
    ],
    ids=["nan", "inf", "int32", "float8"],
)
def test_a_weight_the_engine_would_compute_garbage_from_is_named(tmp_path, change, words):
    # Cast to the model's dtype, an integer or 8-bit weight becomes numbers; a NaN makes every
    # logit NaN, sampled as token 0. Either way the output looks like a model's: refuse it.
    src = checkpoint("qwen3")
    shutil.copy(src / "config.json", tmp_path)
    tensors = load_file(str(src / "model.safetensors"))
    key = "model.layers.1.mlp.down_proj.weight"
    tensors[key] = change(tensors[key])
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=words) as e:
        LLM(tmp_path, device="cpu")
    assert key in str(e.value), f"the error should name the weight, got: {e.value}"


def test_a_pytorch_bin_checkpoint_says_what_to_do(tmp_path):
    src = checkpoint("qwen3")
    shutil.copy(src / "config.json", tmp_path)
    torch.save(load_file(str(src / "model.safetensors")), tmp_path / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin found.*save_pretrained"):
        LLM(tmp_path, device="cpu")


def test_a_transposed_part_of_a_merged_weight_is_named(tmp_path):
    src = checkpoint("qwen3")  # q_proj is 64 x 64: square; k_proj (32 x 64) transposed does not fit
    shutil.copy(src / "config.json", tmp_path)
    tensors = load_file(str(src / "model.safetensors"))
    key = "model.layers.1.self_attn.k_proj.weight"
    tensors[key] = tensors[key].t().contiguous()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError) as e:
        LLM(tmp_path, device="cpu")
    assert "layers.1.self_attn" in str(e.value), f"the error should name the weight, got: {e.value}"


# ---------------------------------------------------------------- end of generation


def with_generation_config(tmp_path: Path, name: str, **fields) -> Path:
    model = tmp_path / name
    shutil.copytree(checkpoint("qwen3"), model)
    (model / "generation_config.json").write_text(json.dumps(fields))
    return model


def test_generation_stops_at_any_id_of_an_eos_list(tmp_path):
    # The reference continuation of prompt 0 without an EOS; then its 4th token becomes one of two
    # end ids (the other never comes): generation stops right after it, as transformers does.
    ref = hf_greedy(prompts(), NEW_TOKENS, model=checkpoint("qwen3"))[0]
    end = ref[3]
    k = ref.index(end)
    other = next(t for t in range(3, 256) if t not in ref)
    model = with_generation_config(tmp_path, "eos-list", eos_token_id=[other, end])
    out = build_llm(model).generate([prompts()[0]], SamplingParams(max_tokens=NEW_TOKENS))[0][
        "token_ids"
    ]
    assert out == ref[: k + 1], (
        f"end ids [{other}, {end}] in generation_config.json: expected the output to stop "
        f"after token {end}: {ref[: k + 1]}, got {out}"
    )
    ignored = build_llm(model).generate(
        [prompts()[0]], SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    )
    assert ignored[0]["token_ids"] == ref, "ignore_eos must run to max_tokens whatever the end ids"


def test_generation_config_eos_replaces_the_config_json_one(tmp_path):
    # config.json says 2; generation_config.json's list wins, as in transformers.
    model = with_generation_config(tmp_path, "eos-gen", eos_token_id=[5, 6])
    raw = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**raw, "eos_token_id": 2}))
    assert build_llm(model).eos_token_ids == {5, 6}, (
        "generation_config.json's eos_token_id should be used"
    )
    (model / "generation_config.json").unlink()
    assert build_llm(model).eos_token_ids == {2}, (
        "without generation_config.json, config.json's eos_token_id"
    )


def test_generation_config_sampling_defaults_fill_only_unset_fields(tmp_path):
    model = with_generation_config(
        tmp_path,
        "sampling",
        do_sample=True,
        temperature=0.6,
        top_k=20,
        top_p=0.95,
        max_new_tokens=5,
    )
    llm = build_llm(model)
    chosen = SamplingParams(temperature=0.0, ignore_eos=True, fields_set=["temperature"])
    params = chosen.with_defaults(llm.limits.sampling_defaults)
    got = (params.temperature, params.top_k, params.top_p, params.max_tokens)
    assert got == (0.0, 20, 0.95, 5), (
        "temperature set to 0, the rest from generation_config.json: expected (0.0, 20, 0.95, "
        f"5), got {got}"
    )
    # and generate applies them to the fields its keywords leave out: greedy (set), 5 tokens (the
    # file's max_new_tokens)
    ref = hf_greedy(prompts(), NEW_TOKENS, model=checkpoint("qwen3"))[0]
    out = llm.generate([prompts()[0]], temperature=0.0, ignore_eos=True)[0]["token_ids"]
    assert out == ref[:5], f"greedy with the file's max_new_tokens 5: expected {ref[:5]}, got {out}"
    # a SamplingParams given whole means what it says: its max_tokens (16), not the file's 5
    whole = llm.generate([prompts()[0]], SamplingParams(temperature=0.0, ignore_eos=True))
    got = len(whole[0]["token_ids"])
    assert got == 16, f"SamplingParams() given whole keeps max_tokens 16, got {got} tokens"
    greedy_file = with_generation_config(tmp_path, "greedy", do_sample=False, temperature=0.6)
    out = build_llm(greedy_file).generate([prompts()[0]], max_tokens=NEW_TOKENS, ignore_eos=True)
    assert out[0]["token_ids"] == ref, "do_sample false in generation_config.json means greedy"


def test_a_broken_generation_config_is_named(tmp_path):
    model = with_generation_config(tmp_path, "broken", do_sample=True, temperature=-1)
    with pytest.raises(ValueError) as e:
        LLM(model, device="cpu")
    assert "generation_config.json" in str(e.value) and "temperature" in str(e.value), (
        f"the error should name the file and the field, got: {e.value}"
    )


# ---------------------------------------------------------------- the architecture first


@pytest.mark.parametrize(
    "cls_name,arch",
    [("GPT2Config", "GPT2LMHeadModel"), ("Qwen3Config", "GPTNeoXForCausalLM")],
    ids=["gpt2", "unknown-with-qwen3-fields"],
)
def test_an_unsupported_architecture_is_named_before_any_field(tmp_path, cls_name, arch):
    # A GPT-2 config has none of the fields a Llama-style one has (n_embd, not hidden_size): the
    # first thing wrong is that the engine has no such model, and the error says so, naming the
    # models it has, rather than a missing field.
    import transformers

    raw = getattr(transformers, cls_name)(architectures=[arch]).to_dict()
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError) as e:
        ModelConfig.from_dir(tmp_path)
    message = str(e.value)
    assert arch in message and "LlamaForCausalLM" in message, (
        f"the error should name the architecture {arch!r} and the supported ones, got: {message}"
    )
    assert "hidden_size" not in message and "must be" not in message, (
        f"the architecture comes first, before field problems, got: {message}"
    )


# ---------------------------------------------------------------- Mistral's sliding window


def windowed_mistral(tmp_path, window: int) -> Path:
    model = tmp_path / f"mistral-window-{window}"
    if not model.is_dir():
        shutil.copytree(checkpoint("mistral"), model)
        raw = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**raw, "sliding_window": window}))
    return model


def test_a_mistral_window_shorter_than_the_context_length_is_refused_by_name(tmp_path):
    # Past the window a token would see more than the model was built to: plausible, wrong tokens.
    with pytest.raises(ValueError) as e:
        LLM(windowed_mistral(tmp_path, 16), device="cpu", max_seq_len_override=17)
    message = str(e.value)
    assert "MistralForCausalLM" in message and "sliding_window=16" in message, (
        f"the error should name the architecture and its window, got: {message}"
    )
    assert "context length 17" in message and "max_seq_len_override <= 16" in message, (
        f"the error should say the context length and how to run it exactly, got: {message}"
    )


def test_a_mistral_window_covering_the_context_length_gives_transformers_tokens(tmp_path):
    # A context of at most the window: every token sees all before it, as Llama's math does. The
    # window matters (the test has teeth): past it, transformers' tokens differ from the full view.
    model = windowed_mistral(tmp_path, 8)
    short, long_ = [prompts()[0][:4]], [prompts()[1]]
    llm = build_llm(model, max_seq_len_override=8)
    got = [o["token_ids"] for o in llm.generate(short, greedy(4))]
    assert_tokens_equal(got, hf_greedy(short, 4, model=model), "Mistral, window 8, context 8")
    full = hf_greedy(long_, NEW_TOKENS, model=checkpoint("mistral"))
    assert hf_greedy(long_, NEW_TOKENS, model=model) != full, (
        "a window of 8 under a 19-token prompt should change transformers' tokens: the test "
        "model is too small to show the window"
    )
