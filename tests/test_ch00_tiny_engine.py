"""Chapter 0: the one-file engine. Each piece of math against Hugging Face's (or a plain torch
formula), then whole greedy generations token for token."""

from __future__ import annotations

import dataclasses
import json
import shutil
from contextlib import contextmanager
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

import minisgl.tiny_engine as te  # used as te.name so the judge's swapped-in functions are seen
from helpers import MODEL, assert_tokens_equal, hf_greedy, hf_logits, prompt_ids


@pytest.fixture(scope="module")
def model():
    return te.load(MODEL)


def test_load_reads_both_config_layouts(tmp_path):
    # transformers 4 wrote `torch_dtype` and a top-level `rope_theta`; 5 writes `dtype` and
    # `rope_parameters`. Write the checkpoint's config both ways, with a theta that is not the
    # default 10000 (the bundled model's): the same model comes out of both.
    raw = json.loads((MODEL / "config.json").read_text())
    raw.pop("rope_theta", None)
    theta = 12345.0
    layouts = {
        "new": {
            **raw,
            "rope_parameters": {**(raw.get("rope_parameters") or {}), "rope_theta": theta},
        },
        "old": {
            **{k: v for k, v in raw.items() if k not in ("rope_parameters", "dtype")},
            "torch_dtype": raw.get("dtype", "bfloat16"),
            "rope_theta": theta,
        },
    }
    models = {}
    for name, config in layouts.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        for f in MODEL.glob("*.safetensors"):
            shutil.copy(f, tmp_path / name / f.name)
        models[name] = te.load(tmp_path / name)
    assert models["old"].config == models["new"].config and models["new"].config.rope_theta == theta
    assert models["old"].weights.keys() == models["new"].weights.keys()


def test_rms_norm_matches_hf():
    torch.manual_seed(0)
    hf = Qwen3RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(64))
    x = torch.randn(5, 3, 64) * 4
    torch.testing.assert_close(
        te.rms_norm(x, hf.weight.data, 1e-6),
        hf(x).detach(),
        msg="rms_norm differs from Hugging Face's Qwen3RMSNorm in float32",
    )


def test_rms_norm_uses_eps_and_float32():
    # All-zero input: only eps keeps the result finite.
    w = torch.ones(8)
    zeros = te.rms_norm(torch.zeros(2, 8), w, 1e-6)
    assert torch.equal(zeros, torch.zeros(2, 8)), (
        "an all-zero vector must stay zero (eps keeps 0 / 0 away)"
    )
    # bf16 input: computed in float32 and cast back to bfloat16 before the weight, as Hugging Face
    # does, the result is Hugging Face's to the last bit. bfloat16 arithmetic anywhere on the way
    # (the squares, the mean, the scaling, or the product with the weight) changes a good share of
    # them.
    torch.manual_seed(5)
    hf = Qwen3RMSNorm(128, eps=1e-6)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(128) * 0.5 + 1)
    hf = hf.to(torch.bfloat16)
    x = (torch.randn(64, 128) * 3).bfloat16()
    got = te.rms_norm(x, hf.weight.data, 1e-6)
    assert got.dtype == torch.bfloat16, f"bfloat16 input must give bfloat16 output, got {got.dtype}"
    differ = (got != hf(x).detach()).float().mean().item()
    assert differ < 0.005, (
        f"in bfloat16, {differ:.1%} of the outputs differ from Hugging Face's: compute in "
        "float32 and cast back to x's dtype before multiplying by the weight"
    )


def hf_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Hugging Face's cos/sin construction (float32, cast to x's dtype) and rotation, for
    x [tokens, heads, head_dim]."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)  # [tokens, dim]
    out, _ = apply_rotary_pos_emb(
        x, x, emb.cos().to(x.dtype), emb.sin().to(x.dtype), unsqueeze_dim=1
    )
    return out


@pytest.mark.parametrize("theta", [10000.0, 1_000_000.0])
def test_apply_rope_matches_hf(theta):
    torch.manual_seed(1)
    x = torch.randn(7, 4, 32)
    positions = torch.tensor([0, 1, 7, 3, 100, 255, 1001])  # 1001: not a bfloat16 number
    # A float32 angle near 1000 radians is only good to ~1e-4: angles in float64 may differ that
    # much.
    torch.testing.assert_close(
        te.apply_rope(x, positions, theta),
        hf_rope(x, positions, theta),
        atol=1e-4,
        rtol=1e-4,
        msg=f"apply_rope differs from Hugging Face's rotary embedding (theta {theta:g})",
    )


