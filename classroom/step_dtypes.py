"""The dtype each tensor of a step must have (chapter 7's `_prepare_batch`), and a walk that names
every tensor that has another.

On a CPU a step whose positions are int32 runs: RoPE and the indexing accept either width, so the
tokens come out right and nothing fails. On a GPU the kernels take what the contract states
(`out_loc` and the index tuples as int64: byte offsets computed from them overflow in int32 in a
large KV pool; the attention metadata's lengths as int32, as FlashAttention takes them), and a
tensor of another width is refused or, worse, read as the wrong numbers. Checking one named field
at a time left the others open, so `wrong_dtypes` walks every tensor the step hands the forward
(`device_tags.forward_tensors`: the batch's, the attention metadata's, the sampling arguments', both
tuples) against `CONTRACT`, the dtypes the chapters' contracts state.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from classroom.device_tags import forward_tensors
from minisgl.engine import ForwardInput

I64 = (torch.int64,)
I32 = (torch.int32,)
F32 = (torch.float32,)
INDEX = (torch.int32, torch.int64)  # write_tuple: either width addresses a token pool's cells

# name (as forward_tensors writes it) -> the dtypes its contract allows, and where that is stated
CONTRACT: Dict[str, Tuple[Tuple[torch.dtype, ...], str]] = {
    "input_tuple[0]": (I64, "input_tuple is int64 (ch07)"),
    "input_tuple[1]": (I64, "input_tuple is int64 (ch07)"),
    "write_tuple[0]": (INDEX, "write_tuple indexes the token pool (ch07)"),
    "write_tuple[1]": (INDEX, "write_tuple indexes the token pool (ch07)"),
    "batch.positions": (I64, "batch.positions is input_tuple's positions tensor (ch07)"),
    "batch.out_loc": (I64, "out_loc is int64 (ch07)"),
    "batch.input_ids": (I32, "input ids are the token pool's (ch06)"),
    "batch.logit_rows": (I64, "logit rows index the hidden states (ch06)"),
    "batch.attn_metadata.cu_seqlens_q": (I32, "prepare_metadata's contract (ch05)"),
    "batch.attn_metadata.cache_seqlens": (I32, "prepare_metadata's contract (ch05)"),
    "batch.attn_metadata.page_table": (I32, "the page table's rows (ch04)"),
    "batch.attn_metadata.last_indices": (I64, "prepare_metadata's contract (ch05)"),
    "batch.attn_metadata.rows": (I64, "prepare_metadata's contract (ch05)"),
    "sample_args.temperatures": (F32, "BatchSamplingArgs' contract (ch06)"),
    "sample_args.top_k": (I64, "BatchSamplingArgs' contract (ch06)"),
    "sample_args.top_p": (F32, "BatchSamplingArgs' contract (ch06)"),
}


def _names(dtypes: Tuple[torch.dtype, ...]) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def wrong_dtypes(fi: ForwardInput) -> List[str]:
    """One line per tensor of `fi` whose dtype is not its contract's ("batch.positions is int32,
    its contract says int64: batch.positions is input_tuple's positions tensor (ch07)"), and one
    per tensor the contract does not know (a field this walk was never told about)."""
    found = []
    for name, t in forward_tensors(fi).items():
        if name not in CONTRACT:
            found.append(f"{name} ({_names((t.dtype,))}) is no tensor the step's contract names")
            continue
        allowed, why = CONTRACT[name]
        if t.dtype not in allowed:
            found.append(
                f"{name} is {_names((t.dtype,))}, its contract says {_names(allowed)}: {why}"
            )
    return found
