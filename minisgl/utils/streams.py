"""Streams and events that work the same on a GPU and on a CPU.

On CUDA they are thin wrappers of `torch.cuda.Stream` / `torch.cuda.Event`. On a CPU there is no
asynchronous execution, so two stand-ins exist:

* eager (default): work runs the moment it is launched; events are always complete.
* deferred: work launched on a stream is queued and runs only when something synchronizes on the
  stream or on an event recorded after it (or when another stream waits on it). This imitates a GPU
  that is "behind" the CPU, so code that forgets an ordering rule computes wrong results on a
  laptop, deterministically, instead of only on a busy GPU now and then.

All work is submitted with `stream.launch(fn)`; on CUDA that runs `fn` under the stream, which
merely queues its kernels.
"""

from __future__ import annotations

from collections import deque
from contextlib import nullcontext
from typing import Callable, Deque, Tuple

import torch


class Stream:
    """The interface every stream offers."""

    def launch(self, fn: Callable[[], None]) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        raise NotImplementedError

    def wait_stream(self, other: "Stream") -> None:
        raise NotImplementedError

    def context(self):
        """A context manager under which torch work is issued to this stream."""
        return nullcontext()


class Event:
    def record(self, stream: Stream) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        raise NotImplementedError

    def query(self) -> bool:
        raise NotImplementedError


# ---------------------------------------------------------------- CPU, eager


class EagerStream(Stream):
    def launch(self, fn: Callable[[], None]) -> None:
        fn()

    def synchronize(self) -> None:
        pass

    def wait_stream(self, other: Stream) -> None:
        other.synchronize()


class EagerEvent(Event):
    def record(self, stream: Stream) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


# ---------------------------------------------------------------- CPU, deferred


class DeferredStream(Stream):
    """Queues work; runs it in order only when forced to."""

    def __init__(self) -> None:
        self._queue: Deque[Tuple[int, Callable[[], None]]] = deque()
        self._launched = 0  # sequence number of the last launched piece of work
        self._done = 0  # sequence number of the last piece of work that ran

    def launch(self, fn: Callable[[], None]) -> None:
        self._launched += 1
        self._queue.append((self._launched, fn))

    def run_until(self, seq: int) -> None:
        while self._queue and self._queue[0][0] <= seq:
            n, fn = self._queue.popleft()
            fn()
            self._done = n

    def synchronize(self) -> None:
        self.run_until(self._launched)

    def wait_stream(self, other: Stream) -> None:
        # Work launched here later must see everything `other` launched so far. The simplest correct
        # rendering on a CPU: make `other` finish now.
        other.synchronize()

    @property
    def pending(self) -> int:
        return len(self._queue)


class DeferredEvent(Event):
    def __init__(self) -> None:
        self._stream: DeferredStream | None = None
        self._seq = 0

    def record(self, stream: Stream) -> None:
        assert isinstance(stream, DeferredStream)
        self._stream, self._seq = stream, stream._launched

    def synchronize(self) -> None:
        if self._stream is not None:
            self._stream.run_until(self._seq)

    def query(self) -> bool:
        return self._stream is None or self._stream._done >= self._seq


# ---------------------------------------------------------------- CUDA


class CudaStream(Stream):
    def __init__(self, device: torch.device) -> None:
        self.raw = torch.cuda.Stream(device=device)

    def launch(self, fn: Callable[[], None]) -> None:
        with torch.cuda.stream(self.raw):
            fn()

    def synchronize(self) -> None:
        self.raw.synchronize()

    def wait_stream(self, other: Stream) -> None:
        assert isinstance(other, CudaStream)
        self.raw.wait_stream(other.raw)

    def context(self):
        return torch.cuda.stream(self.raw)


class CudaEvent(Event):
    def __init__(self) -> None:
        self.raw = torch.cuda.Event()

    def record(self, stream: Stream) -> None:
        assert isinstance(stream, CudaStream)
        self.raw.record(stream.raw)

    def synchronize(self) -> None:
        self.raw.synchronize()

    def query(self) -> bool:
        return self.raw.query()


# ---------------------------------------------------------------- factory


class DeviceKit:
    """Makes the right kind of stream and event for a device (and CPU stream mode)."""

    def __init__(self, device: torch.device, cpu_streams: str = "eager") -> None:
        if cpu_streams not in ("eager", "deferred"):
            raise ValueError(f"cpu_streams must be 'eager' or 'deferred', got {cpu_streams!r}")
        self.device = device
        self.is_cuda = device.type == "cuda"
        self.cpu_streams = cpu_streams

    def new_stream(self) -> Stream:
        if self.is_cuda:
            return CudaStream(self.device)
        return DeferredStream() if self.cpu_streams == "deferred" else EagerStream()

    def new_event(self) -> Event:
        if self.is_cuda:
            return CudaEvent()
        return DeferredEvent() if self.cpu_streams == "deferred" else EagerEvent()

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        """Page-locked host memory makes host->device copies truly asynchronous on CUDA."""
        return t.pin_memory() if self.is_cuda else t

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        if not self.is_cuda:
            return t
        return self.pin(t).to(self.device, non_blocking=True)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """'auto' (or None) picks CUDA when present; else "cpu", "cuda" or "cuda:N" (the engine runs
    on nothing else)."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for, but torch sees no CUDA GPU")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: torch sees {torch.cuda.device_count()} CUDA GPU(s)")
    return dev
