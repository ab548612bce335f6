"""The draft model's whole proposal as one graph replay (minisgl/speculative/draft_graph.py): the
drafts equal the step-by-step drafter's (no graphs) through cycles of acceptance and rejection,
for k = 1, 4 and 8, page sizes 1 and 4 and requests that catch up on one or two tokens in the same
call; and the emulated graph it relies on replays a dtype conversion of a refreshed buffer."""

from __future__ import annotations

import random

import pytest
import torch

from helpers import MODEL, prompt_ids, test_device
from minisgl.core import Req, SamplingParams
from minisgl.engine.graph_emulation import EmulatedGraph, capture
from minisgl.scheduler.config import SchedulerConfig
from minisgl.speculative.draft_model import DraftModelDrafter


def _drafter(k: int, page_size: int, graphs: bool) -> DraftModelDrafter:
    config = SchedulerConfig(
        MODEL,
        dtype=torch.float32,
        device=test_device(),
        max_running_req=4,
        num_page_override=1024 // page_size,
        max_seq_len_override=256,
        page_size=page_size,
        use_cuda_graph=graphs,
        num_speculative_tokens=k,
    )
    return DraftModelDrafter(MODEL, config)


def _req(ids, uid: int) -> Req:
    return Req(torch.tensor(ids, dtype=torch.int32), 0, 0, 200, uid, SamplingParams())


def _cycles(drafter: DraftModelDrafter, k: int, rounds: int = 6):
    """Proposals for three requests over `rounds` verify cycles: each cycle request i keeps a
    seeded number of its drafts (all of them: two tokens to catch up; fewer: one) and one token
    of the target's own."""
    rng = random.Random(k)
    seqs = [list(p) for p in prompt_ids()[:3]]
    seen = []
    for _ in range(rounds):
        drafts = drafter.propose([_req(s, uid) for uid, s in enumerate(seqs)], k)
        seen.append(drafts)
        for s, d in zip(seqs, drafts):
            kept = rng.choice([len(d), rng.randrange(len(d) + 1)])
            s.extend(d[:kept] + [(d[kept] + 1) % 4096 if kept < len(d) else 7])
    return seen


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_the_proposal_graph_drafts_what_the_step_by_step_drafter_drafts(k, page_size):
    fused = _drafter(k, page_size, graphs=True)
    assert fused.proposal is not None and fused.proposal.k == k
    want = _cycles(_drafter(k, page_size, graphs=False), k)
    assert _cycles(fused, k) == want
    # the first proposal (a prompt) goes step by step; every later one replays the graph
    assert fused.proposal.replays == len(want) - 1


def test_an_emulated_graph_replays_a_dtype_conversion_of_its_input():
    """`x.to(torch.int32)` of an int64 buffer is a new tensor, though aten.to's schema says its
    result may alias x: a replay must recompute it from the buffer's new values."""
    buffer = torch.zeros(3, dtype=torch.int64)
    graph = EmulatedGraph()
    with torch.inference_mode(), capture(graph):
        out = buffer.to(torch.int32) * 2
    buffer.copy_(torch.tensor([1, 2, 3]))
    graph.replay()
    assert out.tolist() == [2, 4, 6]


def test_the_attention_kernels_refuse_a_strided_vector_of_rows():
    """The Triton kernels read element b of rows / key lengths at the pointer + b: a strided view
    (the proposal graph's `rows[1::2]` once) gave each request another's row on a GPU, with no
    error, while the CPU's torch backend read it right. The launch refuses it now, on any device."""
    from minisgl.kernel.triton_launch import check_vectors

    rows = torch.arange(8)
    check_vectors(rows=rows[1::2].contiguous(), seqlens=torch.ones(4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"rows must be a contiguous 1-D tensor.*strides \(2,\)"):
        check_vectors(rows=rows[1::2])
    with pytest.raises(ValueError, match=r"seqlens must be a contiguous 1-D tensor"):
        check_vectors(seqlens=torch.ones(2, 3)[:, 0])
