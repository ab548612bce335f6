"""A CUDA graph for CPU tensors, so that what a graph replays can be seen on a laptop.

A CUDA graph does not re-run Python: at capture it records the kernels that were launched, with
the addresses they read and wrote and every host value (a shape, a Python int, a scalar) baked in;
a replay runs exactly those kernels again on whatever those addresses hold now. Code that hands a
graph new inputs by building new tensors, or that forgets to copy one input into its static buffer,
gets the old values without an error: plausible but wrong tokens.

`EmulatedGraph` does the same with torch operators. While capturing, a dispatch mode records every
operator run (`aten.mm`, `aten.index_put_`, ...) with its very arguments: the same tensor objects
and the same Python values. A replay runs that list again, in order, and writes each result into
the tensor the capture produced, so the tensors made during capture (the graph's memory pool) keep
their storage and later operators and the caller read them, as on a GPU. Nothing else runs: Python
code around the operators, a new tensor assigned to an attribute, a host value that changed since
capture, none of it reaches a replay.

Two things a real capture refuses are refused here too: reading a tensor's value on the host while
capturing (`.item()`; a GPU would have to wait for itself, which a capture cannot do), and an
operator whose result changes shape at replay (a graph's shapes are fixed).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten

# Operators that ask the host for a tensor's value, or whose output shape depends on the values:
# a CUDA graph cannot record either.
_HOST_READS = {
    aten._local_scalar_dense.default,  # .item(), int(t), bool(t)
    aten.nonzero.default,
    aten.masked_select.default,
}
# Allocations launch no kernel: a replay leaves their memory as the last writer left it.
_ALLOCATIONS = {
    aten.empty.memory_format,
    aten.empty_like.default,
    aten.empty_strided.default,
    aten.new_empty.default,
}


@dataclass
class _Op:
    func: Any
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    # results that own new memory: position, tensor, shape at capture (an `_unsafe_view` of a
    # temporary may later reshape the very tensor object, as matmul does with mm's result)
    fresh: List[Tuple[int, torch.Tensor, torch.Size]]


class EmulatedPool:
    """What `graph.pool()` hands on: graphs captured into one pool. On a GPU they share memory
    (the smaller ones reuse the first one's blocks); here it records who is in it."""

    def __init__(self) -> None:
        self.graphs: List["EmulatedGraph"] = []


class _Recorder(TorchDispatchMode):
    def __init__(self, ops: List[_Op]) -> None:
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS:
            raise RuntimeError(
                f"{func} reads a tensor's value on the host while a graph is capturing: a CUDA "
                "graph records device work only (a capture cannot wait for the device)"
            )
        out = func(*args, **kwargs)
        if func not in _ALLOCATIONS:
            self.ops.append(_Op(func, args, kwargs, _fresh_results(func, out, args, kwargs)))
        return out


def _fresh_results(func, out, args, kwargs) -> List[Tuple[int, torch.Tensor, torch.Size]]:
    """The results that are new tensors, not views of an argument or the argument an in-place
    operator wrote (those already hold the value once the operator has run again). A result the
    schema says may alias (`aten.to.dtype`: the argument itself when nothing changes) is new all
    the same when it shares no storage with an argument: `x.to(torch.int32)` of an int64 `x`."""
    flat, _ = tree_flatten(out)
    returns = func._schema.returns
    inputs = None
    fresh = []
    for i, t in enumerate(flat):
        if not isinstance(t, torch.Tensor):
            continue
        aliased = i < len(returns) and returns[i].alias_info is not None
        if aliased:
            if inputs is None:
                given, _ = tree_flatten((args, kwargs))
                inputs = {_storage(a) for a in given if isinstance(a, torch.Tensor)}
            aliased = _storage(t) in inputs
        if not aliased:
            fresh.append((i, t, t.shape))
    return fresh


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class EmulatedGraph:
    """`torch.cuda.CUDAGraph`'s interface on CPU tensors: capture_begin / capture_end (or the
    `capture` context manager below), replay, pool."""

    def __init__(self) -> None:
        self._ops: List[_Op] = []
        self._recorder: _Recorder | None = None
        self._pool: EmulatedPool | None = None
        self.replays = 0

    def capture_begin(self, pool: EmulatedPool | None = None) -> None:
        if self._recorder is not None or self._ops:
            raise RuntimeError("this graph is already captured: make a new one to capture again")
        if pool is not None and not isinstance(pool, EmulatedPool):
            raise TypeError(f"pool must come from EmulatedGraph.pool(), got {type(pool).__name__}")
        self._pool = pool if pool is not None else EmulatedPool()
        self._pool.graphs.append(self)
        self._recorder = _Recorder(self._ops)
        self._recorder.__enter__()

    def capture_end(self) -> None:
        if self._recorder is None:
            raise RuntimeError("capture_end without capture_begin")
        recorder, self._recorder = self._recorder, None
        recorder.__exit__(None, None, None)

    def pool(self) -> EmulatedPool:
        if self._pool is None:
            raise RuntimeError("the graph has no pool before it is captured")
        return self._pool

    @property
    def num_ops(self) -> int:
        """How many operators a replay runs (a GPU graph's count would be its kernels)."""
        return len(self._ops)

    @torch.inference_mode()
    def replay(self) -> None:
        if self._recorder is not None:
            raise RuntimeError("replay while the graph is still capturing")
        if not self._ops:
            raise RuntimeError("replay of a graph that captured nothing")
        for op in self._ops:
            flat, _ = tree_flatten(op.func(*op.args, **op.kwargs))
            for i, kept, shape in op.fresh:
                new = flat[i]
                if new.shape != shape:
                    raise RuntimeError(
                        f"{op.func} gave shape {tuple(new.shape)} at replay, "
                        f"{tuple(shape)} at capture: a graph's shapes are fixed"
                    )
                kept.view(shape).copy_(new) if kept.shape != shape else kept.copy_(new)
        self.replays += 1


@contextmanager
def capture(graph: EmulatedGraph, pool: EmulatedPool | None = None) -> Iterator[EmulatedGraph]:
    """`with torch.cuda.graph(g, pool=...)` for an EmulatedGraph."""
    graph.capture_begin(pool)
    try:
        yield graph
    finally:
        graph.capture_end()
