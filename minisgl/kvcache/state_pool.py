"""The state pool of a hybrid model: what each request's Gated DeltaNet layers remember.

A full-attention layer remembers a request as KV that grows by one row per token, in pages the
prefix cache can share. A DeltaNet layer remembers it as two fixed-size tensors, rewritten in place
at every step: the convolution's window (the last K - 1 inputs of each channel) and the delta
rule's state (a [Dk, Dv] map per value head). Their size does not depend on the context length.

Both live here, one row per request slot (the page table's rows, scratch row included), so a
request's state is found by its `table_idx` like its tokens and pages are. Three rules:

- a request's first step starts from zeros, whatever the row held before: the layers read the row
  only when the step continues the request (its cached length > 0), and otherwise start from a
  zero state that overwrites the row;
- a chunked prefill carries the row from chunk to chunk (window included: the first tokens of a
  chunk convolve with the last inputs of the one before);
- a slot is reused only once no batch in flight can still write its row (chapter 11's deferred
  release); otherwise the old owner's last step lands on top of the new owner's state.
"""

from __future__ import annotations

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
