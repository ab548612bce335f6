"""The GPU's one-off start-up, done in the test process before its first test (judge.plugin).

A process's first CUDA work creates the CUDA context and the cuBLAS handles: about a second of CPU
time on the H200, once per process. Left to the first test, it is counted in that test's time
budget (budgets.py: 10 x the reference's measured time), so the first test of every file got 10 s
or more beyond its own work on a GPU (budgets.json: ch11's first test 1.77 s there, 0.63 s on a
CPU; ch07's 1.15 s against 0.06 s) and a learner's endless loop in it ran that much longer before
it was stopped. Done here, before any test's clock starts, it is paid by neither the reference's
measured times nor the learner's budget; the wall time is the same (the work was done anyway).

Only on a GPU: on a CPU there is nothing to start, and this module imports no torch there.
"""

from __future__ import annotations


def uses_cuda(device: str) -> bool:
    """Whether the tests of a run on `device` ("cpu" | "cuda" | "auto") run on the GPU: "auto" does
    where torch sees one (the repo's conftest makes the same choice)."""
    if device == "cuda":
        return True
    if device != "auto":
        return False
    import torch

    return bool(torch.cuda.is_available())


def warm_up(device: str) -> bool:
    """Create the CUDA context and the cuBLAS handles (a float32 and a bfloat16 matmul: the engine
    uses both) when the run is on a GPU. Returns whether it did."""
    if not uses_cuda(device):
        return False
    import torch

    try:
        dtypes = [torch.float32] + ([torch.bfloat16] if torch.cuda.is_bf16_supported() else [])
        for dtype in dtypes:
            x = torch.ones(8, 8, device="cuda", dtype=dtype)
            (x @ x).sum().item()  # .item(): waits for the GPU, so the work is done here
    except Exception:
        # Only a head start: a GPU that fails here fails the tests' own first CUDA call too, and
        # that is where the learner is told, with the test that met it.
        return False
    return True
