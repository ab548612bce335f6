"""The engine: owns the model, the KV cache, the page table and token pool, and runs one batch.

The engine works on its own stream. `forward_batch` only *launches* work there and advances each
request's CPU-side state right away (`complete_one`), so the scheduler can plan the next step
before this one has finished. The results arrive in a `ForwardOutput` whose `copy_done` event says
when the sampled tokens have reached the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

from minisgl.attention import create_attention_backend
from minisgl.attention.select import resolve_backend_name
from minisgl.core import Batch, Context, set_global_ctx
from minisgl.distributed import rank_device, tp_group
from minisgl.env import ENV
from minisgl.kernel.dispatch import fused_kernels
from minisgl.kvcache import KVCache
from minisgl.layers.cpu_layout import lay_out_for_cpu
from minisgl.models import ModelConfig, load_model
from minisgl.models.limits import ModelLimits
from minisgl.models.sharding import rank_config
from minisgl.utils import DeviceKit, Event, resolve_device
from minisgl.utils.threads import apply_thread_policy, matmul_params

from .config import EngineConfig
from .context import plan_pool
from .request_sampling import RequestSampler
from .sampler import BatchSamplingArgs
from .state import check_hybrid_engine, create_state_pool

Index2D = Tuple[torch.Tensor, torch.Tensor]  # (rows, columns) into the token pool


@dataclass
class ForwardInput:
    """One step, as the scheduler hands it to the engine."""

    batch: Batch
    sample_args: BatchSamplingArgs
    input_tuple: Index2D  # where each processed token's id is read from in the token pool
    write_tuple: Index2D  # where each request's sampled token is written in the token pool


@dataclass
class ForwardOutput:
    next_tokens_gpu: torch.Tensor  # [B] on the device, valid once the engine stream gets there
    next_tokens_cpu: torch.Tensor  # [B] on the host, valid after copy_done.synchronize()
    copy_done: Event


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._load_model(config)
        self._allocate_pools(config)
        self._build_runtime(config)
        if self.kit.is_cuda:
            # Everything built above (zeroed pools and tables, the KV cache) was queued on the
            # default stream, and the engine's and scheduler's streams do not wait for it: a
            # prompt written into the token pool could land before the pool's zeroing does.
            torch.cuda.synchronize(self.device)

    def _load_model(self, config: EngineConfig) -> None:
        """The device, the model's config, limits and weights (this rank's, under tensor
        parallelism: `rank_config` has its share of the heads, and the KV cache is sized by it)."""
        self.comm = tp_group(config.tp_size)
        self.device = rank_device(resolve_device(config.device), self.comm)
        self.kit = DeviceKit(self.device, config.cpu_streams or str(ENV.CPU_STREAMS.value))
        self.model_config = ModelConfig.from_dir(config.model_path)
        check_hybrid_engine(config, self.model_config)  # before the weights: a quick refusal
        self.rank_config = (
            rank_config(self.model_config, self.comm.size)
            if self.comm.size > 1
            else self.model_config
        )
        if config.dtype is not None:
            self.dtype = config.dtype
        else:  # a CPU has no fast bf16 matmul; a GPU runs the checkpoint's own dtype
            self.dtype = self.model_config.dtype if self.kit.is_cuda else torch.float32
        # Before the weights load (their conversion runs on these threads): minisgl/utils/threads.py
        self.threads = apply_thread_policy(self.device.type, matmul_params(self.model_config))
        # RoPE's table waits for the context length, which on a GPU depends on the memory left
        # once the weights are in (context.py).
        self.model = load_model(
            config.model_path, self.dtype, self.device, max_positions=0, comm=self.comm
        )
        if not self.kit.is_cuda:  # same values, strides a CPU's decode matmul runs faster on
            lay_out_for_cpu(self.model)

    def _allocate_pools(self, config: EngineConfig) -> None:
        """The KV cache, the page table and the token pool, sized for the backend chosen here."""
        cfg = self.rank_config  # the heads this process computes
        self.page_size = config.page_size
        free = self._free_gpu_bytes() if self.kit.is_cuda else None
        plan = plan_pool(config, cfg, self.dtype, free, agree=self.comm.all_min)
        self.num_pages, self.max_seq_len = plan.num_pages, plan.max_seq_len  # context length
        self.model.size_rotary(self.max_seq_len, self.device)
        # context length (the engine's: plan_pool may cap the model's by the pool), vocabulary, end
        # ids, sampling defaults: what the scheduler's intake judges requests by
        self.limits = ModelLimits.resolve(config.model_path, self.model_config, self.max_seq_len)
        # Per engine: the config's choice, else the environment's default (minisgl/env.py).
        self.backend_name = resolve_backend_name(
            config.attention_backend or str(ENV.ATTENTION_BACKEND.value),
            self.device,
            (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim),
        )
        self.use_cuda_graph = self._want_cuda_graph()
        # CUDA graphs pad batches with dummy requests, whose KV goes to one scratch page past the
        # pool: the cache manager never hands it out.
        extra_pages = 1 if self.use_cuda_graph else 0
        self.kv_cache = KVCache(
            cfg.num_kv_layers,  # a hybrid model's full-attention layers only
            self.num_pages + extra_pages,
            self.page_size,
            cfg.num_kv_heads,
            cfg.head_dim,
            self.dtype,
            self.device,
        )
        # One row per request slot, plus a scratch row (the last) that absorbs writes nobody reads:
        # the sample of a half-done chunked prefill, and padding rows of CUDA graphs.
        rows = config.max_running_req + 1
        self.page_table = torch.zeros(rows, self.max_seq_len, dtype=torch.int32, device=self.device)
        self.token_pool = torch.zeros(rows, self.max_seq_len, dtype=torch.int32, device=self.device)
        self.dummy_row = rows - 1
        # a hybrid model's per-request DeltaNet state, one row per slot like the tables (state.py)
        self.state_pool = create_state_pool(config, cfg, self.dtype, self.device)
        if self.state_pool is not None:
            self.model.attach_state(self.state_pool)

    def _free_gpu_bytes(self) -> int:
        """The GPU memory this rank's pool may plan with. Ranks that share one GPU ("cuda:0" under
        tensor parallelism) each get an equal part, measured once every rank's weights are in
        (all_min doubles as the barrier), so that their pools fit side by side."""
        sharing = self.comm.size if resolve_device(self.config.device).index is not None else 1
        if sharing > 1:
            self.comm.all_min(0)
        return torch.cuda.mem_get_info(self.device)[0] // sharing

    def _build_runtime(self, config: EngineConfig) -> None:
        """The attention backend, the forward context (fused kernels or not), the sampler, the
        engine's stream and, where used, the CUDA-graph runner."""
        cfg = self.rank_config
        # fused element-wise kernels go with the Triton backend, for this engine only (see
        # dispatch.py)
        want_fused = (
            config.fused_kernels
            if config.fused_kernels is not None
            else bool(ENV.FUSED_KERNELS.value)
        )
        self.attn_backend = create_attention_backend(
            self.backend_name,
            self.kv_cache,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            self.page_table,
        )
        self.ctx = Context(
            self.page_size,
            self.kv_cache,
            self.attn_backend,
            fused_kernels(self.backend_name == "triton" and want_fused),
        )
        set_global_ctx(self.ctx)
        self.sampler = RequestSampler(self.device, config.seed)
        self.stream = self.kit.new_stream()
        self.graph_runner = self._build_graph_runner() if self.use_cuda_graph else None

    def _want_cuda_graph(self) -> bool:
        """On a GPU with the triton backend (and NCCL under tensor parallelism) graphs are on unless
        turned off. On a CPU they are off
        unless asked for: then the runner captures emulated graphs (graph_emulation.py), slower
        than eager, there so that a graph's rules can be seen at work on a laptop."""
        asked = self.config.use_cuda_graph
        if not self.kit.is_cuda:
            return bool(asked)
        possible = self.backend_name == "triton" and self.comm.capturable
        if asked and self.backend_name != "triton":
            raise ValueError(
                "CUDA graphs on a GPU need the triton attention backend "
                f"(device {self.device}, backend {self.backend_name})"
            )
        if asked and not self.comm.capturable:
            raise ValueError(
                f"CUDA graphs under tensor parallelism need NCCL: these {self.comm.size} ranks "
                f"share {self.device} and talk over gloo, whose collectives a graph cannot capture"
            )
        return possible if asked is None else bool(asked)

    def _build_graph_runner(self):
        from .graph import GraphRunner

        scratch_loc = self.num_pages * self.page_size  # first location of the scratch page
        self.page_table[self.dummy_row, 0] = scratch_loc
        # in decode rows: a verify step of speculative decoding runs k + 1 per request
        # (decode_rows.py), and must fit a graph as a plain decode step does
        max_reqs = min(self.config.cuda_graph_max_bs, self.config.max_running_req)
        max_bs = max_reqs * self.config.cuda_graph_rows_per_req
        with torch.inference_mode():
            return GraphRunner(
                self.model,
                self.ctx,
                self.stream,
                max_bs,
                self.dummy_row,
                scratch_loc,
                self.max_seq_len,
                self.page_table,
                reads_rows=self.backend_name == "triton",
            )

    def run_model(self, batch: Batch) -> torch.Tensor:
        """Logits of `batch` (its input ids gathered): a CUDA graph's replay when one fits, else
        eager."""
        size = self.graph_runner.graph_size(batch) if self.graph_runner is not None else None
        if size is not None:
            return self.graph_runner.replay(batch, size)
        with self.ctx.forward_batch(batch):
            return self.model.forward()

    def empty_output(self) -> ForwardOutput:
        """The output of a step that computed nothing (its batch failed): no tokens, done at
        once."""
        out = ForwardOutput(
            next_tokens_gpu=torch.empty(0, dtype=torch.int32, device=self.device),
            next_tokens_cpu=torch.empty(0, dtype=torch.int32),
            copy_done=self.kit.new_event(),
        )
        out.copy_done.record(self.stream)
        return out

    def forward_batch(self, fi: ForwardInput) -> ForwardOutput:
        """Launch one step on the engine stream and return its output without waiting for it.

        The CPU runs ahead of the device: the step's work is queued on the engine stream, and the
        requests' CPU state advances at once. Each sample is written into the token pool, where the
        next step reads it, before `copy_done` is recorded, so whoever waits on `copy_done` sees it.

        Receives: `fi`, a ForwardInput: the batch (positions, out_loc, attention metadata filled in;
            lengths not yet advanced), `sample_args`, `input_tuple` (row, position of each processed
            token in the token pool) and `write_tuple` (row, column of each request's sample).
        Returns: a ForwardOutput: `next_tokens_gpu` [B] int32 on the device, `next_tokens_cpu` [B]
            int32 on the host (page-locked on a GPU), valid once `copy_done`, an event recorded on
            the engine stream after the step's work, has completed.
        Leaves: the step queued on `self.stream`, not waited for; when it runs: `batch.input_ids`
            read from the token pool, the samples in the token pool at `write_tuple` and in both
            output tensors; every request of the batch advanced by `complete_one` (on the CPU, at
            once).
        Uses: `self.stream.launch`, `self.kit.pin`, `self.kit.new_event`, `self.run_model`,
            `self.sampler.sample` (ch06); `self.token_pool` (ch04); `req.complete_one` (ch01).
        Checked: it returns before the step is done, with the requests advanced and int32 tokens;
            the next step reads the sample from the token pool without waiting; greedy generation
            through it matches Hugging Face.
        """
        batch = fi.batch
        bs = batch.size
        out = ForwardOutput(
            next_tokens_gpu=torch.empty(bs, dtype=torch.int32, device=self.device),
            next_tokens_cpu=self.kit.pin(torch.empty(bs, dtype=torch.int32)),
            copy_done=self.kit.new_event(),
        )

        def work() -> None:
            batch.input_ids = self.token_pool[fi.input_tuple]
            logits = self.run_model(batch)
            tokens = self.sampler.sample(logits, fi.sample_args)
            out.next_tokens_gpu.copy_(tokens)
            # The write into the token pool happens *before* copy_done is recorded: whoever waits on
            # copy_done may then reuse this request's row without racing this write.
            self.token_pool[fi.write_tuple] = tokens
            out.next_tokens_cpu.copy_(tokens, non_blocking=True)

        self.stream.launch(work)
        out.copy_done.record(self.stream)
        for req in batch.reqs:
            req.complete_one()
        return out

    def synchronize(self) -> None:
        self.stream.synchronize()
