"""Whether a step copies device state to the host (chapter 7's `_prepare_batch`).

The page table lives on the device, and the step reads it there: `out_loc` is an index of it by
tensors already on the device. A step that reads it on the host instead (`self.page_table.cpu()`,
`.tolist()`, `.item()` of a piece of it) makes the CPU wait for the device to finish everything
queued before it, then copy: on a GPU a stall every step, with a copy of the whole table for
`.cpu()`. On a CPU the copy is free and nothing shows, so this asks for it directly.

`tag_page_table(llm)` gives the scheduler a view of its page table tagged as device memory (the
same storage: the cache manager's writes reach it; classroom/device_tags.py's `OnDevice`);
within `host_copies(llm)` every torch call that brings a device tensor (a CUDA one, or on a CPU a
tagged one) to the host is recorded, except inside the cache manager's `allocate_paged`, whose
bookkeeping is its own (chapter 8).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, List

import torch
from torch.overrides import TorchFunctionMode

from .device_tags import OnDevice

_READS = {
    torch.Tensor.cpu: ".cpu()",
    torch.Tensor.tolist: ".tolist()",
    torch.Tensor.item: ".item()",
    torch.Tensor.numpy: ".numpy()",
}


def tag_page_table(llm) -> None:
    """On a CPU, the scheduler's `page_table` becomes a tagged view of the same storage (on a GPU
    the table is on the device already)."""
    if llm.page_table.device.type == "cpu" and not isinstance(llm.page_table, OnDevice):
        llm.page_table = llm.page_table.as_subclass(OnDevice)


def _on_the_device(t: torch.Tensor) -> bool:
    return t.is_cuda or isinstance(t, OnDevice)


def _to_the_host(func, args, kwargs) -> str | None:
    if func in _READS:
        return _READS[func]
    if func is torch.Tensor.to:
        # a bare "cpu" is the host; on a CPU the scheduler's device is "cpu:0" (device_tags)
        for d in [kwargs.get("device"), *args[1:]]:
            if isinstance(d, (str, torch.device)):
                try:
                    d = torch.device(d)
                except RuntimeError:
                    continue
                if d.type == "cpu" and d.index is None:
                    return f".to({str(d)!r})"
    return None


class _RecordHostCopies(TorchFunctionMode):
    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table
        self.copies: List[str] = []
        self.paused = 0

    def _what(self, t: torch.Tensor) -> str:
        if t.shape == self.table.shape and t.data_ptr() == self.table.data_ptr():
            return f"the whole page table {list(t.shape)}"
        return f"a device tensor of shape {list(t.shape)}"

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.paused and args and isinstance(args[0], torch.Tensor):
            how = _to_the_host(func, args, kwargs)
            if how is not None and _on_the_device(args[0]):
                self.copies.append(f"{how} of {self._what(args[0])}")
        return func(*args, **kwargs)


@contextmanager
def host_copies(llm) -> Iterator[List[str]]:
    """Within the block, each copy of a device tensor to the host is appended, in words, to the
    list this yields (the cache manager's `allocate_paged` aside)."""
    recorder = _RecordHostCopies(llm.page_table)
    manager = llm.cache_manager
    allocate = manager.allocate_paged
    own = "allocate_paged" in vars(
        manager
    )  # set on the instance (a test's stand-in) or the class's

    def allocate_unrecorded(*args, **kwargs):
        recorder.paused += 1
        try:
            return allocate(*args, **kwargs)
        finally:
            recorder.paused -= 1

    manager.allocate_paged = allocate_unrecorded
    try:
        with recorder:
            yield recorder.copies
    finally:
        if own:
            manager.allocate_paged = allocate
        else:
            del manager.allocate_paged  # the class's method again
