"""Whether `online_softmax_step` keeps the running state in float32 (chapter 17).

The attention kernels carry the running max, sum and weighted value sum (m_i, l_i, acc) through
their loop over key blocks, all three float32 from before the first block. A step that hands acc
back in the value cache's bfloat16 changes a loop-carried value's dtype: a GPU refuses to compile
that loop, while Triton's interpreter (how the kernels run on a CPU) runs it and returns whatever
the mixed arithmetic gives, NaN in the prefill test. So this asks the step itself, from a kernel
that calls it once on a float32 state and bfloat16 values: a `tl.static_assert` on each returned
dtype, checked by the interpreter as it runs and by a GPU as it compiles.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

import minisgl.kernel.triton_blocks as blocks  # the step as it is now (a learner's, once swapped)

from .kernels import _forget_compiled

KEPT_FLOAT32 = "online_softmax_step returned"


@triton.jit
def _one_online_step(V, LOC, OUT, stride_vl):
    d = tl.arange(0, 16)
    n = tl.arange(0, 16)
    loc = tl.load(LOC + n)
    s = tl.zeros((16, 16), dtype=tl.float32) + n[None, :] * 0.01
    m_i = tl.full((16,), float("-inf"), tl.float32)
    l_i = tl.zeros((16,), tl.float32)
    acc = tl.zeros((16, 16), tl.float32)
    m_i, l_i, acc = blocks.online_softmax_step(
        s, V, loc, n < 16, 0, d, stride_vl, 0, m_i, l_i, acc, False
    )
    tl.static_assert(
        acc.dtype == tl.float32,
        "online_softmax_step returned acc in another dtype than the float32 it was given",
    )
    tl.static_assert(
        l_i.dtype == tl.float32,
        "online_softmax_step returned l_i in another dtype than the float32 it was given",
    )
    tl.static_assert(
        m_i.dtype == tl.float32,
        "online_softmax_step returned m_i in another dtype than the float32 it was given",
    )
    tl.store(OUT + n[:, None] * 16 + d[None, :], acc / l_i[:, None])


def running_state_dtype_problem(device: torch.device | str = "cpu") -> str:
    """ "" when the step, given a float32 state and bfloat16 values, returns its state in float32;
    else which of m_i, l_i, acc it returned in another dtype."""
    # compiled on a GPU for the step it called last time: compile again for the one there now
    _forget_compiled(sys.modules[__name__])
    v = torch.randn(16, 16, device=device).bfloat16()
    loc = torch.arange(16, device=device)
    out = torch.empty(16, 16, device=device)
    try:
        _one_online_step[(1,)](v, loc, out, v.stride(0))
    except Exception as e:  # AssertionError in the interpreter, a CompilationError on a GPU
        said = str(e)
        if KEPT_FLOAT32 not in said:
            raise
        start = said.index(KEPT_FLOAT32)
        return said[start : said.index("float32 it was given", start) + len("float32 it was given")]
    return ""
