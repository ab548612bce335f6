"""The verify step of speculative decoding: one forward scores every request's last token and its
draft, then each request keeps the longest run the target agrees with, plus one token of its own.

The scheduler's batch has phase "verify" (its accounting: one request, several tokens), but the
model runs it as a decode step of one row per token (decode_rows.py): request i's last token and
its d_i draft tokens are d_i + 1 rows, row j at position base_i - 1 + j with base_i + j keys, so
row j sees the KV of rows 0..j of its request and predicts the token after draft j - 1. A decode
step is what the CUDA graphs replay (a batch of T rows runs the graph of the smallest captured
size >= T, padded with dummy rows; the engine captures sizes up to max_running_req * (k + 1) when
speculation is on), and each row is scored by the decode attention kernel, as a plain decode step
scores that position. The logits, one row per token, are gathered into [B, k+1, V] (positions past
d_i repeat the last one: padding that verification never reads), then:

* greedy rows: `verify_greedy` on the argmax;
* sampled rows: the sampler's own rule (temperature, then `top_k_top_p_filter`) gives the target's
  distribution at each position, and `verify_sampled` accepts or resamples, so the tokens follow
  that distribution exactly, whatever the drafter proposed. Rows without a seed draw from the
  engine's generator; a seeded row draws alone from a generator of (seed, position of its first
  new token), so it gets the same tokens whatever else is in the batch;
* constrained rows: each position's logits are masked by the grammar's bitmask at that point of
  the draft before anything else (the scheduler truncated the draft where the grammar refuses it).

The accepted tokens are written into the token pool (the next step reads the last one) and copied
to the host with their count, and the logprobs of each position for requests that ask, before the
output's `copy_done` is recorded. Rolling back the KV of rejected positions is the scheduler's job
(minisgl/scheduler/speculative.py): the engine does not own pages.

A greedy step whose drafts the draft model left on the device runs instead as one replay of
verify_graph.py, which captures the forward, this acceptance rule and the token-pool writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple

import torch

from minisgl.core import Batch
from minisgl.speculative.accept import verify_greedy, verify_sampled
from minisgl.utils import Event

from .engine import Engine, ForwardInput
from .request_sampling import _to_host, position_seed
from .sampler import Sampler, top_k_top_p_filter


@dataclass
class VerifyPlan:
    """What the scheduler decided for one verify step, on the host (lists) and the device."""

    k: int  # the widest draft of the batch (the step scores k + 1 positions per request)
    draft_lens: List[int]  # d_i per request (0: it decodes as usual in this step)
    bases: List[int]  # each request's device_len at launch: where its first new token goes
    draft: torch.Tensor  # [B, k] int64 on the device, 0 past d_i
    seeds: List[Tuple[int, int]] = field(default_factory=list)  # (row, seed) of seeded sampled rows
    logprob_rows: List[int] = field(default_factory=list)  # rows whose tokens are scored
    logprob_k: int = 0  # the most alternatives any of them asks for
    mask_rows: torch.Tensor | None = None  # [C] int64 host: flat (i * (k+1) + j) rows masked
    bitmask: torch.Tensor | None = None  # [C, W] int32 host
    # what the model runs: one decode row per scored token, request after request (decode_rows.py)
    rows: Batch | None = None


@dataclass
class VerifyInput(ForwardInput):
    plan: VerifyPlan | None = None


@dataclass
class VerifyOutput:
    """Host results, valid once `copy_done` has completed."""

    tokens_cpu: torch.Tensor  # [B, k+1] int64, -1 past count
    count_cpu: torch.Tensor  # [B] int64: accepted drafts + 1
    copy_done: Event
    token_lp: torch.Tensor | None = None  # [B, k+1] float32: logprob of each new token
    top_lp: torch.Tensor | None = None  # [B, k+1, K]
    top_ids: torch.Tensor | None = None  # [B, k+1, K]


def _gather_positions(engine: Engine, logits: torch.Tensor, draft_lens: List[int], k: int):
    """[B, k+1, V] from the rows' logits [T, V]: request i's positions 0..d_i, the last one
    repeated past d_i."""
    index, start = [], 0
    for d in draft_lens:
        index.append([start + min(j, d) for j in range(k + 1)])
        start += d + 1
    return logits[engine.kit.to_device(torch.tensor(index, dtype=torch.int64))]


def verify(engine: Engine, fi: VerifyInput, logits: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """tokens [B, k+1], count [B] (on the device) and the positions' logits [B, k+1, V] (masked
    where a grammar applies), from the verify step's logits."""
    plan, args = fi.plan, fi.sample_args
    k = plan.k
    per_pos = _gather_positions(engine, logits, plan.draft_lens, k).float()
    b, _, vocab = per_pos.shape
    if plan.bitmask is not None:
        from minisgl.structured.bitmask import apply_bitmask_

        flat = per_pos.view(b * (k + 1), vocab)
        apply_bitmask_(flat, plan.mask_rows.to(flat.device), plan.bitmask.to(flat.device))
    draft_len = engine.kit.to_device(torch.tensor(plan.draft_lens, dtype=torch.int64))
    tokens, count = verify_greedy(plan.draft, draft_len, per_pos.argmax(dim=-1))
    if args.temperatures is None:
        return tokens, count, per_pos
    # the sampler's rule at every position: temperature, then top-k and top-p, per request
    temps = args.temperatures.clamp_min(1e-6).view(b, 1, 1)
    filtered = top_k_top_p_filter(
        (per_pos / temps).view(b * (k + 1), vocab),
        args.top_k.repeat_interleave(k + 1),
        args.top_p.repeat_interleave(k + 1),
    )
    probs = filtered.softmax(dim=-1).view(b, k + 1, vocab)
    sampled = [i for i, p in enumerate(fi.batch.reqs) if not p.sampling_params.is_greedy]
    seeded = dict(plan.seeds)
    free = [i for i in sampled if i not in seeded]
    groups = [(free, engine.sampler.generator)] if free else []
    for row, seed in plan.seeds:
        if plan.draft_lens[row] == 0:
            # nothing drafted: the plain step's own draw, so a seeded request's tokens do not
            # depend on whether a neighbour's draft made this a verify step
            r = slice(row, row + 1)
            tokens[row, 0] = Sampler(per_pos.device, seed).sample(per_pos[r, 0], args.rows(r))[0]
            continue
        groups.append(([row], torch.Generator(per_pos.device).manual_seed(seed)))
    for rows, generator in groups:
        # as wide as these rows' longest draft: a seeded row's draws (k uniforms, then one
        # token) must not depend on how far its neighbours drafted
        w = max(plan.draft_lens[i] for i in rows)
        r = engine.kit.to_device(torch.tensor(rows, dtype=torch.int64))
        t, c = verify_sampled(plan.draft[r, :w], draft_len[r], None, probs[r, : w + 1], generator)
        tokens[r] = torch.nn.functional.pad(t, (0, k - w), value=-1)
        count[r] = c
    return tokens, count, per_pos