def test_apply_rope_in_bfloat16_computes_angles_in_float32():
    # bfloat16 has 8 bits of precision: position 1001 would become 1000, and an angle of hundreds of
    # radians would be off by a whole radian. Angles in float32, then cos and sin cast to x's dtype:
    # the rotation is Hugging Face's, and the result stays in bfloat16.
    torch.manual_seed(6)
    x = torch.randn(5, 2, 32).bfloat16()
    positions = torch.tensor([0, 3, 300, 1001, 4097])
    got = te.apply_rope(x, positions, 10000.0)
    assert got.dtype == torch.bfloat16, f"bfloat16 input must give bfloat16 output, got {got.dtype}"
    # The most telling reason first: a rotation that is wrong in float32 too is not a precision
    # problem (a pairing of dimension i with i + 1 instead of i + head_dim/2, say).
    x32 = x.float()
    wrong_in_float32 = not torch.allclose(
        te.apply_rope(x32, positions, 10000.0).float(), hf_rope(x32, positions, 10000.0), atol=1e-3
    )
    torch.testing.assert_close(
        got,
        hf_rope(x, positions, 10000.0),
        atol=2e-2,
        rtol=2e-2,
        msg="apply_rope differs from Hugging Face's in float32 too: the rotation itself is wrong "
        "(dimension i turns with dimension i + head_dim/2, by position * theta ** (-2i / head_dim))"
        if wrong_in_float32
        else "in bfloat16, apply_rope differs from Hugging Face's: compute the angles "
        "in float32, then cast cos and sin to x's dtype",
    )


def test_apply_rope_position_zero_is_identity_and_norm_is_kept():
    torch.manual_seed(2)
    x = torch.randn(3, 2, 16)
    out = te.apply_rope(x, torch.tensor([0, 5, 9]), 10000.0)
    torch.testing.assert_close(out[0], x[0], msg="position 0 must not rotate at all")
    torch.testing.assert_close(
        out.norm(dim=-1), x.norm(dim=-1), msg="a rotation must keep each head's length"
    )
    assert not torch.allclose(out[1], x[1]), "position 5 must rotate the vector"


def on_another_device(name, call):
    """Run `call` with inputs on the 'meta' device, which stands in for a GPU here: it holds no
    data,
    and an operation that mixes it with a CPU tensor fails. Return the result."""
    try:
        out = call()
    except RuntimeError as e:
        if "device" not in str(e):
            raise
        pytest.fail(
            f"{name} made a tensor on the CPU while its inputs are on another device: create "
            "helper tensors (positions, frequencies, masks) with device=<the input's device>",
            pytrace=False,
        )
    assert out.device.type == "meta", (
        f"{name} returned a tensor on {out.device}, not on its inputs' device"
    )
    return out


def test_apply_rope_works_on_the_inputs_device():
    # On a GPU every tensor apply_rope creates must be on the GPU too.
    meta = torch.device("meta")
    x = torch.empty(3, 2, 16, device=meta)
    on_another_device("apply_rope", lambda: te.apply_rope(x, torch.arange(3, device=meta), 10000.0))


def sdpa_causal(q, k, v):
    """Dense causal attention over a whole sequence with torch's SDPA: [len, heads, dim]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    )
    return out.transpose(0, 1)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_attention_full_sequence_matches_sdpa(heads, kv_heads):
    torch.manual_seed(3)
    q, k, v = torch.randn(9, heads, 16), torch.randn(9, kv_heads, 16), torch.randn(9, kv_heads, 16)
    torch.testing.assert_close(
        te.attention(q, k, v),
        sdpa_causal(q, k, v),
        msg=f"causal attention with {heads} query heads and {kv_heads} kv heads "
        "differs from torch's scaled_dot_product_attention",
    )


@pytest.mark.parametrize("q_len", [1, 3])
def test_attention_queries_are_the_last_positions(q_len):
    # Decode (q_len 1) and a partial prefill: the queries are the sequence's last q_len positions.
    torch.manual_seed(4)
    q, k, v = torch.randn(10, 4, 16), torch.randn(10, 2, 16), torch.randn(10, 2, 16)
    want = sdpa_causal(q, k, v)[-q_len:]
    torch.testing.assert_close(
        te.attention(q[-q_len:], k, v),
        want,
        msg=f"{q_len} queries over 10 keys must be positions {10 - q_len}..9, "
        "each seeing the keys up to its own position",
    )


def test_attention_works_on_the_inputs_device():
    # On a GPU every tensor attention creates (positions, a mask) must be on the GPU too.
    meta = torch.device("meta")
    q, k = torch.empty(3, 4, 16, device=meta), torch.empty(5, 2, 16, device=meta)
    on_another_device("attention", lambda: te.attention(q, k, k))


def test_forward_logits_match_hf(model):
    ids = prompt_ids()[0]
    logits = te.forward(
        model, torch.tensor(ids), torch.arange(len(ids)), te.KVCache(model.config.num_layers)
    )
    torch.testing.assert_close(
        logits,
        hf_logits(ids),
        atol=1e-4,
        rtol=1e-4,
        msg="the tiny engine's logits for a prompt differ from Hugging Face's",
    )


def test_forward_with_cache_equals_forward_without(model):
    # Prefill a prefix, then the rest through the cache: the same logits as all at once.
    ids = torch.tensor(prompt_ids()[0])
    n = model.config.num_layers
    full = te.forward(model, ids, torch.arange(len(ids)), te.KVCache(n))
    cache = te.KVCache(n)
    te.forward(model, ids[:4], torch.arange(4), cache)
    rest = te.forward(model, ids[4:], torch.arange(4, len(ids)), cache)
    assert len(cache) == len(ids), (
        f"the cache holds {len(cache)} tokens after {len(ids)} went through"
    )
    torch.testing.assert_close(
        rest,
        full[4:],
        atol=1e-4,
        rtol=1e-4,
        msg="logits computed through the cache differ from those of one whole pass",
    )


@contextmanager
def watch_steps(limit: int):
    """Record how many tokens each forward pass adds to a KVCache (layer 0; patched on the class, so
    any cache that generate creates is seen), and stop a generate that runs more than `limit`
    forward passes instead of letting it loop until the judge's timeout."""
    added = []
    real_extend = te.KVCache.extend

    def spy(cache, layer, k, v):
        if layer == 0:
            added.append(k.shape[0])
            if len(added) > limit:
                raise AssertionError(f"generate did not stop: more than {limit} forward passes")
        return real_extend(cache, layer, k, v)

    with mock.patch.object(te.KVCache, "extend", spy):
        yield added


