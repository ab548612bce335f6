"""The fast paths of speculative decoding's cycle (issue 47), a base of SpeculativeSteps
(speculative.py, whose docstring tells the whole cycle).

* The fused cycle: a greedy verify step whose drafts the draft model leaves on the device runs as
  two graph replays, the draft's proposal (minisgl/speculative/draft_graph.py) and the verify step
  with its acceptance (minisgl/engine/verify_graph.py), with no host round trip between them.
* Whole runs: a request no per-token rule applies to takes its accepted run at once, only its
  last token going through the chain of handlings.

On a model as small as the bundled one, a step's cost is the host's work, counted in operators:
these paths bring a verify cycle near one plain step's (benchmarks/spec_host_ops.py).
"""

from __future__ import annotations

from typing import List

import torch

from minisgl.core import Batch, Req
from minisgl.engine import BatchSamplingArgs
from minisgl.engine.verify_graph import FusedVerifyInput
from minisgl.engine.verify_step import VerifyPlan
from minisgl.message import DetokenizeMsg

from .cache import pages_for


class FastCycle:
    """A mixin of Scheduler through SpeculativeSteps (`self` is the scheduler)."""

    verify_graphs = None  # minisgl/engine/verify_graph.py's VerifyGraphs, where they apply

    def _prepare_fused_verify(self, batch: Batch) -> FusedVerifyInput | None:
        """The verify step as two graph replays and no host round trip between them, where every
        request allows it: greedy, no grammar, no logprobs, room for k drafts, pages for them, and
        a drafter that leaves its drafts on the device (the draft model's proposal graph). The
        drafts go from the draft's graph into the verify graph (minisgl/engine/verify_graph.py),
        which accepts them on the device; the handling and the rollback are the usual ones. None:
        the step goes the usual way (`_drafts`, `_prepare_verify`)."""
        graphs, k, reqs = self.verify_graphs, self.spec_k, batch.reqs
        propose = getattr(self.drafter, "propose_on_device", None)
        if graphs is None or propose is None or graphs.k != k or not graphs.fits(len(reqs)):
            return None
        for r in reqs:
            params = r.sampling_params
            if (
                not params.is_greedy
                or params.logprobs is not None
                or r.uid in self._matchers
                or r.remain_len - 1 < k
            ):
                return None
        p = self.cache_manager.page_size
        need = sum(pages_for(r.device_len + k, p) - pages_for(r.cached_len, p) for r in reqs)
        if need > self.cache_manager.available_pages:
            return None
        drafts = propose(reqs, k)
        if drafts is None:
            return None
        bases = [r.device_len for r in reqs]
        for r in reqs:  # the last token and k drafts each: positions cached_len .. base + k - 1
            r.device_len += k
        try:
            self.cache_manager.allocate_paged(reqs)
        finally:
            for r in reqs:
                r.device_len -= k
        batch.phase = "verify"
        plan = VerifyPlan(k=k, draft_lens=[k] * len(reqs), bases=bases, draft=drafts)
        return FusedVerifyInput(batch, BatchSamplingArgs(None, None, None), None, None, plan=plan)

    def _check_prepared(self, forward_input, batch: Batch) -> None:
        if not isinstance(forward_input, FusedVerifyInput):  # its inputs live in its graph
            super()._check_prepared(forward_input, batch)

    # ---------------------------------------------------------------- whole runs

    def _takes_whole_run(self, req: Req) -> bool:
        """Whether no handling needs `req`'s accepted tokens one at a time: no grammar matcher to
        advance, no stop token ids or strings to look for, no logprobs to attach. EOS and
        max_tokens are found in the run itself (`_append_runs`)."""
        params = req.sampling_params
        return (
            self._live.get(req.uid) is req
            and req.uid not in self._matchers
            and not params.stop
            and not params.stop_token_ids
            and params.logprobs is None
        )

    def _append_runs(self, reqs, whole, tokens, counts, bases) -> List[int]:
        """For each request that takes its run whole: the run cut where a plain decode would
        have ended it (after its first EOS unless ignore_eos, at max_tokens), every token of it
        but the last appended to its host tokens and sent; the cut length per request (the
        accepted count for the others). The last token is left to the chain of handlings, which
        ends the request on it when the run ends it."""
        ends, reply = list(counts), []
        for i, req in enumerate(reqs):
            if not whole[i]:
                continue
            run = tokens[i][: min(counts[i], req.max_device_len - bases[i])]
            if not req.sampling_params.ignore_eos:
                eos = [j for j, t in enumerate(run) if t in self.eos_token_ids]
                if eos:
                    run = run[: eos[0] + 1]
            ends[i] = len(run)
            if len(run) > 1:
                req.append_host(torch.tensor(run[:-1], dtype=req.input_ids.dtype))
                reply.extend(
                    DetokenizeMsg(uid=req.uid, next_token=t, finished=False) for t in run[:-1]
                )
        if reply:
            self.send_result(reply)
        return ends
