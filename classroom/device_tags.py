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
The attention metadata and the sampling arguments are not among the tensors checked:
`prepare_metadata` and `BatchSamplingArgs.from_params` move their tensors themselves, with
`.to(device)` for the device they are given, not through the kit. What can go wrong there is the
device handed to them: `torch.device("cpu")` instead of `self.device` is the very device the
engine has on a CPU. `distinct_scheduler_device(llm)` gives the scheduler `cpu:0` instead, the
same memory under a name that differs from a bare "cpu", and `sampling_devices()` records the
device each `from_params` call is asked for, so a CPU sees that mistake for the sampling
arguments; on a GPU the real devices differ (`judge.py ch07 --device cuda`).
A try-out that runs the steps it checked calls `untagged(fi)` first: the tag would otherwise
spread to every activation of the forward pass, and torch's dispatch for a subclass costs time on
each operation.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from typing import Dict, Iterator, List

import torch

from minisgl.engine import BatchSamplingArgs, Engine, ForwardInput
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


def distinct_scheduler_device(llm) -> None:
    """On a CPU, the scheduler's `self.device` becomes `cpu:0` (and the engine's device with it):
    the same memory, but unequal to a bare `torch.device("cpu")`, so a step built for "cpu"
    rather than for `self.device` can be told apart. On a GPU nothing changes."""
    if llm.device.type == "cpu":
        llm.device = llm.engine.device = torch.device("cpu", 0)


def wrong_devices(asked: List[torch.device], device: torch.device) -> List[torch.device]:
    """The devices in `asked` that are not `device` (on a GPU: not of its type, "cuda" and
    "cuda:0" being one)."""
    if device.type == "cpu":
        return [d for d in asked if d != device]
    return [d for d in asked if d.type != device.type]


@contextmanager
def sampling_devices() -> Iterator[List[torch.device]]:
    """Within the block, the device each `BatchSamplingArgs.from_params` call is asked for is
    appended to the list this yields."""
    asked: List[torch.device] = []
    original = BatchSamplingArgs.__dict__["from_params"]

    def recording(cls, params, vocab_size, device):
        asked.append(torch.device(device))
        return original.__func__(cls, params, vocab_size, device)

    BatchSamplingArgs.from_params = classmethod(recording)
    try:
        yield asked
    finally:
        BatchSamplingArgs.from_params = original