def test_greedy_generation_matches_hf(model):
    prompts = prompt_ids()
    with watch_steps(13 * len(prompts)):
        got = [te.generate(model, p, 12) for p in prompts]
    odd = next((t for out in got for t in out if type(t) is not int), None)
    assert odd is None, f"generate must return plain Python ints, got a {type(odd).__name__}"
    assert_tokens_equal(got, hf_greedy(prompts, 12), "tiny engine vs Hugging Face")


def test_generate_prefills_once_then_one_token_per_step(model):
    # Watch the cache grow (watch_steps patches KVCache.extend on the class, so any cache generate
    # creates is seen): the prompt goes in once, then one token per step; recomputing the whole
    # sequence each step would show up here.
    prompt = prompt_ids()[1]
    with watch_steps(6) as added:
        out = te.generate(model, prompt, 5)
    assert len(out) == 5, f"generate(..., 5) returned {len(out)} tokens"
    assert added[0] == len(prompt), "the first forward must run the whole prompt"
    assert all(n == 1 for n in added[1:]), (
        "after the prefill, each step must run exactly one new token; got steps of "
        f"{added[1:]} tokens"
    )
    # 5 tokens: the prefill's, then 4 steps; a fifth step would compute logits nobody reads
    assert len(added) == 5, (
        f"generate(..., 5) ran {len(added)} forward passes (of {added} tokens): the prefill gives "
        "the first token and each later pass one more, so the 5th token needs only 5 passes; a "
        "pass after the last token is wasted work"
    )


def test_generate_stops_after_eos(model):
    prompt = prompt_ids()[0]
    with watch_steps(14):
        full = te.generate(model, prompt, 6)
    eos = full[2]
    with watch_steps(14) as added:
        cut = te.generate(model, prompt, 6, eos_token_id=eos)
    want = full[: full.index(eos) + 1]
    assert cut == want, (
        f"with eos_token_id={eos}: expected {want} (up to and with the EOS), got {cut}"
    )
    assert len(added) == len(want), (
        f"{len(want)} tokens up to the EOS need {len(want)} forward passes; generate ran "
        f"{len(added)}: a pass after the EOS is wasted work"
    )


def test_generate_stops_when_the_first_token_is_eos(model):
    # The prefill's token is a generated token like any other: if it is the EOS, it is the only one.
    prompt = prompt_ids()[0]
    with watch_steps(14):
        first = te.generate(model, prompt, 6)[0]
        cut = te.generate(model, prompt, 6, eos_token_id=first)
    assert cut == [first], f"the first new token {first} is the EOS: expected [{first}], got {cut}"


def test_generate_without_eos_token_id_never_stops_early(model):
    # eos_token_id=None means no early stop, whatever the checkpoint's config names as its EOS.
    prompt = prompt_ids()[0]
    with watch_steps(14):
        full = te.generate(model, prompt, 6)
        other = te.Model(dataclasses.replace(model.config, eos_token_id=full[1]), model.weights)
        got = te.generate(other, prompt, 6)
    assert got == full, (
        f"generate(..., 6) with eos_token_id=None must give all 6 tokens, even though the "
        f"config's EOS is {full[1]}: expected {full}, got {got}"
    )
