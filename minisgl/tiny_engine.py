"""Chapter 0: a complete LLM inference engine in one file.

It loads a Qwen3 checkpoint (the Hugging Face layout: config.json + *.safetensors) into a dict of
plain tensors and generates greedily. Everything the rest of the book builds is already here in its
simplest form:

* the model is a few functions over tensors: rms_norm, apply_rope, attention, forward;
* the KV cache is a list per layer of the keys and values computed so far, grown by concatenation;
* generation is two phases: *prefill* runs the whole prompt once and fills the cache, then each
  *decode* step runs the model on one new token, which attends over everything cached.

The real engine (minisgl) keeps the math and changes the bookkeeping: many requests at once, a paged
KV cache allocated up front, a scheduler. This file imports nothing from it.

Run it:  python -m minisgl.tiny_engine [MODEL_DIR] [PROMPT]
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

BUNDLED_MODEL = Path(__file__).resolve().parent / "assets" / "shakespeare-qwen3"


# ---------------------------------------------------------------------------------- loading


@dataclass
class Config:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    eos_token_id: int | None


@dataclass
class Model:
    config: Config
    weights: Dict[str, torch.Tensor]  # Hugging Face names: "model.layers.0.self_attn.q_proj.weight"


def read_config(model_dir: Path) -> Config:
    raw = json.loads((model_dir / "config.json").read_text())
    # transformers 5 moved rope_theta into a "rope_parameters" dict; transformers 4 kept it on top.
    rope = raw.get("rope_parameters") or {}
    eos = raw.get("eos_token_id")
    num_heads = raw["num_attention_heads"]
    return Config(
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=raw.get("num_key_value_heads", num_heads),
        head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        eos_token_id=eos[0] if isinstance(eos, list) else eos,
    )


def load(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> Model:
    """Read config.json and every *.safetensors file of a checkpoint directory."""
    model_dir = Path(model_dir)
    config = read_config(model_dir)
    weights: Dict[str, torch.Tensor] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        for name, tensor in load_file(str(path)).items():
            weights[name] = tensor.to(dtype)
    if "lm_head.weight" not in weights:
        # Tied embeddings: the output projection is the input embedding matrix, stored once.
        assert config.tie_word_embeddings, "the checkpoint has no lm_head.weight"
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    return Model(config, weights)


# ---------------------------------------------------------------------------------- the math


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Scale each vector (the last dimension of x) to unit root-mean-square, then by `weight`.

    Computed in float32 whatever x's dtype, and cast back before the weight is applied, as Hugging
    Face does, so low-precision inputs agree with it. No mean is subtracted (unlike LayerNorm).

    Receives: `x` [..., dim] in any float dtype ([tokens, hidden], or [tokens, heads, head_dim] for
        Qwen3's per-head norms); `weight` [dim]; `eps`, added to the mean square.
    Returns: a tensor shaped like x.
    Leaves: nothing changed (a pure function).
    Uses: only torch (`forward` calls it before attention, before the MLP, at the end, and on q, k).
    Checked: equals Hugging Face's RMSNorm; uses eps and float32; the tiny engine's logits and
        greedy tokens equal Hugging Face's.
    """
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding, NeoX layout: turn each head's pairs of dimensions by position.

    Dimension i of the first half and dimension i of the second half form a 2-D pair, rotated by the
    angle position * theta^(-2i / head_dim): fast rotations for the first pairs, slow for the last.
    Position 0 is no rotation; a rotation keeps each vector's length.

    Receives: `x` [tokens, heads, head_dim] (q or k); `positions` [tokens], each token's position in
        its sequence; `theta`, RoPE's base (config's rope_theta).
    Returns: a new tensor shaped like x, in x's dtype.
    Leaves: nothing changed (a pure function).
    Uses: only torch (`forward` calls it on q and k).
    Checked: equals Hugging Face's rotary embedding for several thetas; position 0 is the identity
        and norms are kept; the tiny engine's logits and greedy tokens equal Hugging Face's.
    """
    head_dim = x.shape[-1]
    half = head_dim // 2
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=x.device) / head_dim)
    )
    angles = positions.to(torch.float32).unsqueeze(1) * inv_freq  # [tokens, half]
    cos = angles.cos().to(x.dtype).unsqueeze(1)  # [tokens, 1, half]: the same for every head
    sin = angles.sin().to(x.dtype).unsqueeze(1)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention with grouped-query heads.

    The queries are the *last* q_len positions of the sequence: query i sits at position k_len -
    q_len + i and sees keys 0 .. that position. Each kv head serves heads // kv_heads query heads.
    Scores are scaled by 1 / sqrt(head_dim).

    Receives: `q` [q_len, heads, head_dim]; `k`, `v` [k_len, kv_heads, head_dim], q_len <= k_len
        (the whole sequence so far: the cache's keys and this step's).
    Returns: [q_len, heads, head_dim].
    Leaves: nothing changed (a pure function).
    Uses: only torch (`forward` calls it with the keys and values `KVCache.extend` returns).
    Checked: a full sequence equals PyTorch's scaled_dot_product_attention (with and without grouped
        heads); fewer queries than keys are the last positions; the tiny engine's logits and greedy
        tokens equal Hugging Face's.
    """
    q_len, num_heads, head_dim = q.shape
    k_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=1)  # [k_len, heads, head_dim]
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim)
    q_pos = torch.arange(k_len - q_len, k_len, device=q.device).unsqueeze(1)
    k_pos = torch.arange(k_len, device=q.device).unsqueeze(0)
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))  # no looking ahead
    probs = scores.softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


