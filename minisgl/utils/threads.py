"""The engine's thread policy: how many threads torch and tokenizers use in a process that runs
the engine (LLM, the server's scheduler and tokenizer worker, a TP rank, a test process).

Left to itself torch starts one OpenMP thread per core and splits every matmul over them. For the
bundled model a matmul is microseconds of work, so the split costs more (waking threads, waiting
at the barrier) than it saves; and when another process holds a core, the whole step waits for
the thread that is not running, at every op. benchmarks/thread_policy.py measured it on a 2-core
machine (benchmarks/results/2026-12-01-cpu-thread-policy.txt): beside one busy process, torch's
default 2 threads ran the bundled model 5-15x slower than 1 thread, and a 200M-parameter model
still lost most of its speed, while 1 thread kept nearly all of its idle speed.

So `auto` means:
- a GPU engine: 1 (the host only builds small index tensors; 8 TP ranks on one host would
  otherwise start 8 x cores threads);
- a CPU engine with a small model (under `LARGE_MODEL_PARAMS`): 1;
- a CPU engine with a larger model: half the cores, so one other busy program per two cores
  leaves the engine's threads running;
- an explicit OMP_NUM_THREADS in the environment wins over all of these (its owner meant it).
MINISGL_THREADS=N sets N threads; MINISGL_THREADS=keep leaves torch's setting alone.

Inter-op threads (torch's pool for `torch.jit.fork`-style parallelism; the engine uses none) are
set to 1 the first time, before any parallel work: torch refuses to change them later, so a second
call leaves them as they are. TOKENIZERS_PARALLELISM defaults to false: the engine encodes one
prompt at a time, and a forked process (the judge's, the server's) would otherwise warn and turn
it off anyway.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from minisgl.env import THREADS

LARGE_MODEL_PARAMS = 100_000_000  # above this, a CPU engine's matmuls are worth splitting


@dataclass(frozen=True)
class ThreadChoice:
    intra_op: int  # torch.get_num_threads() after the call
    inter_op: int  # torch.get_num_interop_threads() after the call
    reason: str  # why: "MINISGL_THREADS=4", "auto: small model on a CPU", ...


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def auto_threads(device: str = "cpu", num_params: int | None = None) -> tuple[int | None, str]:
    """The `auto` choice: (threads, reason); threads None leaves torch's setting (OMP_NUM_THREADS
    set)."""
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp:
        return None, f"auto: OMP_NUM_THREADS={omp}"
    if not str(device).startswith("cpu"):
        return 1, f"auto: {device} engine"
    if num_params is None or num_params < LARGE_MODEL_PARAMS:
        return 1, "auto: small model on a CPU"
    return max(1, usable_cores() // 2), "auto: large model on a CPU, half the cores"


def choose_threads(device: str = "cpu", num_params: int | None = None) -> tuple[int | None, str]:
    setting = THREADS.read()  # read when applied: a test or a launcher may set it late
    if setting == "keep":
        return None, "MINISGL_THREADS=keep"
    if isinstance(setting, int):
        return setting, f"MINISGL_THREADS={setting}"
    return auto_threads(device, num_params)


def matmul_params(model_config) -> int:
    """The weights a token's forward multiplies by (the layers' projections and the LM head; the
    embedding is a lookup): what sets a step's arithmetic, so what decides whether to split it."""
    c = model_config
    attention = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
    mlp = 3 * c.hidden_size * c.intermediate_size
    return c.num_layers * (attention + mlp) + c.vocab_size * c.hidden_size


def apply_thread_policy(device: str = "cpu", num_params: int | None = None) -> ThreadChoice:
    """Set this process's threads by the policy above. Call it in every process that runs the
    engine, as early as possible (Engine does, before loading weights); calling it again is
    harmless. `device`: where the engine computes; `num_params`: the model's parameter count
    (None: unknown, treated as small)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    threads, reason = choose_threads(str(device), num_params)
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    if reason != "MINISGL_THREADS=keep" and torch.get_num_interop_threads() != 1:
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # parallel work has started, or it was set before: keep torch's
            pass
    return ThreadChoice(torch.get_num_threads(), torch.get_num_interop_threads(), reason)
