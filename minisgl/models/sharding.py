"""What each rank of a tensor-parallel model holds, and how it reads it from the checkpoint.

`rank_config` is the model one rank runs: its share of the query heads, of the KV heads (one when
there are fewer KV heads than ranks: each is then replicated on `ranks / kv_heads` ranks), of the
MLP's and each expert's intermediate size, and of the vocabulary padded to a multiple of the
ranks. Built from it, the ordinary model classes have exactly one rank's weight shapes;
`parallelize` then swaps in the ops that communicate (minisgl/layers/parallel.py).

`Shard.read` reads a rank's slice of one checkpoint tensor through safetensors' `get_slice`, so a
rank never holds more of a weight than it keeps (mini-sglang #93: every rank loaded everything).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Tuple

import torch

from minisgl.distributed import Collectives
from minisgl.layers import BaseOP
from minisgl.layers.parallel import ParallelLMHead, RowParallelLinear, VocabParallelEmbedding

from .config import ModelConfig


def check_tp_size(cfg: ModelConfig, tp_size: int) -> None:
    """Refuse a `tp_size` the model cannot be split by, naming the field it does not divide."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int):
        raise TypeError(f"tp_size must be an integer, got {type(tp_size).__name__} {tp_size!r}")
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    if cfg.hybrid is not None and tp_size != 1:
        raise ValueError(
            f"tp_size={tp_size} is not supported for {cfg.architecture} (Gated DeltaNet layers): "
            "its DeltaNet layers and their state are not sharded; run it with tp_size=1"
        )
    fields = [("num_attention_heads", cfg.num_heads), ("intermediate_size", cfg.intermediate_size)]
    if cfg.moe is not None:
        fields.append(("moe_intermediate_size", cfg.moe.intermediate_size))
    for name, value in fields:
        if value % tp_size:
            raise ValueError(f"tp_size={tp_size} does not divide the model's {name} ({value})")
    kv = cfg.num_kv_heads
    if kv % tp_size and tp_size % kv:
        raise ValueError(
            f"tp_size={tp_size} and the model's num_key_value_heads ({kv}): one must divide the "
            "other (each rank takes whole KV heads, or a KV head is replicated on whole ranks)"
        )


def vocab_rows(vocab_size: int, ranks: int) -> int:
    """Rows of the embedding and the LM head per rank: the vocabulary padded up to a multiple of
    the ranks, divided (never refused for not dividing)."""
    return -(-vocab_size // ranks)


def rank_config(cfg: ModelConfig, ranks: int) -> ModelConfig:
    """The model one of `ranks` ranks runs (the same for every rank)."""
    check_tp_size(cfg, ranks)
    moe = cfg.moe
    if moe is not None:
        moe = replace(moe, intermediate_size=moe.intermediate_size // ranks)
    return replace(
        cfg,
        num_heads=cfg.num_heads // ranks,
        num_kv_heads=max(1, cfg.num_kv_heads // ranks),
        intermediate_size=cfg.intermediate_size // ranks,
        vocab_size=vocab_rows(cfg.vocab_size, ranks),
        moe=moe,
    )


def parallelize(model: BaseOP, cfg: ModelConfig, comm: Collectives) -> None:
    """Swap the ops of `model` (built from `rank_config`) that must communicate: o_proj and
    down_proj become row-parallel, the embedding and the LM head vocabulary-parallel, a mixture of
    experts' block all-reduces its output. Weights stay as they are (on the meta device)."""
    body = model.model
    embed = body.embed_tokens
    start = comm.rank * embed.weight.shape[0]
    body.embed_tokens = _like(VocabParallelEmbedding, embed, comm=comm, start=start)
    head = model.lm_head
    tied = body.embed_tokens if head.tied_to is not None else None
    model.lm_head = _like(ParallelLMHead, head, comm=comm, vocab_size=cfg.vocab_size, tied_to=tied)
    for layer in body.layers:
        attn = layer.self_attn
        attn.o_proj = _like(RowParallelLinear, attn.o_proj, comm=comm)
        mlp = layer.mlp
        if hasattr(mlp, "down_proj"):
            mlp.down_proj = _like(RowParallelLinear, mlp.down_proj, comm=comm)
        else:  # a sparse MoE block: each rank's experts give a partial sum of the output
            mlp._comm = comm


def _like(cls, op, **private):
    """An op of class `cls` holding `op`'s weights and settings, plus `private` ones (`_name`)."""
    new = cls.__new__(cls)
    new.__dict__.update(op.__dict__)
    for name, value in private.items():
        new.__dict__[f"_{name}"] = value
    return new


# ---------------------------------------------------------------- reading a rank's slices


@dataclass(frozen=True)
class Shard:
    """Rank `rank` of `ranks` of the model `cfg` (the whole model's config)."""

    cfg: ModelConfig
    rank: int
    ranks: int

    def read(self, key: str, sl) -> torch.Tensor:
        """This rank's part of checkpoint tensor `key`, read through `sl` (safetensors'
        `get_slice(key)`): only those bytes are read."""
        shape = tuple(sl.get_shape())
        dim, start, length = self.span(key, shape)
        if dim is None:
            return sl[:]
        if key.endswith("experts.gate_up_proj"):  # stacked [experts, gate | up, hidden]
            up = shape[1] // 2 + start
            return torch.cat([sl[:, start : start + length], sl[:, up : up + length]], dim=1)
        index = [slice(None)] * len(shape)
        stop = min(start + length, shape[dim])
        index[dim] = slice(start, stop)
        part = sl[tuple(index)]
        if stop - start < length:  # the vocabulary's padding rows past its end: zeros
            pad = list(part.shape)
            pad[dim] = length - (stop - start)
            part = torch.cat([part, part.new_zeros(pad)], dim)
        return part

    def span(self, key: str, shape: Tuple[int, ...]):
        """(dim, start, length) of this rank's slice of `key`, or (None, 0, 0) to read it whole."""
        r, n, cfg = self.rank, self.ranks, self.cfg
        name = key.rsplit(".", 1)[0] if key.endswith((".weight", ".bias")) else key
        if name.endswith(("embed_tokens", "lm_head")):
            per = vocab_rows(cfg.vocab_size, n)
            return 0, r * per, per
        if name.endswith(("self_attn.k_proj", "self_attn.v_proj")) and cfg.num_kv_heads < n:
            head = r * cfg.num_kv_heads // n  # the KV head this rank's query heads read
            return 0, head * cfg.head_dim, cfg.head_dim
        if name.endswith("experts.gate_up_proj"):  # stacked: gate's rows and up's rows (read())
            per = shape[1] // 2 // n
            return 1, r * per, per
        if key.endswith(".bias") and name.endswith(("o_proj", "down_proj")):
            return None, 0, 0  # added once, after the all-reduce
        if name.endswith(("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")):
            return 0, r * shape[0] // n, shape[0] // n  # column parallel: rows of the output
        if name.endswith(("o_proj", "down_proj")):
            return len(shape) - 1, r * shape[-1] // n, shape[-1] // n  # row parallel: columns
        return None, 0, 0  # norms, the router: every rank holds them whole
