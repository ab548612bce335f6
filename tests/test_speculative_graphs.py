"""Speculative decoding replayed from CUDA graphs (issue 47): the verify step runs as a decode step
of one row per scored token (minisgl/engine/decode_rows.py), and the draft model's steps (its
catch-up on the accepted tokens, then its greedy decode steps) run as decode steps too, so both
engines replay them from their graphs. On a CPU the graphs are emulated
(minisgl/engine/graph_emulation.py): a replay re-runs only the captured operators on the static
buffers, so a buffer a replay forgets to refresh gives wrong tokens here as on a GPU.

Every case checks that the tokens are the engine's without speculation and without graphs, and
that every step a graph holds was replayed from one (GraphRunner.replays counts them).
"""

from __future__ import annotations

from typing import List

import pytest
import torch

from helpers import MODEL, build_llm, greedy, hf_greedy, prompt_ids, test_device
from minisgl.core import Req, SamplingParams
from minisgl.engine import EngineConfig
from minisgl.engine.decode_rows import decode_rows
from minisgl.scheduler.config import SchedulerConfig
from minisgl.speculative.draft_model import DraftModelDrafter
from test_speculative import ReferenceDrafter, _prompts, _reference, _run_checked

DRAFT = "minisgl/assets/shakespeare-qwen3-draft"

# drafter: "lookup", "draft" (the bundled draft model) or the ReferenceDrafter's corruption rate
# (0.0 an oracle, 1.0 an adversary). Five prompts and 4 slots: batches of 1 to 4 requests, whose
# rows pad to a captured size. cuda_graph_max_bs=2: verify steps above 2 * (k + 1) rows run eagerly.
CASES = {
    "lookup-k1": dict(drafter="lookup", k=1),
    "lookup-k3-page4-naive": dict(drafter="lookup", k=3, page_size=4, cache_type="naive"),
    "corrupted-k8": dict(drafter=0.3, k=8),
    "oracle-k3-page4-overlap": dict(drafter=0.0, k=3, page_size=4, overlap_scheduling=True),
    "adversary-k3-small-graphs": dict(drafter=1.0, k=3, cuda_graph_max_bs=2),
    "draft-k3": dict(drafter="draft", k=3),
    "draft-k8-page4-naive": dict(drafter="draft", k=8, page_size=4, cache_type="naive"),
}


def _graph_llm(drafter, k: int, **options):
    spec = dict(speculative="draft", draft_model=DRAFT) if drafter == "draft" else {}
    llm = build_llm(
        **{"speculative": "lookup", **spec},
        num_speculative_tokens=k,
        use_cuda_graph=True,
        max_running_req=4,
        **options,
    )
    if not isinstance(drafter, str):
        sequences = [p + r for p, r in zip(_prompts(), _reference())]
        llm.drafter = ReferenceDrafter(sequences, llm.vocab_size, drafter)
    return llm


class _Calls:
    """The batches an engine's run_model was given, with whether each replayed a graph, and how
    many steps its graph runner's replay_next ran (a draft's steps that advance the last one)."""

    def __init__(self, engine) -> None:
        self.engine, self.run = engine, engine.run_model
        self.calls: List[tuple] = []  # (batch, replayed)
        self.nexts = 0
        engine.run_model = self
        runner = engine.graph_runner
        replay_next = runner.replay_next

        def counted(*args):
            self.nexts += 1
            return replay_next(*args)

        runner.replay_next = counted

    def __call__(self, batch):
        before = self.engine.graph_runner.replays
        logits = self.run(batch)
        self.calls.append((batch, self.engine.graph_runner.replays > before))
        return logits


def _rows_per_request(batch) -> int:
    tables = [r.table_idx for r in batch.reqs]
    return max(tables.count(t) for t in tables)


