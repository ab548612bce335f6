"""The fused speculative cycle (issue 47): the draft model's proposal graph leaves its drafts on the
device, and the verify graph (minisgl/engine/verify_graph.py) runs the target on them and accepts
them on the device. Whatever it runs, it must accept what the eager verify step accepts
(verify_step.py with `verify_greedy`) and give the engine's tokens without speculation: k = 1, 4
and 8, page sizes 1 and 4, several requests at once, ends (EOS, max_tokens) inside an accepted
run, and greedy requests beside sampled ones (a batch with a sampled request goes the eager way).
"""

from __future__ import annotations

import pytest

from helpers import MODEL, build_llm, greedy
from minisgl import SamplingParams
from test_speculative import _prompts, _reference, _run_checked

DRAFT = "minisgl/assets/shakespeare-qwen3-draft"


def _llm(k: int, fused: bool, draft: str = DRAFT, **options):
    llm = build_llm(
        speculative="draft",
        draft_model=draft,
        num_speculative_tokens=k,
        use_cuda_graph=True,
        max_running_req=4,
        **options,
    )
    assert llm.verify_graphs is not None, "speculation with a draft model and graphs fuses"
    if not fused:
        llm.verify_graphs = None  # every verify step the eager way
    return llm


def _accepted(log):
    return [(e["uids"], e["drafted"], e["accepted"]) for e in log if e.kind == "verify"]


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_the_fused_verify_accepts_what_the_eager_verify_accepts(k, page_size):
    runs = {}
    for fused in (True, False):
        llm = _llm(k, fused, page_size=page_size)
        log = llm.events.record()
        tokens = _run_checked(llm, _prompts(), greedy(20))
        runs[fused] = (tokens, _accepted(log), llm)
    (tokens, accepted, llm), (eager_tokens, eager_accepted, _) = runs[True], runs[False]
    assert tokens == eager_tokens == _reference()
    assert accepted == eager_accepted
    assert llm.verify_graphs.replays > 0
    counts = [a for _, _, acc in accepted for a in acc]
    assert any(a > 0 for a in counts) and any(a < k for a in counts), "want kept and refused"


def test_ends_inside_an_accepted_run_with_the_fused_cycle():
    """The target as its own draft: every draft is accepted, so max_tokens and EOS fall inside
    accepted runs of k + 1 tokens."""
    ref = _reference()[0]
    prompt = _prompts()[0]
    plain = build_llm()
    llm = _llm(4, True, draft=MODEL)
    for params in (SamplingParams(max_tokens=7, ignore_eos=True), greedy(13)):
        want = plain.generate([prompt], params)[0]["token_ids"]
        assert llm.generate([prompt], params)[0]["token_ids"] == want
        llm.cache_manager.check_integrity()
    plain.eos_token_ids = llm.eos_token_ids = {ref[6]}
    want = plain.generate([prompt], SamplingParams(max_tokens=20))[0]["token_ids"]
    assert want[-1] == ref[6] and len(want) == ref.index(ref[6]) + 1
    before = llm.verify_graphs.replays
    assert llm.generate([prompt], SamplingParams(max_tokens=20))[0]["token_ids"] == want
    assert llm.verify_graphs.replays > before
    llm.cache_manager.check_integrity()


def test_greedy_requests_beside_a_sampled_one():
    """While a sampled request is in the batch its verify steps go the eager way; once it ends the
    greedy ones fuse. Greedy tokens are the engine's all along."""
    prompts = _prompts()[:3]
    llm = _llm(4, True)
    params = [greedy(40), SamplingParams(max_tokens=6, temperature=0.8, seed=1), greedy(40)]
    uids = [llm.add_request(p, s) for p, s in zip(prompts, params)]
    while llm.busy:
        llm.step()
    llm.cache_manager.check_integrity()
    got = [llm.results[u].token_ids for u in uids]
    ref = _reference(40)
    assert got[0] == ref[0] and got[2] == ref[2]
    assert len(got[1]) == 6
    assert 0 < llm.verify_graphs.replays < llm.spec_stats.verifies


def test_prompt_lookup_never_fuses():
    """Prompt lookup's drafts are host lists: its verify steps go the eager way."""
    llm = build_llm(speculative="lookup", num_speculative_tokens=4, use_cuda_graph=True)
    assert llm.verify_graphs is None
    assert _run_checked(llm, _prompts(), greedy(20)) == _reference()