def launch_verify(engine: Engine, fi: VerifyInput) -> VerifyOutput:
    """Queue the verify step on the engine stream and return its output without waiting. The
    requests' lengths are not advanced: how far each moves is known only when the step is handled
    (the scheduler sets them then)."""
    batch, plan = fi.batch, fi.plan
    bs, k = batch.size, plan.k
    out = VerifyOutput(
        tokens_cpu=engine.kit.pin(torch.empty((bs, k + 1), dtype=torch.int64)),
        count_cpu=engine.kit.pin(torch.empty(bs, dtype=torch.int64)),
        copy_done=engine.kit.new_event(),
    )
    rows = torch.tensor([r.table_idx for r in batch.reqs], dtype=torch.int64)
    bases = torch.tensor(plan.bases, dtype=torch.int64)

    def work() -> None:
        # copied here, on the engine stream: the engine stream waited for the scheduler's before
        # this launch, not for anything the scheduler's stream does after it
        rows_dev, bases_dev = engine.kit.to_device(rows), engine.kit.to_device(bases)
        # the tokens of the decode rows, in their order: each request's last token and its draft
        plan.rows.input_ids = engine.token_pool[fi.input_tuple]
        logits = engine.run_model(plan.rows)
        tokens, count, per_pos = verify(engine, fi, logits)
        # every accepted token into the token pool at its position (the next step reads the last)
        dev = tokens.device
        cols = bases_dev.unsqueeze(1) + torch.arange(k + 1, device=dev).unsqueeze(0)
        keep = tokens >= 0
        row_idx = rows_dev.unsqueeze(1).expand(-1, k + 1)
        # past the count (-1) the write goes to the scratch row: no boolean mask, whose indexing
        # would wait for the device
        row_idx = torch.where(keep, row_idx, engine.dummy_row)
        engine.token_pool[row_idx, torch.where(keep, cols, 0)] = tokens.clamp_min(0).to(torch.int32)
        out.tokens_cpu.copy_(tokens, non_blocking=True)
        out.count_cpu.copy_(count, non_blocking=True)
        if plan.logprob_rows:
            lr = engine.kit.to_device(torch.tensor(plan.logprob_rows, dtype=torch.int64))
            lsm = torch.log_softmax(per_pos[lr], dim=-1)  # [G, k+1, V], after the grammar's mask
            chosen = tokens[lr].clamp_min(0).unsqueeze(2)
            lp = torch.zeros((bs, k + 1), dtype=torch.float32, device=dev)
            lp[lr] = lsm.gather(2, chosen).squeeze(2)
            out.token_lp = _to_host(lp)
            if plan.logprob_k:
                top_lp, top_ids = lsm.topk(plan.logprob_k, dim=-1)
                full_lp = torch.zeros((bs, k + 1, plan.logprob_k), device=dev)
                full_ids = torch.zeros((bs, k + 1, plan.logprob_k), dtype=torch.int64, device=dev)
                full_lp[lr], full_ids[lr] = top_lp, top_ids
                out.top_lp, out.top_ids = _to_host(full_lp), _to_host(full_ids)

    engine.stream.launch(work)
    out.copy_done.record(engine.stream)
    return out


def seed_of(seed: int, base: int) -> int:
    """A seeded request's generator seed for the verify step whose first new token goes to
    position `base` (the same mix as a plain step's draw at that position)."""
    return position_seed(seed, base)
