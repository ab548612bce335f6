"""What every Triton launch of the engine shares (GPU only: this imports nothing from triton, but
only the kernel modules beside it use it).

* `launch(kernel, grid, ...)`: one place that launches, and skips a grid with no programs (an
  empty batch, a prefill with no new tokens), which the kernels would otherwise each test for; a
  kernel marked `pdl_aware` (triton_pdl.py) is started with programmatic dependent launch.
* `settings(defaults, tuning)`: a launch's settings (block sizes, warps, stages), which a
  benchmark may override (benchmarks/decode_kernels.py); a key the launch does not know is refused
  rather than silently unused.
* `paged_kv_strides(q, k_cache, v_cache, page_table)`: the checks and the stride arguments the two
  paged attention kernels (triton_decode.py, triton_prefill.py) take in the same order.
* `check_vectors(...)`: the per-request vectors those kernels read by pointer are contiguous.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Sequence, Tuple

import torch


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def settings(defaults: Dict[str, Any], tuning: Dict[str, Any] | None) -> Dict[str, Any]:
    unknown = sorted(set(tuning or {}) - set(defaults))
    if unknown:
        raise ValueError(f"unknown launch settings {unknown}; this launch takes {sorted(defaults)}")
    return {**defaults, **(tuning or {})}


def launch(kernel, grid: Sequence[int], *args, **meta) -> None:
    """`kernel[grid](*args, **meta)`, unless the grid has no programs."""
    if all(g > 0 for g in grid):
        # only a kernel marked pdl_aware, never one that does not wait (a learner's)
        if math.prod(grid) <= getattr(kernel, "minisgl_pdl_programs", 0):
            meta["launch_pdl"] = True
        kernel[tuple(grid)](*args, **meta)


def paged_kv_strides(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor
) -> Tuple[int, ...]:
    """q: [tokens, H, D]; k_cache, v_cache: [locations, Hkv, D]; page_table: [R, max_len]. Checks
    what the kernels assume (a power-of-two head size from 16: whole tiles; unit strides in the
    last dimension) and returns the strides they take after their pointers."""
    head_dim = q.shape[-1]
    assert head_dim == next_pow2(head_dim) and head_dim >= 16, (
        "head_dim must be a power of two >= 16"
    )
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    assert page_table.stride(-1) == 1
    return (
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        page_table.stride(0),
    )


def check_vectors(**vectors: torch.Tensor) -> None:
    """Refuse a per-request vector (rows, key lengths, query offsets) that is not one contiguous
    1-D run. A kernel reads element b of such a vector at its pointer + b, so a strided view
    (`rows[1::2]`, which torch indexing reads correctly) would hand it other requests' values,
    with no error: the proposal graph of speculative decoding once passed one."""
    for name, vector in vectors.items():
        if vector.dim() != 1 or not vector.is_contiguous():
            raise ValueError(
                f"{name} must be a contiguous 1-D tensor (the kernel reads element b at its "
                f"pointer + b), got shape {tuple(vector.shape)} with strides {vector.stride()}: "
                "pass .contiguous()"
            )
