"""Programmatic dependent launch (PDL): on a Hopper or newer GPU a kernel may start while the
kernel before it is still finishing, do what needs nothing of that kernel's output (read its
weights), then wait for it. At batch 1 a decode step is some 300 launches of a few microseconds
each, and most of a small kernel's time is the ramp: being launched, then waiting for the first
bytes of its weights. With PDL each matrix-vector product streams its weights while the norm or
the combine before it runs.

The contract of a kernel launched this way (`pdl_aware` marks it; `launch` in triton_launch.py
then asks the driver for a programmatic launch when the grid is small enough to gain, see
`MAX_PROGRAMS`):

* before `wait_for_previous_kernel()` it reads only what no kernel writes: weights, tables made at
  start-up, and the step's inputs copied in before the first kernel runs;
* it writes nothing before that wait (an earlier kernel may still be reading the memory);
* `let_next_kernel_start()` after the wait lets the next kernel's programs be scheduled early;
  that kernel waits in turn, so a kernel never runs ahead of one that is not finished.

A kernel that is not marked (a learner's, swapped in by the judge, or one of torch's) is launched
the ordinary way, which waits for everything before it; so the marked ones are safe beside it.
`PDL` is True unless MINISGL_PDL=0, off a GPU (Triton's interpreter), before Hopper or with a
Triton without the instructions; then both helpers compile to nothing.

Measured on an H200 (benchmarks/decode_step.py, 2026-12-04, Qwen3-0.6B's shape, graphs on): a
batch-1 step 0.768 ms with PDL against 0.922 without, in alternating fresh processes; faster in
every pair. Some processes are slower whatever the setting (the GPU idles between kernels inside
the replayed graph: busy 35 % against 55 %, the kernels as long as in the fast ones). On by default
since the whole test suite passed with it on an H200 (1425 tests, 2026-12-04); MINISGL_PDL=0 turns
it off.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from minisgl.env import ENV


def _supported() -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1" or not ENV.PDL.value:
        return False
    import torch

    if not torch.cuda.is_available() or torch.version.hip is not None:
        return False
    cuda = getattr(tl.extra, "cuda", None)
    return torch.cuda.get_device_capability()[0] >= 9 and hasattr(cuda, "gdc_wait")


# read once, when the kernels are first imported: Triton compiles the kernels with the value
PDL = tl.constexpr(_supported())


def _max_programs() -> int:
    """The largest grid started early: one whose programs all fit on the GPU at once (four a
    multiprocessor). A grid of several waves is as long as its waves whenever it starts, and on an
    H200 batch 64's (attention and its combine: 1024 programs each) started early made the step
    0.87x as fast, where batch 1's were 1.24x faster (benchmarks/decode_step.py)."""
    if not PDL:
        return 0
    import torch

    return 4 * torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


MAX_PROGRAMS = _max_programs()


@triton.jit
def wait_for_previous_kernel():
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def let_next_kernel_start():
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


def pdl_aware(kernel):
    """Marks a kernel that keeps the contract above: `launch` starts a grid of it of at most
    `minisgl_pdl_programs` programs programmatically."""
    kernel.minisgl_pdl_programs = MAX_PROGRAMS
    return kernel
