"""The scheduler's side of what single requests ask of a step beyond a token: seeds and logprobs
(the engine's side is minisgl/engine/request_sampling.py).

`plan_extras` runs after a batch is prepared, before its launch, while each request's lengths
still say where its sample goes (`device_len`): it lists the seeded rows with their seeds, and the
logits rows to score. A batch where nobody asks gets nothing (the fast path).

`RequestExtras` applies stops and attaches logprobs when a step is handled, around chapter 11's
`_process_last_data` (so that a learner's runs with them too). `attach_logprobs`: each reply of a
request that asked gets its token's logprob and alternatives; a request that asked for prompt
logprobs gets them all on its first reply, gathered from every chunk of its prefill
(`_prompt_parts`, by uid).

Prompt logprobs and the prefix cache: a cached prefix has KV but no logits, so a request asking for
prompt logprobs does not match the prefix cache (CacheManager.match_req) and computes its whole
prompt; its KV still goes into the cache when it finishes, for the requests after it.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch

from minisgl.engine import ForwardInput
from minisgl.engine.request_sampling import LogprobPlan, StepLogprobs, position_seed
from minisgl.message import DetokenizeMsg


class RequestExtras:
    """A mixin of Scheduler, before the lifecycle in its bases: the handling of a step's results
    (chapter 11's `_process_last_data`, whoever wrote it) with what some requests ask beyond it.

    A stop is applied by moving the request's end to the token that hit it (`max_device_len`), so
    that the handling's own rule 1 (finished once the tokens received reach max_device_len) ends
    it, frees its slot and pages, and says `finished` on its message; and each message sent while
    a step is handled gets its request's logprobs."""

    _handling: ForwardInput | None = None

    def _process_last_data(self, last_data) -> None:
        if last_data is None:
            return super()._process_last_data(last_data)
        fi, output = last_data
        output.copy_done.synchronize()  # the tokens (and logprobs) are on the host
        tokens = output.next_tokens_cpu.tolist()
        for req, token in zip(fi.batch.reqs, tokens):
            if req.is_chunk or req in self.finished_reqs:
                continue  # a chunk samples nothing; a finished request gets nothing (rule 2/4)
            if self.stops.hit(req, token, self._prompt_len(req)):
                req.max_device_len = len(req.input_ids) + 1  # this token is its last
        self._handling = fi
        try:
            super()._process_last_data(last_data)
        finally:
            self._handling = None

    def send_result(self, reply: List[DetokenizeMsg]) -> None:
        if self._handling is not None:
            attach_logprobs(self, self._handling, reply)
        super().send_result(reply)


def plan_extras(scheduler, fi: ForwardInput) -> None:
    """Fill in `fi.sample_args.seeds` and `.logprob_plan`, and the batch's `logit_rows`."""
    batch, args = fi.batch, fi.sample_args
    reqs = batch.reqs
    seeds = [
        (i, position_seed(r.sampling_params.seed, r.device_len))
        for i, r in enumerate(reqs)
        if r.sampling_params.seed is not None and not r.sampling_params.is_greedy and not r.is_chunk
    ]
    args.seeds = seeds or None
    token_rows = [
        i for i, r in enumerate(reqs) if r.sampling_params.logprobs is not None and not r.is_chunk
    ]
    wants_prompt = batch.is_prefill and any(r.sampling_params.prompt_logprobs for r in reqs)
    if not token_rows and not wants_prompt:
        return
    k = max(r.sampling_params.top_logprobs for r in reqs)
    to_device = scheduler.engine.kit.to_device
    plan = LogprobPlan(k)
    if token_rows:
        plan.token_rows = to_device(torch.tensor(token_rows, dtype=torch.int64))
        plan.token_rows_host = token_rows
    if wants_prompt:
        logit_rows: List[int] = []  # rows of the batch's hidden states the LM head projects
        sample_rows: List[int] = []
        prompt_rows: List[int] = []
        targets: List[torch.Tensor] = []
        offset = 0
        for r in reqs:
            n = r.extend_len
            if r.sampling_params.prompt_logprobs:
                # every position but the prompt's last predicts a prompt token; a chunk's last
                # predicts the next chunk's first (a chunk never reaches the prompt's end)
                scored = n if r.is_chunk else n - 1
                prompt_rows.extend(range(len(logit_rows), len(logit_rows) + scored))
                plan.prompt_spans.append((r.uid, scored, r.sampling_params.top_logprobs))
                logit_rows.extend(range(offset, offset + n))
                full = _prompt_of(scheduler, r)
                targets.append(full[r.cached_len + 1 : r.cached_len + 1 + scored])
            else:
                logit_rows.append(offset + n - 1)
            sample_rows.append(len(logit_rows) - 1)
            offset += n
        batch.logit_rows = to_device(torch.tensor(logit_rows, dtype=torch.int64))
        plan.sample_rows = to_device(torch.tensor(sample_rows, dtype=torch.int64))
        if prompt_rows:
            plan.prompt_rows = to_device(torch.tensor(prompt_rows, dtype=torch.int64))
            plan.prompt_targets = to_device(torch.cat(targets).to(torch.int64))
    args.logprob_plan = plan


def _prompt_of(scheduler, req) -> torch.Tensor:
    """The whole prompt of `req`: a chunk holds only its part, its pending request all of it."""
    if req.is_chunk:
        return scheduler.prefill_manager.get(req.uid).input_ids
    return req.input_ids


def attach_logprobs(scheduler, fi: ForwardInput, reply: List[DetokenizeMsg]) -> None:
    """Give each reply of this step its logprobs (`DetokenizeMsg.logprobs`), from the host copies
    the step made (`fi.sample_args.logprobs_out`, valid: the step's copy_done has completed)."""
    plan: LogprobPlan | None = fi.sample_args.logprob_plan
    if plan is None:
        return
    out: StepLogprobs = fi.sample_args.logprobs_out
    parts: Dict[int, List[Any]] = scheduler._prompt_parts
    msgs = {m.uid: m for m in reply}
    reqs = fi.batch.reqs
    row = 0
    for uid, scored, k in plan.prompt_spans:  # a one-token prompt scores nothing, still says so
        entries = _entries(out, "prompt", row, row + scored, k) if scored else []
        parts.setdefault(uid, []).extend(entries)
        row += scored
    if plan.token_rows is not None:
        for g, i in enumerate(plan.token_rows_host):
            msg = msgs.get(reqs[i].uid)
            if msg is not None:
                k = reqs[i].sampling_params.top_logprobs
                (entry,) = _entries(out, "token", g, g + 1, k)
                msg.logprobs = {"token": entry}
    for uid, msg in msgs.items():
        if uid in parts:
            msg.logprobs = {**(msg.logprobs or {}), "prompt": parts.pop(uid)}
    # parts of requests aborted mid-prefill: nothing will claim them
    pending = scheduler.prefill_manager.get
    for uid in [u for u in parts if pending(u) is None and u not in scheduler._live]:
        del parts[uid]


def _entries(out: StepLogprobs, kind: str, start: int, end: int, k: int) -> List[List[Any]]:
    """[logprob, [[token id, logprob], ...k]] for rows start..end-1 of `kind` ("token",
    "prompt"); the step computed the batch's largest k, each request gets its own."""
    lp = getattr(out, f"{kind}_lp")[start:end].tolist()
    ids = getattr(out, f"{kind}_top_ids")
    if ids is None or k == 0:
        return [[v, []] for v in lp]
    top_ids = ids[start:end, :k].tolist()
    top_lp = getattr(out, f"{kind}_top_lp")[start:end, :k].tolist()
    return [[v, [list(p) for p in zip(i, t)]] for v, i, t in zip(lp, top_ids, top_lp)]
