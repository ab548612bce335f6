from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.kernel.dispatch import fused_for

from .base import BaseOP


class Linear(BaseOP):
    """y = x W^T (+ b). Merged projections (q|k|v, gate|up) are simply Linears with a taller W."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.weight = torch.empty(out_features, in_features, dtype=dtype, device=device)
        if bias:
            self.bias = torch.empty(out_features, dtype=dtype, device=device)
        self._has_bias = bias

    @property
    def has_bias(self) -> bool:
        return self._has_bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = fused_for(x)
        if fused is not None and not self._has_bias and x.numel() == x.shape[-1]:
            return fused.small_batch_linear(x, self.weight)  # one row: a decode step of batch 1
        return F.linear(x, self.weight, self.bias if self._has_bias else None)
