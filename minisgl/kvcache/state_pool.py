"""The state pool of a hybrid model: what each request's Gated DeltaNet layers remember.

A full-attention layer remembers a request as KV that grows by one row per token, in pages the
prefix cache can share. A DeltaNet layer remembers it as two fixed-size tensors, rewritten in place
at every step: the convolution's window (the last K - 1 inputs of each channel) and the delta
rule's state (a [Dk, Dv] map per value head). Their size does not depend on the context length.

Both live here, one row per request slot (the page table's rows, scratch row included), so a
request's state is found by its `table_idx` like its tokens and pages are. A row's life
(`reset_new_rows` owns its one event):

- a request's first step starts from zeros, whatever the row held before: at the start of every
  prefill step, inside the step, the rows of the requests whose step is their first are zeroed;
- a chunked prefill carries the row from chunk to chunk (window included: the first tokens of a
  chunk convolve with the last inputs of the one before);
- nothing happens when a request finishes: the step after its last one may already be in flight
  and still writes the row, so a row zeroed then would not stay zero; the next owner's first step
  zeroes it, in stream order after every step queued before it;
- a slot is reused only once no batch in flight can still write its row (chapter 11's deferred
  release); otherwise the old owner's last step lands on top of the new owner's state.
"""

from __future__ import annotations

from typing import Sequence

import torch


class StatePool:
    def __init__(
        self,
        num_layers: int,
        rows: int,
        conv_channels: int,
        conv_kernel: int,
        v_heads: int,
        k_dim: int,
        v_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_layers, self.rows = num_layers, rows
        # [layers, rows, channels, K - 1]: the convolution's inputs, in the model's dtype
        self.conv = torch.zeros(
            num_layers, rows, conv_channels, conv_kernel - 1, dtype=dtype, device=device
        )
        # [layers, rows, value heads, Dk, Dv]: float32, it accumulates thousands of small updates
        self.recurrent = torch.zeros(
            num_layers, rows, v_heads, k_dim, v_dim, dtype=torch.float32, device=device
        )

    @staticmethod
    def bytes_per_row(
        num_layers: int,
        conv_channels: int,
        conv_kernel: int,
        v_heads: int,
        k_dim: int,
        v_dim: int,
        dtype: torch.dtype,
    ) -> int:
        """Bytes of one request's state over all DeltaNet layers, whatever its length."""
        conv = conv_channels * (conv_kernel - 1) * dtype.itemsize
        recurrent = v_heads * k_dim * v_dim * 4
        return num_layers * (conv + recurrent)

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.recurrent.nbytes


def reset_new_rows(
    pool: StatePool, rows: torch.Tensor, new_lens: Sequence[int], total_lens: Sequence[int]
) -> None:
    """Zero the window and state of every request whose step is its first, in every layer.

    Called once per prefill step by the hybrid model, inside the step (in stream order, before
    its DeltaNet layers read their rows). A request's step is its first when nothing of it was
    computed before: all its tokens so far are new in this step. Its row may hold what a finished
    request left there; every other row holds a live request's memory (the earlier chunks of its
    prompt, or its decode state), or the scratch row's padding.

    Receives: `pool`; `rows` [B] (a device tensor), the batch's rows, request i's at rows[i];
        `new_lens`, `total_lens` (host sequences of B ints): request i's tokens in this step and
        its length after it (its cached tokens plus the new ones).
    Returns: nothing.
    Leaves: `pool.conv[:, rows[i]]` and `pool.recurrent[:, rows[i]]` zero in every layer for each
        request i with new_lens[i] == total_lens[i]; every other row as it was, bit for bit.
    Uses: only torch (`index_fill_`).
    Checked: the rows of first steps zeroed in every layer, both tensors; a continued chunk's row
        and rows no request of the batch owns untouched; inside the engine, a tiny Qwen3.5 gives
        transformers' tokens with 3-token chunks and 2 slots for 3 requests, and with 1 slot, a
        step in flight and deferred CPU streams.
    """
    if len(new_lens) != rows.shape[0] or len(total_lens) != rows.shape[0]:
        raise ValueError(
            f"reset_new_rows: {rows.shape[0]} rows, {len(new_lens)} new lengths and "
            f"{len(total_lens)} total lengths: one of each per request"
        )
    fresh = rows[[i for i, (new, total) in enumerate(zip(new_lens, total_lens)) if new == total]]
    pool.conv.index_fill_(1, fresh, 0)
    pool.recurrent.index_fill_(1, fresh, 0)
