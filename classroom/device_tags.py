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
The attention metadata and the sampling arguments are not built through the kit:
`prepare_metadata` and `BatchSamplingArgs.from_params` move their tensors themselves, with
`.to(device)` for the device they are given. What can go wrong there is the device handed to
them: `torch.device("cpu")` instead of `self.device` is the very device the engine has on a CPU.
`distinct_scheduler_device(llm)` gives the scheduler `cpu:0` instead, the same memory under a
name that differs from a bare "cpu"; within `tagging_made_for(device)` every tensor made for that
device (a factory's `device=`, a `.to(device)`) is tagged as well, so `off_device_tensors(fi,
device)` can walk every tensor the step carries into the forward (the batch's, the attention
metadata's, the sampling arguments', the two index tuples) and name each that is not on the
device, whichever field it is. `sampling_devices()` records the device each `from_params` call is
asked for (an all-greedy batch has no sampling tensors to walk). On a GPU the real devices differ
(`judge.py ch07 --device cuda`), and the walk reads them.
A try-out that runs the steps it checked calls `untagged(fi)` first: the tag would otherwise
spread to every activation of the forward pass, and torch's dispatch for a subclass costs time on
each operation.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List

import torch
from torch.overrides import TorchFunctionMode

from minisgl.engine import BatchSamplingArgs, Engine, ForwardInput
from minisgl.utils.streams import DeviceKit


class OnDevice(torch.Tensor):
    """A CPU tensor that stands for device memory (torch's default `__torch_function__` makes the
    result of every operation on it an `OnDevice` too)."""


class MadeForDevice(OnDevice):
    """A tensor made for the device by a torch call (`tagging_made_for`) rather than copied by the
    kit: on the device, but not through `kit.to_device` (a subclass, so that torch makes what
    mixes the two this kind, and `host_tensors` still names it)."""


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
    """The names of the step's index tensors that did not go through `kit.to_device` (on a GPU:
    that are not on the device)."""
    return [
        name
        for name, t in step_tensors(fi).items()
        if isinstance(t, torch.Tensor)
        and (not on_device(t, device) or isinstance(t, MadeForDevice))
    ]


def _plain(value):
    return value.as_subclass(torch.Tensor) if isinstance(value, OnDevice) else value


def untagged(fi: ForwardInput) -> ForwardInput:
    """`fi` with every tagged tensor of the step (its index tensors, the batch's positions and
    out_loc, the attention metadata's and the sampling arguments' fields) a plain tensor again, in
    place; returns `fi`."""
    batch = fi.batch
    fi.input_tuple = tuple(_plain(t) for t in fi.input_tuple)
    fi.write_tuple = tuple(_plain(t) for t in fi.write_tuple)
    for f in dataclasses.fields(batch):
        if f.name != "reqs":
            setattr(batch, f.name, _plain(getattr(batch, f.name)))
    for part in (batch.attn_metadata, fi.sample_args):
        if dataclasses.is_dataclass(part):
            for f in dataclasses.fields(part):
                setattr(part, f.name, _plain(getattr(part, f.name)))
    return fi


class _TagWhatIsMadeFor(TorchFunctionMode):
    """Tags as `MadeForDevice` every tensor a torch call makes for `device`: a factory given
    `device=device`, a `.to(device)`. Other calls pass through untouched."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device

    def _asks_for_the_device(self, func, args, kwargs) -> bool:
        named = [kwargs.get("device")]
        if func is torch.Tensor.to:
            named.extend(args[1:])
        for d in named:
            if isinstance(d, (str, torch.device)):
                try:
                    if torch.device(d) == self.device:
                        return True
                except RuntimeError:  # a string that is not a device (never one torch accepted)
                    continue
        return False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if (
            isinstance(out, torch.Tensor)
            and not isinstance(out, OnDevice)
            and self._asks_for_the_device(func, args, kwargs)
        ):
            return out.as_subclass(MadeForDevice)
        return out


@contextmanager
def tagging_made_for(device: torch.device) -> Iterator[None]:
    """Within the block, on a CPU whose `device` is `cpu:0` (`distinct_scheduler_device`), every
    tensor made for `device` is tagged as on the device; a tensor made for a bare "cpu" is not. On
    a GPU (or for a bare "cpu", which every tensor is on) nothing is tagged: the devices are real
    there."""
    if device.type != "cpu" or device.index is None:
        yield
        return
    with _TagWhatIsMadeFor(device):
        yield


def _tensors_in(value: Any, name: str) -> Iterator[tuple]:
    """(name, tensor) for every tensor in `value`, through dataclass fields, tuples, lists and
    dicts; a request's own tensors (`reqs`) are the host's and are left out."""
    if isinstance(value, torch.Tensor):
        yield name, value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            if f.name != "reqs":
                yield from _tensors_in(getattr(value, f.name), f"{name}.{f.name}")
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from _tensors_in(item, f"{name}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors_in(item, f"{name}[{key!r}]")


def forward_tensors(fi: ForwardInput) -> Dict[str, torch.Tensor]:
    """Every tensor the step carries into the forward pass, by where it sits: `batch.positions`,
    `batch.attn_metadata.cu_seqlens_q`, `sample_args.temperatures`, `input_tuple[0]`, ..."""
    return {
        name: t
        for part in ("batch", "sample_args", "input_tuple", "write_tuple")
        for name, t in _tensors_in(getattr(fi, part), part)
    }


def off_device_tensors(fi: ForwardInput, device: torch.device) -> List[str]:
    """The names of the tensors of `fi` that are not on `device` (on a CPU: not tagged, by the kit
    or by `tagging_made_for`)."""
    return [name for name, t in forward_tensors(fi).items() if not on_device(t, device)]


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
