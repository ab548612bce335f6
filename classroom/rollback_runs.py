"""Chapter 24's runs of the engine with speculation, for the rollback's try-out and tests.

`rollback_run` runs three greedy requests on the bundled model, on a pool of 40 pages (so a page
freed too early is soon given to another request), with a scripted drafter (the
continuation the engine makes without speculation, every token of it wrong, or every third one
wrong), k = 4, on the normal loop, and watches `_roll_back`: right after each call it writes
down every rule it saw broken, and after every step it checks that each page is free, cached or
held by a running request, once. The run then compares the outputs with the engine's without
speculation and runs the cache's integrity check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Dict, List

import torch

from minisgl.core import Req, SamplingParams
from minisgl.llm import LLM
from minisgl.scheduler.cache import pages_for

OPTIONS = dict(
    device="cpu",
    dtype=torch.float32,
    max_running_req=4,
    num_page_override=40,  # tight: a page freed too early is soon handed out and overwritten
    max_seq_len_override=128,
)
TEXTS = [
    "ROMEO:\nBut soft, what light",
    "JULIET:\nO Romeo, Romeo",
    "HAMLET:\nTo be, or not to be",
]
MAX_TOKENS = [9, 14, 19]  # ends that fall inside accepted runs of k = 4
K = 4

# the rules the watcher checks after every rollback, in the order a try-out prints them
RULES = [
    "no page of a rejected position stays allocated",
    "a running request keeps every page of its accepted tokens",
    "no page is freed twice (an ended request's pages included)",
    "no page is freed while the prefix cache holds it",
]
EVERY_STEP = "after every step each page is free, cached or held by a running request, once"
DRAFTERS = ["agrees", "disagrees", "every third wrong"]


class ScriptedDrafter:
    """Proposes the engine's own continuation of each request (`sequences`), with the tokens
    `wrong(position)` picks replaced by a token the target never chose there."""

    def __init__(self, sequences: List[List[int]], vocab: int, kind: str) -> None:
        if kind not in DRAFTERS:
            raise ValueError(f"kind must be one of {DRAFTERS}, got {kind!r}")
        self.sequences, self.vocab, self.kind = sequences, vocab, kind

    def _wrong(self, position: int) -> bool:
        return self.kind == "disagrees" or (self.kind == "every third wrong" and position % 3 == 2)

    def propose(self, reqs: List[Req], k: int) -> List[List[int]]:
        drafts = []
        for req in reqs:
            have = req.input_ids.tolist()
            # a request whose tokens left the engine's continuation (its KV was overwritten) gets
            # no draft: its wrong tokens are then the outputs' to show
            seq = next((s for s in self.sequences if s[: len(have)] == have), have)
            draft = seq[len(have) : len(have) + k]
            drafts.append(
                [
                    (t + 1) % self.vocab if self._wrong(len(have) + j) else t
                    for j, t in enumerate(draft)
                ]
            )
        return drafts

    def release(self, req: Req) -> None:
        pass


@dataclass
class RollbackRun:
    outputs: List[List[int]]
    want: List[List[int]]
    rollbacks: int = 0
    problems: Dict[str, List[str]] = field(default_factory=dict)  # rule -> what was seen
    end_problem: str = ""

    def broken(self, rule: str) -> str:
        """What was seen breaking `rule` ("" if nothing): the first case, and how many more."""
        seen = self.problems.get(rule, [])
        if not seen:
            return ""
        more = f" (and {len(seen) - 1} more)" if len(seen) > 1 else ""
        return seen[0] + more


@lru_cache(maxsize=None)
def _plain_outputs(page_size: int, device: str) -> tuple:
    llm = LLM(**{**OPTIONS, "device": device}, page_size=page_size)
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in MAX_TOKENS]
    outs = [llm.generate([t], p)[0]["token_ids"] for t, p in zip(TEXTS, params)]
    return tuple(tuple(o) for o in outs)


def _pages(cm, locs: torch.Tensor) -> List[int]:
    return (locs[:: cm.page_size].to(torch.int64) // cm.page_size).tolist()


def _free_list(cm) -> torch.Tensor:
    parts = [cm.free_pages.to(torch.int64)]
    parts += [x.to(torch.int64) for x in cm._lazy or []]
    return torch.cat(parts)


def _watch(llm, run: RollbackRun, plan, reqs) -> None:
    cm, p = llm.cache_manager, llm.cache_manager.page_size
    free = _free_list(cm).tolist()
    free_set = set(free)
    seen = run.problems

    def note(rule: str, what: str) -> None:
        seen.setdefault(rule, []).append(what)

    for req, base, d in zip(reqs, plan.bases, plan.draft_lens):
        row = llm.page_table[req.table_idx]
        running = llm._live.get(req.uid) is req
        start, end = pages_for(req.cached_len, p), pages_for(base + d, p)
        left = [q for q in _pages(cm, row[start * p : end * p]) if q not in free_set]
        if left:
            note(
                RULES[0],
                f"uid {req.uid} (accepted KV up to {req.cached_len}, drafted up to {base + d}, "
                f"page size {p}): {len(left)} page(s) past the accepted ones still allocated",
            )
        if running:
            mine = row[req.cache_handle.cached_len : pages_for(req.cached_len, p) * p]
            lost = [q for q in _pages(cm, mine) if q in free_set]
            if lost:
                note(
                    RULES[1],
                    f"uid {req.uid} (accepted KV up to {req.cached_len}, page size {p}): "
                    f"{len(lost)} page(s) holding accepted tokens are in the free list",
                )
    twice = len(free) - len(free_set)
    if twice:
        note(RULES[2], f"{twice} page(s) are in the free list twice after step {run.rollbacks}")
    cached = torch.unique(cm.prefix_cache.all_indices().to(torch.int64) // p).tolist()
    both = free_set.intersection(cached)
    if both:
        note(RULES[3], f"{len(both)} page(s) are both free and in the prefix cache")


def _check_every_step(llm, run: RollbackRun) -> None:
    llm.stream.synchronize()  # the pools are written on the scheduler's stream (async on a GPU)
    cm, p = llm.cache_manager, llm.cache_manager.page_size
    owners: List[int] = _free_list(cm).tolist()
    owners += torch.unique(cm.prefix_cache.all_indices().to(torch.int64) // p).tolist()
    for req in llm._live.values():
        owners += cm.held_pages(req).tolist()
    pool = cm.num_pages
    if sorted(owners) != list(range(pool)):
        missing = pool - len(set(owners))
        twice = len(owners) - len(set(owners))
        run.problems.setdefault(EVERY_STEP, []).append(
            f"{missing} page(s) of {pool} are nobody's, {twice} counted twice"
        )


def rollback_run(
    llm_class=LLM, page_size: int = 1, drafter: str = "every third wrong", device: str = "cpu"
):
    """Three greedy requests with speculation (k = 4) and the scripted `drafter`, watched."""
    want = [list(o) for o in _plain_outputs(page_size, device)]
    run = RollbackRun(outputs=[], want=want)

    class Watched(llm_class):
        def _roll_back(self, plan, reqs):
            super()._roll_back(plan, reqs)
            run.rollbacks += 1
            _watch(self, run, plan, reqs)

        def _fail_batch(self, batch, error):
            # a step that fails because an exercise is still a stub (verify_greedy, in the verify
            # step) is that exercise's failure: raised, not turned into a failed request
            if isinstance(error, NotImplementedError):
                raise error
            return super()._fail_batch(batch, error)

    options = {**OPTIONS, "device": device, "page_size": page_size}
    llm = Watched(**options, speculative="lookup", num_speculative_tokens=K)
    prompts = [llm.encode(t).tolist() for t in TEXTS]
    llm.drafter = ScriptedDrafter([a + b for a, b in zip(prompts, want)], llm.vocab_size, drafter)
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in MAX_TOKENS]
    uids = [llm.add_request(t, sp) for t, sp in zip(prompts, params)]
    while llm.busy:
        llm.step()
        _check_every_step(llm, run)
    run.outputs = [llm.results[u].token_ids for u in uids]
    try:
        llm.cache_manager.check_integrity()
    except AssertionError as error:
        run.end_problem = str(error)
    return run
