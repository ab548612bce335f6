"""Chapter 0: the one-file engine. Each piece of math against Hugging Face's (or a plain torch
formula), then whole greedy generations token for token."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

from helpers import MODEL, assert_tokens_equal, hf_greedy, hf_logits, prompt_ids

import minisgl.tiny_engine as te  # used as te.name so the judge's swapped-in functions are seen


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
        "new": {**raw, "rope_parameters": {**(raw.get("rope_parameters") or {}), "rope_theta": theta}},
        "old": {**{k: v for k, v in raw.items() if k not in ("rope_parameters", "dtype")},
                "torch_dtype": raw.get("dtype", "bfloat16"), "rope_theta": theta},
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
    torch.testing.assert_close(te.rms_norm(x, hf.weight.data, 1e-6), hf(x).detach())


def test_rms_norm_uses_eps_and_float32():
    # All-zero input: only eps keeps the result finite. bf16 input: the sum runs in float32.
    w = torch.ones(8)
    assert torch.equal(te.rms_norm(torch.zeros(2, 8), w, 1e-6), torch.zeros(2, 8))
    x = torch.randn(4, 8) * 100
    got = te.rms_norm(x.bfloat16(), w.bfloat16(), 1e-6)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), te.rms_norm(x, w, 1e-6), atol=2e-2, rtol=2e-2)


def hf_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Hugging Face's cos/sin construction and rotation, for x [tokens, heads, head_dim]."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)  # [tokens, dim]
    out, _ = apply_rotary_pos_emb(x, x, emb.cos(), emb.sin(), unsqueeze_dim=1)
    return out


@pytest.mark.parametrize("theta", [10000.0, 1_000_000.0])
def test_apply_rope_matches_hf(theta):
    torch.manual_seed(1)
    x = torch.randn(6, 4, 32)
    positions = torch.tensor([0, 1, 7, 3, 100, 255])
    torch.testing.assert_close(te.apply_rope(x, positions, theta), hf_rope(x, positions, theta))


def test_apply_rope_position_zero_is_identity_and_norm_is_kept():
    torch.manual_seed(2)
    x = torch.randn(3, 2, 16)
    out = te.apply_rope(x, torch.tensor([0, 5, 9]), 10000.0)
    torch.testing.assert_close(out[0], x[0])  # angle 0: no rotation
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))  # a rotation keeps lengths
    assert not torch.allclose(out[1], x[1])


def sdpa_causal(q, k, v):
    """Dense causal attention over a whole sequence with torch's SDPA: [len, heads, dim]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         is_causal=True)
    return out.transpose(0, 1)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_attention_full_sequence_matches_sdpa(heads, kv_heads):
    torch.manual_seed(3)
    q, k, v = torch.randn(9, heads, 16), torch.randn(9, kv_heads, 16), torch.randn(9, kv_heads, 16)
    torch.testing.assert_close(te.attention(q, k, v), sdpa_causal(q, k, v))


@pytest.mark.parametrize("q_len", [1, 3])
def test_attention_queries_are_the_last_positions(q_len):
    # Decode (q_len 1) and a partial prefill: the queries are the sequence's last q_len positions.
    torch.manual_seed(4)
    q, k, v = torch.randn(10, 4, 16), torch.randn(10, 2, 16), torch.randn(10, 2, 16)
    want = sdpa_causal(q, k, v)[-q_len:]
    torch.testing.assert_close(te.attention(q[-q_len:], k, v), want)


def test_forward_logits_match_hf(model):
    ids = prompt_ids()[0]
    logits = te.forward(model, torch.tensor(ids), torch.arange(len(ids)), te.KVCache(model.config.num_layers))
    torch.testing.assert_close(logits, hf_logits(ids), atol=1e-4, rtol=1e-4)


def test_forward_with_cache_equals_forward_without(model):
    # Prefill a prefix, then the rest through the cache: the same logits as all at once.
    ids = torch.tensor(prompt_ids()[0])
    n = model.config.num_layers
    full = te.forward(model, ids, torch.arange(len(ids)), te.KVCache(n))
    cache = te.KVCache(n)
    te.forward(model, ids[:4], torch.arange(4), cache)
    rest = te.forward(model, ids[4:], torch.arange(4, len(ids)), cache)
    assert len(cache) == len(ids)
    torch.testing.assert_close(rest, full[4:], atol=1e-4, rtol=1e-4)


def test_greedy_generation_matches_hf(model):
    prompts = prompt_ids()
    got = [te.generate(model, p, 12) for p in prompts]
    assert_tokens_equal(got, hf_greedy(prompts, 12), "tiny engine vs Hugging Face")


def test_generate_prefills_once_then_one_token_per_step(model, monkeypatch):
    # Watch the cache grow (on the class, so any caller's KVCache is seen): the prompt goes in once,
    # then one token per step; recomputing the whole sequence each step would show up here.
    added = []
    real_extend = te.KVCache.extend

    def spy(cache, layer, k, v):
        if layer == 0:
            added.append(k.shape[0])
        return real_extend(cache, layer, k, v)

    monkeypatch.setattr(te.KVCache, "extend", spy)
    prompt = prompt_ids()[1]
    out = te.generate(model, prompt, 5)
    assert len(out) == 5
    assert added[0] == len(prompt), "the first forward must run the whole prompt"
    assert added[1:] in ([1] * 4, [1] * 5), \
        f"after the prefill, each step must run exactly one new token; got steps of {added[1:]} tokens"


def test_generate_stops_after_eos(model):
    prompt = prompt_ids()[0]
    full = te.generate(model, prompt, 6)
    eos = full[2]
    cut = te.generate(model, prompt, 6, eos_token_id=eos)
    assert cut == full[: full.index(eos) + 1]
