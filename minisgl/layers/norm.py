from __future__ import annotations

from typing import Tuple

import torch

from minisgl.kernel import dispatch, fused_add_rms_norm, rms_norm
from minisgl.kernel.dispatch import fused_for

from .base import BaseOP
from .linear import Linear


class RMSNorm(BaseOP):
    def __init__(self, size: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        self.weight = torch.empty(size, dtype=dtype, device=device)
        self._eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = fused_for(x)
        if fused is not None:
            return fused.rms_norm(x, self.weight, self._eps)
        return rms_norm(x, self.weight, self._eps)

    def forward_fused(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Pre-norm residual step: returns (norm(x + residual), x + residual). With no residual yet
        (the first layer) x itself becomes the residual."""
        fused = fused_for(x)  # one Triton kernel on a GPU (see minisgl.kernel.dispatch)
        if residual is None:
            norm = fused.rms_norm if fused is not None else rms_norm
            return norm(x, self.weight, self._eps), x
        add_norm = fused.fused_add_rms_norm if fused is not None else fused_add_rms_norm
        return add_norm(x, residual, self.weight, self._eps)

    def forward_into(
        self, linear: Linear, x: torch.Tensor, residual: torch.Tensor | None, gated: bool = False
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(linear(norm(x + residual)), x + residual); with `gated` (linear = the MLP's gate|up)
        silu_and_mul of the product. One kernel on a GPU for one row (a decode step of batch 1:
        minisgl/kernel/triton_norm_linear.py); the separate ops otherwise."""
        fused = fused_for(x)
        if fused is not None and not linear.has_bias and fused.norm_linear_fits(x, linear.weight):
            return fused.norm_linear(x, residual, self.weight, self._eps, linear.weight, gated)
        x, residual = self.forward_fused(x, residual)
        y = linear.forward(x)
        return (dispatch.silu_and_mul(y) if gated else y), residual
