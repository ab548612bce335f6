"""BaseOP: the engine's tiny replacement for nn.Module.

An op keeps its weights as plain tensor attributes and its sub-ops as attributes too. The
state-dict key of a weight is the attribute path that reaches it
(`layers.3.self_attn.qkv_proj.weight`), so names never need to be written down twice. Attributes
whose names start with `_` are private (caches, config) and never part of the state dict.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Tuple

import torch


class BaseOP:
    def named_tensors(self, prefix: str = "") -> Iterator[Tuple[str, torch.Tensor]]:
        """Yield (key, tensor) for every weight of this op and its sub-ops, depth first.

        A weight's key is the path of attribute names that leads to it, joined by dots, so the keys
        follow the Hugging Face layout when the attributes are named like its modules.

        Receives: `prefix`, prepended to every key ("" at the top; "layers.0." further down).
        Returns: an iterator of (key, tensor) pairs, in attribute order, the tensors themselves (no
            copy).
        Leaves: nothing changed.
        Uses: `self.__dict__` in order; a sub-op's own `named_tensors` (`OPList` numbers its items);
            attributes whose names start with "_" are private and skipped (ch02).
        Checked: the model's keys match the Hugging Face layout; keys follow attribute paths;
            private attributes are not weights; the state dict holds the weights themselves; a tied
            LM head owns no weight.
        """
        for name, value in self.__dict__.items():
            if name.startswith("_"):
                continue
            key = f"{prefix}{name}"
            if isinstance(value, torch.Tensor):
                yield key, value
            elif isinstance(value, BaseOP):
                yield from value.named_tensors(key + ".")

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return dict(self.named_tensors())

    def load_state_dict(self, state_dict: Dict[str, torch.Tensor], strict: bool = True) -> None:
        """Replace every weight with the tensor of the same key. Raises KeyError naming the first
        missing or unexpected key, ValueError naming a key whose shape differs."""
        remaining = dict(state_dict)
        self._load(remaining, "")
        if strict and remaining:
            extra = sorted(remaining)
            raise KeyError(
                f"unexpected weight(s) in checkpoint: {', '.join(extra[:5])}"
                + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
            )

    def _load(self, remaining: Dict[str, torch.Tensor], prefix: str) -> None:
        for name, value in list(self.__dict__.items()):
            if name.startswith("_"):
                continue
            key = f"{prefix}{name}"
            if isinstance(value, torch.Tensor):
                if key not in remaining:
                    raise KeyError(f"missing weight: {key}")
                new = remaining.pop(key)
                if tuple(new.shape) != tuple(value.shape):
                    raise ValueError(
                        f"weight {key} has shape {tuple(new.shape)}, expected {tuple(value.shape)}"
                    )
                setattr(
                    self, name, new.to(dtype=value.dtype) if value.dtype.is_floating_point else new
                )
            elif isinstance(value, BaseOP):
                value._load(remaining, key + ".")


class OPList(BaseOP):
    """A list of ops whose keys are their indices: `layers.0.…`, `layers.1.…`."""

    def __init__(self, ops: List[BaseOP]) -> None:
        self._ops = list(ops)

    def __iter__(self) -> Iterator[BaseOP]:
        return iter(self._ops)

    def __len__(self) -> int:
        return len(self._ops)

    def __getitem__(self, i: int) -> BaseOP:
        return self._ops[i]

    def named_tensors(self, prefix: str = "") -> Iterator[Tuple[str, torch.Tensor]]:
        for i, op in enumerate(self._ops):
            yield from op.named_tensors(f"{prefix}{i}.")

    def _load(self, remaining: Dict[str, torch.Tensor], prefix: str) -> None:
        for i, op in enumerate(self._ops):
            op._load(remaining, f"{prefix}{i}.")
