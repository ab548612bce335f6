"""A CPU that tells the device's tensors from the host's (chapter 7's `_prepare_batch`).

On a GPU, a tensor built with `torch.tensor(...)` or `torch.arange(...)` lives in host memory until
it is copied to the device; a step whose index tensors were never copied hands host memory to the
device's kernels, which fail (Triton's) or force a synchronous copy in the middle of the step. On
a CPU both memories are one, `kit.to_device` returns its argument, and leaving the call out shows
nothing: the mistake passes on a laptop and fails on the first GPU.

`tag_device_copies(engine)` gives the engine a kit whose `to_device` returns its copy as an
`OnDevice` tensor: a subclass of `torch.Tensor` that torch keeps through every operation on it
(indexing, `.long()`, `torch.cat`, arithmetic), as a CUDA tensor keeps its device. A tensor the
step built on the host and never moved stays a plain tensor, so `host_tensors(fi)` can name it.
Only the tests and try-outs that check this rule install the kit; the engine's own kit, and its
speed everywhere else, are untouched. On a GPU the tensors' real devices tell them apart, so the
kit is left as it is there.
The attention metadata is not among the tensors checked, and cannot be on a CPU: `prepare_metadata`
moves its tensors itself, with `.to(device)` for the device it is given, not through the kit, so
they are plain tensors for the reference too; and `_prepare_batch` handing it the wrong device
(`torch.device("cpu")` instead of `self.device`) passes the very device the engine has on a CPU.
Only a GPU run shows that mistake (`judge.py ch07 --device cuda`).
A try-out that runs the steps it checked calls `untagged(fi)` first: the tag would otherwise
spread to every activation of the forward pass, and torch's dispatch for a subclass costs time on
each operation.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List

import torch

from minisgl.engine import Engine, ForwardInput
from minisgl.utils.streams import DeviceKit


class OnDevice(torch.Tensor):
    """A CPU tensor that stands for device memory (torch's default `__torch_function__` makes the
    result of every operation on it an `OnDevice` too)."""


class TaggingKit(DeviceKit):
    """The engine's kit, whose `to_device` on a CPU returns a tagged copy."""

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self.is_cuda:
            return super().to_device(t)
        # a copy, as a real transfer makes: a later change to the host tensor does not reach it
        return t.clone().as_subclass(OnDevice)


def tag_device_copies(engine: Engine) -> None:
    """From now on the engine's `kit.to_device` (on a CPU) returns tagged copies."""
    kit = engine.kit
    if not isinstance(kit, TaggingKit):
        engine.kit = TaggingKit(kit.device, kit.cpu_streams)


def on_device(t: torch.Tensor, device: torch.device) -> bool:
    if device.type == "cpu":
        return isinstance(t, OnDevice)
    return t.device.type == device.type


def step_tensors(fi: ForwardInput) -> Dict[str, torch.Tensor]:
    """The tensors `_prepare_batch` builds from the host's lists and must move to the device."""
    return {
        "input_tuple rows": fi.input_tuple[0],
        "input_tuple positions": fi.input_tuple[1],
        "write_tuple rows": fi.write_tuple[0],
        "write_tuple columns": fi.write_tuple[1],
        "batch.positions": fi.batch.positions,
    }


def host_tensors(fi: ForwardInput, device: torch.device) -> List[str]:
    """The names of the step's index tensors still in host memory."""
    return [
        name
        for name, t in step_tensors(fi).items()
        if isinstance(t, torch.Tensor) and not on_device(t, device)
    ]


def _plain(value):
    return value.as_subclass(torch.Tensor) if isinstance(value, OnDevice) else value


def untagged(fi: ForwardInput) -> ForwardInput:
    """`fi` with every tagged tensor of the step (its index tensors, the batch's positions and
    out_loc, the attention metadata's fields) a plain tensor again, in place; returns `fi`."""
    batch = fi.batch
    fi.input_tuple = tuple(_plain(t) for t in fi.input_tuple)
    fi.write_tuple = tuple(_plain(t) for t in fi.write_tuple)
    batch.positions, batch.out_loc = _plain(batch.positions), _plain(batch.out_loc)
    meta = batch.attn_metadata
    if dataclasses.is_dataclass(meta):
        for f in dataclasses.fields(meta):
            setattr(meta, f.name, _plain(getattr(meta, f.name)))
    return fi