# ---------------------------------------------------------------------------------- the model


class KVCache:
    """Per layer, the keys and values of every token processed so far: [tokens, kv_heads,
    head_dim]."""

    def __init__(self, num_layers: int) -> None:
        self.k: List[torch.Tensor | None] = [None] * num_layers
        self.v: List[torch.Tensor | None] = [None] * num_layers

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Append this step's keys and values; return all of them (old + new) for attention."""
        if self.k[layer] is not None:
            k = torch.cat([self.k[layer], k])
            v = torch.cat([self.v[layer], v])
        self.k[layer], self.v[layer] = k, v
        return k, v

    def __len__(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[0]


def linear(w: Dict[str, torch.Tensor], name: str, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w[name + ".weight"], w.get(name + ".bias"))


def forward(
    model: Model, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache
) -> torch.Tensor:
    """Run the new tokens `ids` (at `positions`) through the model, appending their keys and values
    to `cache`. Returns logits for every new token: [tokens, vocab]."""
    cfg, w = model.config, model.weights
    x = F.embedding(ids, w["model.embed_tokens.weight"])  # [tokens, hidden]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        # Attention block (pre-norm, residual around it).
        h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        q = linear(w, p + "self_attn.q_proj", h).view(-1, cfg.num_heads, cfg.head_dim)
        k = linear(w, p + "self_attn.k_proj", h).view(-1, cfg.num_kv_heads, cfg.head_dim)
        v = linear(w, p + "self_attn.v_proj", h).view(-1, cfg.num_kv_heads, cfg.head_dim)
        if (
            p + "self_attn.q_norm.weight" in w
        ):  # Qwen3 normalizes every q and k head (Llama does not)
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], cfg.rms_norm_eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], cfg.rms_norm_eps)
        q = apply_rope(q, positions, cfg.rope_theta)
        k = apply_rope(k, positions, cfg.rope_theta)
        k, v = cache.extend(i, k, v)
        out = attention(q, k, v).reshape(-1, cfg.num_heads * cfg.head_dim)
        x = x + linear(w, p + "self_attn.o_proj", out)
        # MLP block: SwiGLU.
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        gate, up = linear(w, p + "mlp.gate_proj", h), linear(w, p + "mlp.up_proj", h)
        x = x + linear(w, p + "mlp.down_proj", F.silu(gate) * up)
    x = rms_norm(x, w["model.norm.weight"], cfg.rms_norm_eps)
    return F.linear(x, w["lm_head.weight"])


@torch.no_grad()
def generate(
    model: Model, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_id: int | None = None
) -> List[int]:
    """Greedy decoding: prefill the prompt once, then feed back one token per step.

    Only the last position's logits predict the next token; a new token's position is the number of
    tokens already in the cache, so each decode step runs just that one token.

    Receives: `model`, loaded by `load`; `prompt_ids`, the prompt's token ids; `max_new_tokens` (at
        least 1); `eos_token_id`, or None for no early stop.
    Returns: the new token ids as Python ints: max_new_tokens of them, or fewer if eos_token_id
        comes (it is included, and it is the last).
    Leaves: nothing changed outside (a fresh `KVCache` lives only during the call).
    Uses: `forward` and `KVCache` (ch00); only torch otherwise.
    Checked: the first forward runs the whole prompt and every later one a single token; it stops
        right after EOS; greedy tokens equal Hugging Face's.
    """
    cache = KVCache(model.config.num_layers)
    logits = forward(model, torch.tensor(list(prompt_ids)), torch.arange(len(prompt_ids)), cache)
    out: List[int] = []
    while True:
        next_id = int(logits[-1].argmax())  # only the last position predicts the next token
        out.append(next_id)
        if len(out) == max_new_tokens or next_id == eos_token_id:
            break
        position = len(cache)  # the new token comes right after everything cached
        logits = forward(model, torch.tensor([next_id]), torch.tensor([position]), cache)
    return out


# ---------------------------------------------------------------------------------- a demo


def main(argv: List[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    model_dir = Path(argv[0]) if argv else BUNDLED_MODEL
    prompt = (
        argv[1] if len(argv) > 1 else "ROMEO:\nBut soft, what light through yonder window breaks?"
    )
    model = load(model_dir)
    tokenizer = None
    if (model_dir / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    # A checkpoint without a tokenizer still runs: on a few arbitrary token ids.
    prompt_ids = tokenizer.encode(prompt).ids if tokenizer else list(range(2, 12))
    # Time a prefill on its own (it also warms up torch), then the whole generation; the rest of the
    # generation's time is its decode steps.
    with torch.no_grad():
        start = time.perf_counter()
        forward(
            model,
            torch.tensor(prompt_ids),
            torch.arange(len(prompt_ids)),
            KVCache(model.config.num_layers),
        )
        prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    new_ids = generate(model, prompt_ids, 100, model.config.eos_token_id)
    decode_s = max(time.perf_counter() - start - prefill_s, 1e-9)
    text = tokenizer.decode(new_ids) if tokenizer else str(new_ids)
    print(prompt + text if tokenizer else f"{prompt_ids} -> {text}")
    print(
        f"\nprefill: {len(prompt_ids)} tokens in {prefill_s * 1e3:.1f} ms "
        f"({len(prompt_ids) / prefill_s:.0f} tokens/s)"
    )
    decoded = len(new_ids) - 1  # the first new token came out of the prefill
    if decoded > 0:
        print(
            f"decode:  {decoded} tokens in {decode_s * 1e3:.1f} ms ({decoded / decode_s:.0f} "
            "tokens/s)"
        )


if __name__ == "__main__":
    main()
