"""What the fused graphs of speculative decoding share (issue 47): a decode step of N rows built
from device tensors only, so that a capture records all of it, and the capture of one graph per
batch size.

A graph of graph.py replays one model forward, its inputs copied in by the host before each
replay. The fused graphs capture more: the draft model's whole proposal (k forwards, each fed the
argmax of the one before: minisgl/speculative/draft_graph.py), the verify step with its greedy
acceptance (verify_graph.py). Their inputs are one int64 block the host copies in once; every
other tensor (positions, key lengths, KV locations, token ids) is computed from it inside the
graph.
"""

from __future__ import annotations

import gc
from typing import Callable, Dict, List, Tuple

import torch

from minisgl.attention import AttentionMetadata
from minisgl.core import Batch
from minisgl.kernel.triton_launch import check_vectors

from .graph_emulation import EmulatedGraph, capture


def forward_rows(engine, ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor):
    """Logits [N, V] of one decode step of N rows of `engine`'s model: row n is token ids[n] at
    `positions[n]` of page-table row `rows[n]`, whose KV location the page table gives there, with
    positions[n] + 1 keys (decode_rows.py's form). Device tensors in, no host read."""
    # checked on every device: the GPU's kernels read them by pointer, the CPU's torch would not
    # mind a strided view (so only a GPU run would show one)
    check_vectors(ids=ids, positions=positions, rows=rows)
    n = ids.shape[0]
    dev, table = ids.device, engine.page_table
    meta = AttentionMetadata(
        cu_seqlens_q=torch.arange(n + 1, dtype=torch.int32, device=dev),
        cache_seqlens=(positions + 1).to(torch.int32),
        page_table=table,
        last_indices=torch.arange(n, dtype=torch.int64, device=dev),
        max_seqlen_q=1,
        max_seqlen_k=table.shape[1],
        rows=rows,
    )
    batch = Batch(reqs=[None] * n, phase="decode")
    batch.input_ids, batch.positions = ids, positions
    batch.out_loc = table[rows, positions].to(torch.int64)
    batch.attn_metadata = meta
    with engine.ctx.forward_batch(batch):
        if engine.backend_name != "triton":  # the torch backend reads the rows gathered
            meta.page_table = table.index_select(0, rows)
        return engine.model.forward()


def scratch_everywhere(engine) -> None:
    """Map every position of the engine's scratch row to the scratch location: a padding request
    of a fused graph runs several positions there, and each must write its KV nowhere that
    matters (graph.py maps position 0 only; location 0 belongs to a real request)."""
    table = engine.page_table
    table[engine.dummy_row].fill_(int(table[engine.dummy_row, 0]))


def capture_sizes(
    engine,
    sizes: List[int],
    work: Callable[[int], torch.Tensor],
    before: Callable[[int], None] | None = None,
) -> Dict[int, Tuple[object, torch.Tensor]]:
    """{size: (graph, output)}: `work(size)` captured for each size, largest first (the smaller
    graphs share its memory pool), on the engine's stream, each after one warm-up run;
    `before(size)`, where given, runs before each warm-up (outside the capture: staging the
    inputs a padding batch of that size reads)."""
    stream, is_cuda = engine.stream, engine.device.type == "cuda"
    graphs: Dict[int, Tuple[object, torch.Tensor]] = {}
    pool = None
    gc.collect()
    gc.disable()  # as GraphRunner: a collection could free CUDA objects mid-capture
    try:
        with torch.inference_mode():
            if is_cuda:
                torch.cuda.synchronize()
            for size in sorted(sizes, reverse=True):
                with stream.context():
                    if before is not None:
                        before(size)
                    work(size)  # warm-up: kernels compiled, workspaces settled
                stream.synchronize()
                if is_cuda:
                    graph = torch.cuda.CUDAGraph()
                    ctx = torch.cuda.graph(graph, pool=pool, stream=stream.raw)
                else:
                    graph = EmulatedGraph()
                    ctx = capture(graph, pool)
                with ctx:
                    out = work(size)
                if pool is None:
                    pool = graph.pool()
                graphs[size] = (graph, out)
            stream.synchronize()
    finally:
        gc.enable()
    return graphs
