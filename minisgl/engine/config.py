from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class EngineConfig:
    """Everything the engine needs to build itself. Most fields have a sensible default for the
    bundled model on a laptop."""

    model_path: str | Path
    dtype: torch.dtype | None = None  # None: float32 on a CPU, the checkpoint's dtype on a GPU
    device: str = "auto"  # "auto", "cpu", "cuda", "cuda:1", ...
    max_running_req: int = 16
    page_size: int = 1
    num_page_override: int | None = None  # fix the KV pool size (tests); else sized automatically
    max_seq_len_override: int | None = (
        None  # longest request (prompt + output); else the model's limit
    )
    memory_ratio: float = 0.85  # share of free GPU memory the KV pool may take
    cpu_kv_tokens: int = 65536  # KV pool size in tokens on a CPU when not overridden
    cpu_streams: str | None = (
        None  # "eager" / "deferred"; None: MINISGL_CPU_STREAMS (default eager)
    )
    seed: int | None = 0
    # "auto" (triton on a CUDA GPU if installed, else torch), "torch", "triton"; None:
    # MINISGL_ATTENTION_BACKEND (default auto)
    attention_backend: str | None = None
    # fused Triton norm/RoPE/SiLU kernels, with the triton backend only; None: MINISGL_FUSED_KERNELS
    # (default on)
    fused_kernels: bool | None = None
    use_cuda_graph: bool | None = (
        None  # None: on with CUDA + triton; True on a CPU: emulated graphs (chapter 18)
    )
    cuda_graph_max_bs: int = (
        64  # largest decode batch replayed from a graph; larger ones run eagerly
    )
    # decode rows per request the graphs must hold: a verify step of speculative decoding runs
    # k + 1 rows per request (minisgl/engine/decode_rows.py), so SchedulerConfig raises it to
    # 1 + num_speculative_tokens when speculation is on; graphs hold up to
    # min(cuda_graph_max_bs, max_running_req) * cuda_graph_rows_per_req rows
    cuda_graph_rows_per_req: int = 1
    # tensor-parallel ranks (processes, one GPU each on CUDA); >1 only through LLM(tp_size=N) or
    # serve --tp-size N, which start the ranks and their group (minisgl/llm/parallel.py)
    tp_size: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.model_path, (str, Path)):
            raise TypeError(
                f"model must be a directory path (str or Path), got "
                f"{type(self.model_path).__name__} {self.model_path!r}"
            )
        self.dtype = _dtype(self.dtype)
        for name in (
            "max_running_req",
            "page_size",
            "cuda_graph_max_bs",
            "cuda_graph_rows_per_req",
            "cpu_kv_tokens",
            "num_page_override",
            "max_seq_len_override",
            "seed",
            "tp_size",
        ):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
        for name in ("fused_kernels", "use_cuda_graph"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"{name} must be True, False or None, got {value!r}")
        ratio = self.memory_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ValueError(f"memory_ratio must be a number in (0, 1], got {ratio!r}")
        if self.cpu_kv_tokens < 1:
            raise ValueError("cpu_kv_tokens must be >= 1")
        if self.max_seq_len_override is not None and self.max_seq_len_override < 1:
            raise ValueError("max_seq_len_override must be >= 1")
        if self.max_running_req < 1:
            raise ValueError("max_running_req must be >= 1")
        if self.page_size < 1:
            raise ValueError("page_size must be >= 1")
        if self.num_page_override is not None and self.num_page_override < 1:
            raise ValueError("num_page_override must be >= 1")
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")
        if self.cuda_graph_max_bs < 1:
            raise ValueError("cuda_graph_max_bs must be >= 1")
        if self.cuda_graph_rows_per_req < 1:
            raise ValueError(
                f"cuda_graph_rows_per_req must be >= 1, got {self.cuda_graph_rows_per_req}"
            )


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _dtype(value: object) -> torch.dtype | None:
    """A torch dtype, or one of DTYPES' names ("bfloat16", also "torch.bfloat16"); None: the
    default."""
    if value is None or value in DTYPES.values():
        return value  # type: ignore[return-value]
    if isinstance(value, str) and value.removeprefix("torch.") in DTYPES:
        return DTYPES[value.removeprefix("torch.")]
    raise ValueError(
        f"dtype must be one of {', '.join(DTYPES)} (or the torch dtype), got {value!r}"
    )
