"""Mixture-of-experts: the interface a MoE layer would implement. No bundled model uses one; the
interface exists so the layer boundary is clear when one is added."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class MoELayer(ABC):
    @abstractmethod
    def route(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (expert ids [tokens, top_k], weights [tokens, top_k]) for each token."""

    @abstractmethod
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Run each token through its experts and combine the outputs by the routing weights."""
