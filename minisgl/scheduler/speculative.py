"""Speculative decoding in the scheduler: drafts, the verify step, and the rollback of what the
target rejected (issue 47; the pure rules are minisgl/speculative/, the step is
minisgl/engine/verify_step.py).

A decode step becomes a verify step when some request has a draft: the drafter proposes up to k
tokens from each request's host tokens, the drafts are written into the token pool after the
request's last token, pages are allocated for them as for any extend, and one forward scores them
all. A request without a draft rides along with one position, as in a plain decode. The mixin
hooks in where a batch is prepared (`_prepare_batch`) and where a step that does not end in the
engine's one-token draw is launched (`_needs_mask` and `_launch_forward_only`, as a constrained
step is), so the chapters' `_schedule_next_batch` and `_forward` run it unchanged. Its batch has
phase "verify"; the model runs it as a decode step of one row per token, which the CUDA graphs
replay (minisgl/engine/verify_step.py says why).

The fused cycle (speculative_fast.py). With a draft model whose engine replays graphs, a decode
batch whose requests are all greedy, without a grammar or logprobs and with room for k drafts is
verified by two graph replays and no host round trip between them: the draft's proposal graph
(minisgl/speculative/draft_graph.py) leaves k drafts per request on the device, and the verify
graph (minisgl/engine/verify_graph.py) runs the target on them, accepts them by `verify_greedy`'s
rule on the device and copies only the tokens and counts to the host. Every other step (a
sampled, constrained or logprob request in the batch, prompt lookup, a request near its end)
takes the eager way below, through `verify_greedy` / `verify_sampled`.

Handling. Request i accepted count_i tokens. A request some handling needs token by token (a
grammar's matcher, stop strings or stop token ids, logprobs) is handled as count_i plain steps,
one token each, through the whole chain of handlings (the grammar's matchers, stops and logprobs
of extras.py, chapter 11's `_process_last_data`), with its lengths set before each as a plain step
would have left them. So `stop_token_ids`, stop strings, EOS and `max_tokens` end the request at
the right token with the rules that already end it, a matcher takes exactly the accepted tokens,
and nothing past the end is sent; a request that ended is left out of the sub-steps after its
end. Any other request takes its run whole (speculative_fast.py): cut after its first EOS (unless
ignore_eos) and at max_tokens, all but its last token appended and sent at once, the last one
through the chain as one sub-step, which ends the request when the run does.

Rollback. After the sub-steps a request's KV is valid up to its `cached_len` (its last token
aside, whose KV the next step writes). Its pages past `pages_for(cached_len)` hold only rejected
positions: they go back to the free list. A request that ended gave the prefix cache its
`cached_len` tokens (all accepted) through the usual `cache_req`, so the radix cache only ever
holds accepted tokens.

The loop. The next step's input depends on how many tokens were accepted, and the drafts of step
N+1 need step N's counts on the host, so with speculation on the scheduler runs the normal loop:
each step is handled before the next is launched (`overlap_now` is False). The overlap loop's gain
is the CPU's scheduling time hidden under the device's step; a verify step does the work of up to
k+1 decode steps per launch, so that CPU time is spread over more tokens, and at batch 1 the
gain of speculation (several tokens per weight read) is far larger than overlap's (measured in
benchmarks/spec_bench.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from minisgl.core import Batch, Req
from minisgl.engine import BatchSamplingArgs, ForwardInput, ForwardOutput
from minisgl.engine.decode_rows import decode_rows
from minisgl.engine.request_sampling import LogprobPlan, StepLogprobs
from minisgl.engine.verify_graph import FusedVerifyInput
from minisgl.engine.verify_step import VerifyInput, VerifyPlan, launch_verify, seed_of

from .cache import pages_for
from .speculative_fast import FastCycle


@dataclass
class SpecStats:
    """Acceptance so far: `verifies` verify steps scored `drafted` draft tokens, of which
    `accepted` were kept; `emitted` tokens came out of them (accepted + one per request)."""

    verifies: int = 0
    requests: int = 0  # request-rows verified (a request with a draft, per step)
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0

    @property
    def tokens_per_verify(self) -> float:
        """Tokens each drafted request got per verify forward (1.0: speculation gained nothing)."""
        return self.emitted / self.requests if self.requests else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def build_drafter(config):
    """The drafter `config.speculative` names, or None."""
    kind = getattr(config, "speculative", None)
    if kind is None:
        return None
    if kind == "lookup":
        from minisgl.speculative.drafter import LookupDrafter

        return LookupDrafter()
    if kind == "draft":
        try:
            from minisgl.speculative.draft_model import DraftModelDrafter
        except ImportError as e:
            raise ValueError(
                "speculative='draft' needs minisgl.speculative.draft_model (DraftModelDrafter), "
                f"which this installation lacks: {e}"
            ) from e
        return DraftModelDrafter(config.draft_model, config)
    raise ValueError(f"speculative must be 'lookup', 'draft' or None, got {kind!r}")


class SpeculativeSteps(FastCycle):
    """A mixin of Scheduler, first in its bases (`self` is the scheduler); the fused cycle and
    the handling of whole runs are its base's (speculative_fast.py)."""

    drafter = None

    def _init_speculative(self) -> None:
        if self.config.speculative is not None and self.engine.state_pool is not None:
            raise ValueError(
                f"speculative={self.config.speculative!r} is not supported for "
                f"{self.engine.model_config.architecture} (Gated DeltaNet layers): a verify step "
                "moves each request's recurrent state past every draft token, and a rejected "
                "token's state cannot be rolled back as KV pages are"
            )
        self.drafter = build_drafter(self.config)
        self.spec_k = self.config.num_speculative_tokens
        # the verify step as one graph, for drafters whose drafts stay on the device
        self.verify_graphs = None
        if getattr(self.drafter, "proposal", None) is not None and self.engine.graph_runner:
            from minisgl.engine.verify_graph import VerifyGraphs

            max_reqs = min(self.config.cuda_graph_max_bs, self.config.max_running_req)
            self.verify_graphs = VerifyGraphs(self.engine, self.spec_k, max_reqs)
        self.spec_stats = SpecStats()

    # ---------------------------------------------------------------- the loop

    def _prepare_batch(self, batch: Batch):
        """A decode batch in which some request has a draft becomes a verify step; any other
        batch is prepared as usual (batch_inputs.py)."""
        if self.drafter is not None and batch.is_decode:
            fused = self._prepare_fused_verify(batch)
            if fused is not None:
                return fused
            drafts = self._drafts(batch.reqs)
            if any(drafts):
                return self._prepare_verify(batch, drafts)
        return super()._prepare_batch(batch)

    # ---------------------------------------------------------------- drafts

    def _drafts(self, reqs: List[Req]) -> List[List[int]]:
        """Each request's draft, cut to what it may still generate, to what its grammar allows
        and, when pages are short, dropped (a verify step never retracts or fails for a draft)."""
        proposed = self.drafter.propose(reqs, self.spec_k)
        if len(proposed) != len(reqs):
            raise RuntimeError(
                f"the drafter proposed {len(proposed)} drafts for {len(reqs)} requests"
            )
        drafts = []
        for req, draft in zip(reqs, proposed):
            # the last draft token's successor is generated too: d + 1 <= tokens left
            draft = [int(t) for t in draft[: max(0, min(self.spec_k, req.remain_len - 1))]]
            bad = [t for t in draft if not 0 <= t < self.vocab_size]
            if bad:
                raise RuntimeError(
                    f"the drafter ({type(self.drafter).__name__}) proposed token ids outside the "
                    f"vocabulary [0, {self.vocab_size}) for uid {req.uid}: {bad}"
                )
            matcher = self._matchers.get(req.uid)
            if matcher is not None and draft:
                draft = draft[: matcher.validate_tokens(draft)]
            drafts.append(draft)
        p = self.cache_manager.page_size
        extra = sum(
            pages_for(r.device_len + len(d), p) - pages_for(r.device_len, p)
            for r, d in zip(reqs, drafts)
        )
        need = sum(pages_for(r.device_len, p) - pages_for(r.cached_len, p) for r in reqs)
        if extra and need + extra > self.cache_manager.available_pages:
            return [[] for _ in reqs]
        return drafts

    # ---------------------------------------------------------------- the verify step

    def _prepare_verify(self, batch: Batch, drafts: List[List[int]]) -> VerifyInput:
        reqs = batch.reqs
        bases = [r.device_len for r in reqs]
        lens = [len(d) for d in drafts]
        k = max(lens)
        # the drafts go into the token pool after each request's last token (the forward reads them
        # there), written on the scheduler's stream, which the launch waits for
        rows = [r.table_idx for r, d in zip(reqs, drafts) for _ in d]
        cols = [b + j for b, d in zip(bases, drafts) for j in range(len(d))]
        vals = [t for d in drafts for t in d]
        kit = self.engine.kit
        self.token_pool[
            kit.to_device(torch.tensor(rows, dtype=torch.int64)),
            kit.to_device(torch.tensor(cols, dtype=torch.int64)),
        ] = kit.to_device(torch.tensor(vals, dtype=torch.int32))
        # each request's last token and its draft, as an extend over its cached prefix: the
        # extend path allocates their pages and says where their ids are read, once device_len
        # counts the draft. Phase "verify": neither a decode (one token each) nor a prefill (a
        # prompt to cache). The model runs it as decode rows, one per token (decode_rows.py)
        batch.phase = "verify"
        spans = [(r.table_idx, r.cached_len, b + d) for r, b, d in zip(reqs, bases, lens)]
        for r, d in zip(reqs, lens):
            r.device_len += d
        try:
            fi = super()._prepare_batch(batch)
        finally:
            for r, d in zip(reqs, lens):
                r.device_len -= d
        padded = torch.zeros((len(reqs), k), dtype=torch.int64)
        for i, d in enumerate(drafts):
            padded[i, : len(d)] = torch.tensor(d, dtype=torch.int64)
        plan = VerifyPlan(k=k, draft_lens=lens, bases=bases, draft=kit.to_device(padded))
        plan.rows = decode_rows(spans, self.page_table, self.device)
        plan.seeds = [
            (i, seed_of(r.sampling_params.seed, b))
            for i, (r, b) in enumerate(zip(reqs, bases))
            if r.sampling_params.seed is not None and not r.sampling_params.is_greedy
        ]
        plan.logprob_rows = [
            i for i, r in enumerate(reqs) if r.sampling_params.logprobs is not None
        ]
        if plan.logprob_rows:
            plan.logprob_k = max(reqs[i].sampling_params.top_logprobs for i in plan.logprob_rows)
        self._plan_masks(plan, reqs, drafts)
        return VerifyInput(fi.batch, fi.sample_args, fi.input_tuple, fi.write_tuple, plan=plan)

    def _plan_masks(self, plan: VerifyPlan, reqs: List[Req], drafts: List[List[int]]) -> None:
        """The grammar's bitmask at each scored position of each constrained request: a copy of
        its matcher walked along the draft (which it accepts: `_drafts` cut it there). A copy, not
        the matcher and a rollback: llguidance 1.9.1's rollback over a consumed EOS leaves the
        matcher in error (a draft that ends the grammar is common), and the matcher itself must
        take only the tokens the target accepts, when the step is handled."""
        rows, matchers = [], []
        for i, (req, draft) in enumerate(zip(reqs, drafts)):
            matcher = self._matchers.get(req.uid)
            if matcher is None:
                continue
            walker = matcher.deep_copy()
            for j in range(len(draft) + 1):
                rows.append(i * (plan.k + 1) + j)
                matchers.append(walker.deep_copy() if j < len(draft) else walker)
                if j < len(draft) and not walker.consume_token(draft[j]):
                    raise RuntimeError(f"uid {req.uid}: the grammar refused a validated draft")
        if rows:
            plan.mask_rows = torch.tensor(rows, dtype=torch.int64)
            plan.bitmask = self.grammars.bitmask(matchers)

    def _needs_mask(self, fi) -> bool:
        # a verify step is launched by `_launch_forward_only` as well: like a constrained step,
        # it does not end in the engine's one-token draw (the scheduler's `_forward` runs both)
        return isinstance(fi, VerifyInput) or super()._needs_mask(fi)

    def _launch_forward_only(self, fi):
        if isinstance(fi, FusedVerifyInput):
            rows = [r.table_idx for r in fi.batch.reqs]
            return self.verify_graphs.launch(rows, fi.plan.bases, fi.plan.draft)
        if isinstance(fi, VerifyInput):
            return launch_verify(self.engine, fi)
        return super()._launch_forward_only(fi)

    # ---------------------------------------------------------------- handling

    def _process_last_data(self, last_data) -> None:
        if last_data is None or not isinstance(last_data[0], VerifyInput):
            return super()._process_last_data(last_data)
        fi, out = last_data
        if not hasattr(out, "count_cpu"):  # the step failed (_fail_batch): nothing to handle
            return super()._process_last_data(last_data)
        out.copy_done.synchronize()
        plan, reqs = fi.plan, fi.batch.reqs
        tokens, counts = out.tokens_cpu.tolist(), out.count_cpu.tolist()
        self._count(plan, counts)
        self.events.emit(
            "verify",
            step=fi.batch.step,
            uids=[r.uid for r in reqs],
            drafted=plan.draft_lens,
            accepted=[c - 1 for c in counts],
        )
        # a request no per-token handling applies to takes its accepted run at once, all but its
        # last token here; that last one goes through the chain below, which ends the request
        whole = [self._takes_whole_run(r) for r in reqs]
        ends = self._append_runs(reqs, whole, tokens, counts, plan.bases)
        for j in range(max(counts, default=0)):
            rows = [
                i
                for i, r in enumerate(reqs)
                if (j == ends[i] - 1 if whole[i] else counts[i] > j) and self._live.get(r.uid) is r
            ]
            if not rows:
                continue  # a whole run's last token may come later
            for i in rows:  # as a plain step would have left it before this token
                reqs[i].cached_len = plan.bases[i] + j - 1
                reqs[i].device_len = plan.bases[i] + j
                reqs[i].complete_one()
            self._handle_one(fi, out, rows, [tokens[i][j] for i in rows], j)
        self._roll_back(plan, reqs)

    def _handle_one(self, fi: VerifyInput, out, rows: List[int], tokens: List[int], j: int):
        """Token j of each of `rows`, handled as one plain decode step of those requests."""
        reqs = [fi.batch.reqs[i] for i in rows]
        sub = Batch(reqs=reqs, phase="decode", step=fi.batch.step)
        args = BatchSamplingArgs(None, None, None)
        scored = [g for g, i in enumerate(rows) if i in fi.plan.logprob_rows]
        if scored:
            plan = LogprobPlan(fi.plan.logprob_k)
            plan.token_rows, plan.token_rows_host = torch.tensor(scored), scored
            at = torch.tensor([rows[g] for g in scored])
            args.logprob_plan = plan
            args.logprobs_out = StepLogprobs(
                token_lp=out.token_lp[at, j],
                token_top_ids=None if out.top_ids is None else out.top_ids[at, j],
                token_top_lp=None if out.top_lp is None else out.top_lp[at, j],
            )
        step_out = ForwardOutput(
            next_tokens_gpu=torch.tensor(tokens, dtype=torch.int32),
            next_tokens_cpu=torch.tensor(tokens, dtype=torch.int32),
            copy_done=out.copy_done,
        )
        sub_fi = ForwardInput(sub, args, fi.input_tuple, fi.write_tuple)
        super()._process_last_data((sub_fi, step_out))

    def _roll_back(self, plan: VerifyPlan, reqs: List[Req]) -> None:
        """Give back the pages of the positions the target rejected, once the step is handled.

        The verify step allocated pages for each request's last token and its whole draft, and
        wrote KV at every one of those positions. After the accepted tokens were handled, a
        request's KV is valid up to its `cached_len`; every page past the ones holding those tokens
        holds only rejected positions. Left allocated, they leak (and the next step, which
        allocates from `pages_for(cached_len)` on, would map fresh pages over them); freed from too
        early, a page that still holds accepted KV goes to another request, which overwrites it.

        Receives: `plan`, the verify step's plan: `bases[i]` (request i's `device_len` at launch:
            its KV then ended at `bases[i] - 1`) and `draft_lens[i]` (its draft, d_i tokens), so the
            step held the locations of positions up to `bases[i] + d_i - 1`; `reqs`, the step's
            requests, their accepted tokens handled: `cached_len` counts the positions whose KV is
            accepted (the request's last token aside, whose KV the next step writes). A request
            that ended in the step is no longer in `self._live`; its `cache_req` gave the prefix
            cache its `cached_len` tokens and freed its pages up to them, nothing past them.
        Returns: nothing.
        Leaves: for every request of the step, running or ended, each page of its page-table row
            that holds only positions past its accepted KV, up to the last position the step
            held, freed once (`self.cache_manager._free_locations` takes the row's locations of
            whole pages, `page_size` per page); every page holding an accepted token kept (with
            page_size > 1, the page of the last accepted token holds rejected positions too, and
            stays). Nothing else: the lengths were set by the handling, a running request is in
            the decode manager since the launch (its `can_decode` held then and still holds, or
            the handling would have ended it), and an ended one was taken out of it.
        Uses: `pages_for` (ch08), `self.cache_manager.page_size` and `._free_locations` (ch08),
            `self.page_table` (ch04).
        Checked: after every verify step, page sizes 1 and 4, with a drafter the target always
            agrees with, one it never agrees with and one in between: no rejected position's page
            stays allocated, a running request keeps every page of its accepted tokens, no page is
            freed twice (an ended request's included) or while the prefix cache holds it; after
            every step each page is free, cached or held by a running request, once; outputs equal
            the engine's without speculation and the integrity check holds when all end.
        """
        p = self.cache_manager.page_size
        for req, base, d in zip(reqs, plan.bases, plan.draft_lens):
            start, end = pages_for(req.cached_len, p), pages_for(base + d, p)
            if end > start:
                locs = self.page_table[req.table_idx, start * p : end * p].clone()
                self.cache_manager._free_locations(locs)

    def _count(self, plan: VerifyPlan, counts: List[int]) -> None:
        s = self.spec_stats
        s.verifies += 1
        for d, c in zip(plan.draft_lens, counts):
            if d:
                s.requests += 1
                s.drafted += d
                s.accepted += c - 1
                s.emitted += c

    # ---------------------------------------------------------------- a drafter's state

    def _free_req_resources(self, req: Req) -> None:
        if self.drafter is not None and not req.is_chunk:
            self.drafter.release(req)
        super()._free_req_resources(req)

    def _retract(self, req: Req) -> None:
        if self.drafter is not None:
            self.drafter.release(req)
        super()._retract(req)

    def _fail_batch(self, batch: Batch, error: Exception):
        if self.drafter is not None:
            for req in batch.reqs:
                if not req.is_chunk:
                    self.drafter.release(req)
        return super()._fail_batch(batch, error)
