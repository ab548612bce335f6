"""A mixed step's handling hands only its prefill rows' prompts to the prefix cache
(minisgl/scheduler/mixed_handling.py): the decoders riding in it were cached when their own prefill
was handled, as a pure decode step leaves them."""

from __future__ import annotations

from collections import Counter

import pytest

from helpers import build_llm, greedy, prompt_ids
from minisgl.env import ENV


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
def test_a_mixed_step_caches_only_its_prefill_rows(overlap):
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    p = prompt_ids()
    prompts = [p[0], p[3], p[1] * 3 + p[0], p[2] * 4, p[3] + p[1] * 3]
    llm = build_llm(max_extend_tokens=8, mixed_batches=True)
    log = llm.events.record()
    prompt_len, unfinished = {}, Counter()
    real = llm.cache_manager.cache_req

    def counting(req, finished):
        if not finished:  # one per request: when its prefill (its last piece) is handled
            unfinished[(req.uid, len(req.input_ids) - prompt_len[req.uid])] += 1
        return real(req, finished=finished)

    llm.cache_manager.cache_req = counting
    uids = []
    for x in prompts:  # two start decoding, the others arrive while they decode
        uids.append(llm.add_request(x, greedy(12)))
        prompt_len[uids[-1]] = len(x)
        for _ in range(2 if len(uids) > 1 else 0):
            llm.step()
    llm.run_until_idle()
    llm.cache_manager.check_integrity()
    mixed = sum(
        1
        for e in log
        if e.kind == "launch" and e["phase"] == "prefill" and 1 in e["extend_lens"][1:]
    )
    assert mixed >= 3, f"only {mixed} mixed steps: the workload no longer mixes"
    want = Counter({(u, 1): 1 for u in uids})
    assert unfinished == want, (
        "cache_req(req, finished=False) calls by (uid, tokens received): each request's prompt "
        f"once, when its first token arrives; got {dict(unfinished)}"
    )