@pytest.mark.parametrize("case", list(CASES))
def test_verify_and_draft_steps_replay_from_graphs_with_the_plain_engines_tokens(case):
    options = dict(CASES[case])
    llm = _graph_llm(options.pop("drafter"), options.pop("k"), **options)
    runner = llm.engine.graph_runner
    target = _Calls(llm.engine)
    draft = _Calls(llm.drafter.engine) if case.startswith("draft") else None

    assert _run_checked(llm, _prompts(), greedy(20)) == _reference(), case
    stats = llm.spec_stats
    assert stats.verifies > 0
    # a step runs from a graph exactly when it is a decode step (a verify step's rows included)
    # that a captured size holds
    decode_steps = [(b, r) for b, r in target.calls if b.is_decode]
    assert all(not r for b, r in target.calls if not b.is_decode), "a prefill step replayed"
    for batch, replayed in decode_steps:
        assert replayed == (batch.size <= runner.max_bs), (batch.size, runner.max_bs, replayed)
    verifies = [r for b, r in decode_steps if _rows_per_request(b) > 1]
    # with the draft model, a greedy verify step whose drafts stayed on the device runs whole in
    # the verify graph (minisgl/engine/verify_graph.py), without run_model
    fused = llm.verify_graphs.replays if llm.verify_graphs is not None else 0
    assert (fused > 0) == case.startswith("draft"), "the fused verify step ran where it should not"
    assert len(verifies) + fused == stats.verifies, "a verify step did not run as decode rows"
    if "small-graphs" in case:
        assert 0 < sum(verifies) < len(verifies), "want verify steps both replayed and eager"
    else:
        assert all(verifies), "a verify step ran eagerly"
    assert runner.replays == sum(r for _, r in target.calls)
    if draft is not None:
        catch_ups = [r for b, r in draft.calls if b.is_decode and _rows_per_request(b) > 1]
        steps = [r for b, r in draft.calls if b.is_decode and _rows_per_request(b) == 1]
        assert all(catch_ups), "the draft's catch-up did not replay a graph"
        assert all(steps), "a draft decode step did not replay a graph"
        # a proposal that catches up on one or two tokens is one replay of the proposal graph
        # (draft_graph.py); the first one, over the prompt, goes step by step
        assert llm.drafter.proposal.replays > 0, "no proposal replayed the proposal graph"
        replays = llm.drafter.engine.graph_runner.replays
        assert replays == sum(r for _, r in draft.calls) + draft.nexts


def test_speculation_sizes_the_graphs_for_k_plus_one_rows_per_request():
    config = SchedulerConfig(MODEL, speculative="lookup", num_speculative_tokens=3)
    assert config.cuda_graph_rows_per_req == 4
    assert SchedulerConfig(MODEL).cuda_graph_rows_per_req == 1
    llm = _graph_llm("lookup", 3)
    assert llm.engine.graph_runner.max_bs == 4 * 4, "4 requests of k + 1 = 4 rows"
    assert llm.drafter is not None
    with pytest.raises(ValueError, match="cuda_graph_rows_per_req"):
        EngineConfig(MODEL, cuda_graph_rows_per_req=0)


def test_decode_rows_see_their_own_requests_earlier_rows_only():
    """Row j of a span has position start + j and start + j + 1 keys, through its request's
    page-table row: the causal mask of an extend, from the lengths alone."""
    table = torch.arange(3 * 16, dtype=torch.int32).view(3, 16)
    batch = decode_rows([(2, 5, 8), (0, 0, 1)], table, torch.device("cpu"))
    meta = batch.attn_metadata
    assert batch.is_decode and batch.size == 4
    assert batch.positions.tolist() == [5, 6, 7, 0]
    assert meta.cache_seqlens.tolist() == [6, 7, 8, 1]
    assert meta.rows.tolist() == [2, 2, 2, 0]
    assert batch.out_loc.tolist() == [37, 38, 39, 0]
    with pytest.raises(ValueError, match="runs no position"):
        decode_rows([(1, 4, 4)], table, torch.device("cpu"))


def test_the_draft_models_catch_up_from_a_graph_proposes_its_greedy_continuation():
    """The draft model alone: its catch-up after a rejection (several tokens per request) runs as
    decode rows from a graph, and the proposals stay the draft's greedy continuation."""
    k = 4
    config = EngineConfig(
        MODEL,
        dtype=torch.float32,
        device=test_device(),
        max_running_req=8,
        num_page_override=512,
        max_seq_len_override=256,
        use_cuda_graph=True,
        cuda_graph_rows_per_req=k + 1,
    )
    drafter = DraftModelDrafter(MODEL, config)
    calls = _Calls(drafter.engine)
    prompts = prompt_ids()

    def reqs(seqs):
        return [
            Req(torch.tensor(s, dtype=torch.int32), 0, 0, 32, uid, SamplingParams())
            for uid, s in enumerate(seqs)
        ]

    first = drafter.propose(reqs(prompts), k)
    assert first == hf_greedy(prompts, k)
    assert calls.nexts == k - 2, "steps 2..k-1 advance step 1 (replay_next)"
    done = len(calls.calls)
    # every draft accepted, then the target's own token: the draft runs its last draft (never
    # run) and that token, two rows per request
    follow = [p + d + [d[0]] for p, d in zip(prompts, first)]
    assert drafter.propose(reqs(follow), k) == hf_greedy(follow, k)
    catch_up = calls.calls[done]  # the second propose's first forward
    assert _rows_per_request(catch_up[0]) == 2 and catch_up[1], "catch-up not replayed"
    # two drafts accepted, then another token: a catch-up of one token each, which the steps
    # after it advance
    nexts = calls.nexts
    again = [f + d[:2] + [d[2] + 1] for f, d in zip(follow, hf_greedy(follow, k))]
    assert drafter.propose(reqs(again), k) == hf_greedy(again, k)
    assert calls.nexts - nexts == k - 1, "steps 1..k-1 advance the one-token catch-up"
