"""Speculative decoding in the engine (issue 47): verify steps over the paged cache, the rollback
of rejected positions, and the meaning of every sampling option through an accepted run.

Greedy outputs must be the engine's without speculation, whatever the drafter proposes: an oracle
(the reference's own tokens: everything accepted), an adversary (tokens the target never picks:
nothing accepted) and a corrupted oracle (runs accepted part-way) give the same tokens. The
cache's integrity (every page free, cached or held by a live request, once) is checked after every
step.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Dict, List

import pytest
import torch

from chi_square import contingency_p, goodness_p
from helpers import MODEL, build_llm, greedy, prompt_ids, test_device
from minisgl import SamplingParams
from minisgl.core import Req
from minisgl.env import ENV
from torture.invariants import check_pages


class ReferenceDrafter:
    """Proposes the reference continuation of the request's tokens. `corrupt`: each drafted
    position is replaced, deterministically (a hash of the position and the request's length), by
    a wrong token with this probability; 1.0 makes an adversary (every draft token wrong)."""

    def __init__(self, sequences: List[List[int]], vocab: int, corrupt: float = 0.0) -> None:
        self.sequences, self.vocab, self.corrupt = sequences, vocab, corrupt
        self.released: List[int] = []

    def _wrong(self, token: int, salt: str) -> bool:
        if self.corrupt >= 1.0:
            return True
        h = int(hashlib.sha256(salt.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        return h < self.corrupt

    def propose(self, reqs: List[Req], k: int) -> List[List[int]]:
        drafts = []
        for req in reqs:
            have = req.input_ids.tolist()
            draft: List[int] = []
            for seq in self.sequences:
                if seq[: len(have)] == have:
                    draft = seq[len(have) : len(have) + k]
                    break
            else:  # unknown: propose something anyway (the adversary's habit)
                draft = [have[-1]] * k
            drafts.append(
                [
                    (t + 1) % self.vocab if self._wrong(t, f"{len(have)}:{j}") else t
                    for j, t in enumerate(draft)
                ]
            )
        return drafts

    def release(self, req: Req) -> None:
        self.released.append(req.uid)


def _prompts() -> List[List[int]]:
    p = prompt_ids()
    return p + [p[0] * 3]  # a repetitive one too


_REFERENCE: Dict[int, List[List[int]]] = {}


def _reference(max_tokens: int = 20) -> List[List[int]]:
    """The engine's greedy tokens without speculation (normal loop, defaults)."""
    if max_tokens not in _REFERENCE:
        ENV.DISABLE_OVERLAP_SCHEDULING.value = True
        llm = build_llm()
        _REFERENCE[max_tokens] = [
            o["token_ids"] for o in llm.generate(_prompts(), greedy(max_tokens))
        ]
    return _REFERENCE[max_tokens]


def _run_checked(llm, prompts, params) -> List[List[int]]:
    """Generate step by step, checking every page's accounting after each step."""
    uids = [llm.add_request(p, params) for p in prompts]
    while llm.busy:
        llm.step()
        check_pages(llm)
    llm.cache_manager.check_integrity()
    return [llm.results[u].token_ids for u in uids]


def _spec_llm(drafter_corrupt: float | None, k: int, **options):
    llm = build_llm(speculative="lookup", num_speculative_tokens=k, **options)
    if drafter_corrupt is not None:
        refs = _reference()
        llm.drafter = ReferenceDrafter(
            [p + r for p, r in zip(_prompts(), refs)], llm.vocab_size, drafter_corrupt
        )
    return llm


DRAFTERS = {"oracle": 0.0, "adversary": 1.0, "corrupted": 0.3, "lookup": None}


@pytest.mark.parametrize("drafter", list(DRAFTERS))
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_tokens_equal_the_engine_without_speculation(drafter, k):
    llm = _spec_llm(DRAFTERS[drafter], k)
    assert _run_checked(llm, _prompts(), greedy(20)) == _reference()
    stats = llm.spec_stats
    assert stats.verifies > 0
    if drafter == "oracle":  # everything accepted: k + 1 tokens per verify while room is left
        assert stats.accepted == stats.drafted
        assert stats.tokens_per_verify > min(k, 4)
    if drafter == "adversary":
        assert stats.accepted == 0 and stats.tokens_per_verify == 1.0


MODES = {
    "naive": dict(cache_type="naive"),
    "page4": dict(page_size=4),
    "page4-naive": dict(page_size=4, cache_type="naive"),
    "chunk3": dict(max_extend_tokens=3),
    "chunk5-page4": dict(max_extend_tokens=5, page_size=4),
    "one-slot": dict(max_running_req=1),
    "mixed": dict(mixed_batches=True, max_extend_tokens=6),
    "optimistic-tight": dict(optimistic_admission=True, num_page_override=80),
}


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "normal"])
@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_parity_in_every_mode(mode, overlap):
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    reference = _reference()
    for corrupt in (0.3, 1.0):
        llm = _spec_llm(corrupt, 4, **MODES[mode])
        assert _run_checked(llm, _prompts(), greedy(20)) == reference, (mode, corrupt)
        assert llm.spec_stats.verifies > 0


def test_prompt_lookup_accepts_more_than_one_token_per_verify_on_a_repetitive_prompt():
    """The bundled model, asked to continue a passage it has just seen twice, repeats it: prompt
    lookup drafts the repetition and the target accepts most of it."""
    text = prompt_ids()[1]
    llm = build_llm(speculative="lookup", num_speculative_tokens=4)
    out = llm.generate([text * 3], greedy(40))[0]["token_ids"]
    base = build_llm().generate([text * 3], greedy(40))[0]["token_ids"]
    assert out == base
    s = llm.spec_stats
    assert s.tokens_per_verify > 1.5, s


def test_ends_inside_an_accepted_run_land_on_the_right_token():
    """EOS, stop_token_ids and max_tokens that fall inside a run the oracle gets accepted end the
    request there, as without speculation: nothing past the end is sent."""
    ref = _reference()[0]
    stop_at = ref[6]
    cases = [
        SamplingParams(max_tokens=20, stop_token_ids=[stop_at]),
        SamplingParams(max_tokens=7, ignore_eos=True),
        SamplingParams(max_tokens=20, ignore_eos=True, stop=[build_llm().decode(ref[4:6])]),
    ]
    for params in cases:
        ENV.DISABLE_OVERLAP_SCHEDULING.value = True
        plain = build_llm().generate([_prompts()[0]], params)[0]
        llm = _spec_llm(0.0, 8)
        got = llm.generate([_prompts()[0]], params)[0]
        assert got["token_ids"] == plain["token_ids"], params
        assert got["text"] == plain["text"]
        llm.cache_manager.check_integrity()
    # EOS: the model's end id set to a token the reference reaches
    plain = build_llm()
    plain.eos_token_ids = {stop_at}
    want = plain.generate([_prompts()[0]], SamplingParams(max_tokens=20))[0]["token_ids"]
    llm = _spec_llm(0.0, 8)
    llm.eos_token_ids = {stop_at}
    assert llm.generate([_prompts()[0]], SamplingParams(max_tokens=20))[0]["token_ids"] == want
    assert want[-1] == stop_at and len(want) == ref.index(stop_at) + 1


def test_the_radix_cache_holds_only_accepted_tokens():
    """After an adversary's run every cached sequence is a prefix of prompt + accepted output."""
    llm = _spec_llm(1.0, 4)
    refs = _reference()
    _run_checked(llm, _prompts(), greedy(20))
    cache = llm.cache_manager.prefix_cache
    seqs = [p + r for p, r in zip(_prompts(), refs)]
    for ids in _cached_sequences(cache):
        assert any(s[: len(ids)] == ids for s in seqs), ids


def _cached_sequences(cache) -> List[List[int]]:
    out = []

    def walk(node, prefix):
        children = list(node.children.values())
        if not children and prefix:
            out.append(prefix)
        for child in children:
            walk(child, prefix + list(child.key))

    walk(cache.root, [])
    return out


def test_logprobs_of_accepted_tokens_equal_the_plain_engines():
    params = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=3)
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True
    plain = build_llm().generate(_prompts()[:2], params)
    got = _spec_llm(0.0, 4).generate(_prompts()[:2], params)
    for a, b in zip(got, plain):
        assert a["token_ids"] == b["token_ids"]
        for x, y in zip(a["logprobs"], b["logprobs"]):
            assert x["token_id"] == y["token_id"]
            assert x["logprob"] == pytest.approx(y["logprob"], abs=1e-3)
            assert [t for t, _ in x["top_logprobs"]] == [t for t, _ in y["top_logprobs"]]


def test_a_finished_or_aborted_request_is_released_by_the_drafter():
    llm = _spec_llm(0.3, 4)
    uid = llm.add_request(_prompts()[0], greedy(20))
    done = llm.add_request(_prompts()[1], greedy(3))
    for _ in range(3):
        llm.step()
    llm.abort(uid)
    llm.run_until_idle()
    assert sorted(llm.drafter.released) == sorted([uid, done])
    llm.cache_manager.check_integrity()


def test_bad_options_are_refused_by_name():
    with pytest.raises(ValueError, match="speculative"):
        build_llm(speculative="medusa")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        build_llm(speculative="lookup", num_speculative_tokens=0)
    with pytest.raises(ValueError, match="draft_model"):
        build_llm(speculative="draft")
    with pytest.raises(ValueError, match="draft_model"):
        build_llm(draft_model=str(MODEL))


# ---------------------------------------------------------------- sampling


class ModeDrafter:
    """Drafts, after each prefix, the token a plain run drew most often there (`runs`: outputs of
    a plain engine, keyed by the prompt): the draft the target accepts most often, so the
    acceptance test and the residual's draw both carry weight. Stateless."""

    def __init__(self, prompt: List[int], runs: List[List[int]]) -> None:
        self.prompt = prompt
        self.next: Dict[tuple, Counter] = {}
        for out in runs:
            for j in range(len(out)):
                self.next.setdefault(tuple(out[:j]), Counter())[out[j]] += 1

    def guess(self, out: List[int]) -> int | None:
        """The token drafted after output `out`, or None."""
        seen = self.next.get(tuple(out))
        return seen.most_common(1)[0][0] if seen else None

    def propose(self, reqs: List[Req], k: int) -> List[List[int]]:
        drafts = []
        for req in reqs:
            out = req.input_ids.tolist()[len(self.prompt) :]
            draft: List[int] = []
            while len(draft) < k and tuple(out + draft) in self.next:
                draft.append(self.next[tuple(out + draft)].most_common(1)[0][0])
            drafts.append(draft)
        return drafts

    def release(self, req: Req) -> None:
        pass


@pytest.mark.parametrize(
    "filters",
    [dict(temperature=0.7), dict(top_k=5, temperature=1.3), dict(top_p=0.8, temperature=0.8)],
    ids=["t07", "topk", "topp"],
)
def test_sampled_tokens_follow_the_engines_distribution(filters):
    """Two-sample chi-square tests on the second and third generated tokens (the first ones a
    verify step decides) of 400 seeded requests with speculation on against 400 without it. The
    drafter proposes, after each prefix, the token a first plain run drew most often there: the
    draft the target accepts most often, so a verifier that accepts too much, or a rejection
    sampler that forgets the residual (it draws the rejected token again), shifts mass onto it.
    Bins with fewer than 5 expected draws are pooled. A second test per position compares how
    often the token is the drafter's proposal there (a 2x2 table). Under the null each case fails
    with probability at most 0.001 (four tests at alpha = 0.00025, Bonferroni); the three cases
    together about 0.3 %. Bounded time: 1200 requests of 4 tokens per case. Its power is that of
    marginals: a rejection sampler that forgets the residual moves them little (rejections
    happen where the draft was unlikely), so that rule is pinned down on verify_sampled alone
    below."""
    n = 400
    prompt = _prompts()[3]

    def params_of(i):
        return SamplingParams(seed=i, max_tokens=4, ignore_eos=True, **filters)

    def tokens(llm, seeds):
        return [o["token_ids"] for o in llm.generate([prompt] * n, [params_of(i) for i in seeds])]

    ENV.DISABLE_OVERLAP_SCHEDULING.value = True
    plain_engine = build_llm(max_running_req=64)
    table_runs = tokens(plain_engine, range(2 * n, 3 * n))  # the drafter's table only
    plain = tokens(plain_engine, range(n))
    llm = build_llm(max_running_req=64, speculative="lookup", num_speculative_tokens=2)
    llm.drafter = ModeDrafter(prompt, table_runs)
    spec = tokens(llm, range(n, 2 * n))  # other seeds: independent of the plain samples
    s = llm.spec_stats
    assert 0 < s.accepted < s.drafted, s
    drafter = llm.drafter
    for position in (1, 2):
        table = _contingency([t[position] for t in plain], [t[position] for t in spec])
        p_value = contingency_p(table)
        assert p_value > 0.00025, ("token", position, p_value, table)
        # how often the token is the one the drafter proposes there: a fixed function of the
        # prefix, so the same share with and without speculation; over-acceptance raises it
        hits = [
            [sum(drafter.guess(t[:position]) == t[position] for t in run) for run in (plain, spec)]
        ]
        hits.append([n - hits[0][0], n - hits[0][1]])
        p_value = contingency_p(hits)
        assert p_value > 0.00025, ("draft hits", position, p_value, hits)


def test_verify_sampled_follows_the_target_whatever_the_draft():
    """verify_sampled alone, 40000 rows at once: p over 4 tokens, a deterministic draft of the
    most likely one (accepted with probability 0.5) and, behind it, a second position. The first
    token's distribution must be p exactly (goodness of fit, alpha = 0.0005), and so must the
    second's where the first was accepted. A sampler that forgets the residual gives the drafted
    token 0.75 instead of 0.5; one that accepts too often, more."""
    from minisgl.speculative.accept import verify_sampled

    n = 40_000
    p0 = torch.tensor([0.5, 0.3, 0.15, 0.05])
    p1 = torch.tensor([0.1, 0.2, 0.3, 0.4])
    target = torch.stack([p0, p1, p0]).expand(n, 3, 4).contiguous()
    draft = torch.tensor([[0, 3]]).expand(n, 2).contiguous()
    tokens, count = verify_sampled(
        draft, torch.full((n,), 2), None, target, torch.Generator().manual_seed(0)
    )
    first = torch.bincount(tokens[:, 0], minlength=4).double()
    assert goodness_p(first, _expected(p0, n)) > 0.0005, first
    after = tokens[tokens[:, 0] == 0][:, 1]  # the first draft accepted: position 2 follows p1
    seen = torch.bincount(after, minlength=4).double()
    assert goodness_p(seen, _expected(p1, len(after))) > 0.0005, seen
    assert abs(float((count > 1).double().mean()) - 0.5) < 0.02


def _expected(p: torch.Tensor, n: int):
    q = p.double()
    return q / q.sum() * n


def _contingency(a: List[int], b: List[int]) -> List[List[int]]:
    ca, cb = Counter(a), Counter(b)
    common = [t for t in set(ca) | set(cb) if (ca[t] + cb[t]) / 2 >= 5]
    rows = [[ca[t] for t in common], [cb[t] for t in common]]
    rest = [len(a) - sum(rows[0]), len(b) - sum(rows[1])]
    if rest[0] + rest[1] > 0:
        rows[0].append(rest[0])
        rows[1].append(rest[1])
    return rows


def test_a_seeded_request_gets_the_same_tokens_whatever_else_is_in_the_batch():
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=7)
    alone = _spec_llm(0.3, 4).generate([_prompts()[0]], params)[0]["token_ids"]
    others = [SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True)] * 3
    crowd = _spec_llm(0.3, 4).generate(_prompts()[:4], [params] + others)[0]["token_ids"]
    assert alone == crowd


def test_n_samples_and_greedy_rows_beside_sampled_ones():
    """`n` samples of one prompt are n requests (the server's choices): each draws its own
    tokens, and a greedy request beside them keeps the reference's."""
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True
    llm = _spec_llm(0.3, 4)
    sampled = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    outs = llm.generate([_prompts()[1]] * 3 + [_prompts()[1]], [sampled] * 3 + [greedy(20)])
    assert len({tuple(o["token_ids"]) for o in outs[:3]}) > 1
    assert all(len(o["token_ids"]) == 12 for o in outs[:3])
    assert outs[3]["token_ids"] == _reference()[1]
    llm.cache_manager.check_integrity()


# ---------------------------------------------------------------- structured output, retraction


@pytest.mark.parametrize("schema", ["flat_person", "const_field", "pattern_id"])
def test_constrained_outputs_stay_valid_and_greedy_equal(schema):
    import json

    import jsonschema

    from structured_cases import SCHEMAS

    params = SamplingParams(
        max_tokens=48, constraint={"json_schema": SCHEMAS[schema]}, temperature=0.0
    )
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True
    plain = build_llm().generate([_prompts()[0]], params)[0]
    for corrupt in (0.0, 0.5, 1.0):
        llm = _spec_llm(None, 4)
        refs = [_prompts()[0] + plain["token_ids"]]
        llm.drafter = ReferenceDrafter(refs, llm.vocab_size, corrupt)
        log = llm.events.record()
        got = llm.generate([_prompts()[0]], params)[0]
        assert got["token_ids"] == plain["token_ids"], corrupt
        jsonschema.validate(json.loads(got["text"]), SCHEMAS[schema])
        assert not [e for e in log if e.kind == "grammar_reject"]
        assert [e for e in log if e.kind == "verify"]
    sampled = SamplingParams(
        max_tokens=48, constraint={"json_schema": SCHEMAS[schema]}, temperature=1.0, seed=3
    )
    llm = _spec_llm(0.3, 4)
    for out in llm.generate([_prompts()[0]] * 4, sampled):
        jsonschema.validate(json.loads(out["text"]), SCHEMAS[schema])


def test_retraction_under_speculation_keeps_greedy_outputs_and_releases_drafts():
    """A pool too small for every request: decode steps retract. Outputs are unchanged, and every
    retracted request was released by the drafter."""
    llm = _spec_llm(0.3, 4, optimistic_admission=True, num_page_override=70)
    llm.token_ratio.value, llm.token_ratio.learn = 0.1, False
    log = llm.events.record()
    assert _run_checked(llm, _prompts(), greedy(20)) == _reference()
    retracted = [e["uid"] for e in log if e.kind == "retract"]
    assert retracted, "the pool was meant to force retractions"
    assert set(retracted) <= set(llm.drafter.released)


# ---------------------------------------------------------------- the torture test


def _speculative_llm_class(pool, corrupt: float, k: int):
    """LLM with speculation on and a drafter that knows the pool's greedy references, corrupted
    at `corrupt` of its positions: runs accepted whole, part-way and not at all."""
    from minisgl.llm import LLM

    sequences = [p + r for p, r in zip(pool.prompts, pool.references)]

    class SpeculativeLLM(LLM):
        built: List[LLM] = []

        def __init__(self, model, **options):
            super().__init__(model, speculative="lookup", num_speculative_tokens=k, **options)
            self.drafter = ReferenceDrafter(sequences, self.vocab_size, corrupt)
            SpeculativeLLM.built.append(self)

    return SpeculativeLLM


def _fused_llm_class(k: int):
    """LLM speculating with the bundled draft model and CUDA graphs (emulated on a CPU): greedy
    steps run the fused cycle (the draft's proposal graph, the verify graph)."""
    from minisgl.llm import LLM

    class FusedLLM(LLM):
        built: List[LLM] = []

        def __init__(self, model, **options):
            options["use_cuda_graph"] = True
            self.drafter_model = "minisgl/assets/shakespeare-qwen3-draft"
            super().__init__(
                model,
                speculative="draft",
                draft_model=self.drafter_model,
                num_speculative_tokens=k,
                **options,
            )
            # the draft's own pool, large: by default it is the target's, and the torture's
            # tiny pools (35 pages) cannot hold a batch's prompts at once, which the draft
            # model refuses by raising (test_draft_model: a full pool), a limit of its own
            from minisgl.speculative.draft_model import DraftModelDrafter

            self.drafter = DraftModelDrafter(self.drafter_model, self.config, num_tokens=4096)
            FusedLLM.built.append(self)

    return FusedLLM


@pytest.mark.parametrize("kind", ["plain", "retracting", "mixed"])
def test_torture_with_the_fused_cycle(kind):
    """The torture workloads with the draft model and graphs, so that greedy verify steps run
    fused (minisgl/engine/verify_graph.py) among aborts, forced EOS, tiny pools and every cache,
    page, chunk and stream setting: every invariant after every loop iteration, greedy outputs
    equal to the references. 8 seeds each, k alternating 2 and 5."""
    from torture.prompts import load_pool
    from torture.runner import run_workload
    from torture.workload import generate

    pool = load_pool(MODEL)
    options = dict(retracting=kind == "retracting", mixed=kind == "mixed")
    fused = 0
    for seed in range(8):
        cls = _fused_llm_class(2 if seed % 2 else 5)
        workload = generate(seed, pool, max_requests=6, **options)
        result = run_workload(workload, pool, MODEL, test_device(), cls)
        assert result.failure is None, f"seed {seed} ({kind}): {result.failure}"
        fused += sum(llm.verify_graphs.replays for llm in cls.built if llm.verify_graphs)
    assert fused > 0, "no verify step ran fused: the workloads tested nothing new"


@pytest.mark.parametrize("kind", ["plain", "retracting", "mixed"])
def test_torture_with_speculation(kind):
    """The torture workloads (aborts at every moment, forced EOS, tiny pools, every cache, page,
    chunk and stream setting) with speculation on: every invariant after every loop iteration,
    greedy outputs equal to the references. 16 seeds each, k alternating 2 and 5."""
    from torture.prompts import load_pool
    from torture.runner import run_workload
    from torture.workload import generate

    pool = load_pool(MODEL)
    options = dict(retracting=kind == "retracting", mixed=kind == "mixed")
    verifies = 0  # accepted draft tokens over all workloads
    for seed in range(16):
        cls = _speculative_llm_class(pool, 0.3, 2 if seed % 2 else 5)
        result = run_workload(
            generate(seed, pool, max_requests=6, **options), pool, MODEL, test_device(), cls
        )
        assert result.failure is None, f"seed {seed} ({kind}): {result.failure}"
        verifies += sum(llm.spec_stats.accepted for llm in cls.built)
    assert verifies > 0, "no draft token was ever accepted: the workloads tested nothing"


# ---------------------------------------------------------------- options


def test_serve_flags_reach_the_engine(monkeypatch, tmp_path):
    import minisgl.server.launcher as launcher
    from minisgl.__main__ import main

    seen = {}
    monkeypatch.setattr(launcher, "serve", lambda args, log_level: seen.update(args.engine) or 0)
    main(["serve", "--speculative", "lookup", "--num-speculative-tokens", "6"])
    assert seen == {"speculative": "lookup", "num_speculative_tokens": 6}
    seen.clear()
    main(["serve", "--speculative", "draft", "--draft-model", str(tmp_path)])
    assert seen == {"speculative": "draft", "draft_model": str(tmp_path.resolve())}
    with pytest.raises(SystemExit):
        main(["serve", "--speculative", "medusa"])
    with pytest.raises(SystemExit):
        main(["serve", "--draft-model", str(tmp_path / "absent")])


def test_a_missing_draft_model_module_is_named():
    """speculative='draft' imports minisgl.speculative.draft_model lazily; without it the error
    says what is missing."""
    import importlib.util

    if importlib.util.find_spec("minisgl.speculative.draft_model") is not None:
        pytest.skip("the draft model module is installed here")
    with pytest.raises(ValueError, match="draft_model"):
        build_llm(speculative="draft", draft_model=str(MODEL))


def test_tensor_parallel_speculation_gives_the_same_tokens():
    """TP=2 (gloo ranks on the CPU, NCCL on two GPUs): every rank drafts by prompt lookup from the
    same host tokens and verifies in lockstep; greedy tokens are the one-process engine's and
    seeded samples repeat."""
    from test_tp import rank_device

    ENV.DISABLE_OVERLAP_SCHEDULING.value = True
    prompts = _prompts()
    sampled = SamplingParams(temperature=0.9, max_tokens=12, ignore_eos=True, seed=5)
    # the one-process engine on the ranks' device: a seeded sample on the CPU and on a GPU draws
    # from different generators (with one GPU the ranks run on the CPU)
    device = rank_device(2)
    single = build_llm(device=device, speculative="lookup", num_speculative_tokens=3)
    want = single.generate(prompts, greedy(20)) + single.generate(prompts[:1], sampled)
    single.shutdown()
    llm = build_llm(tp_size=2, device=device, speculative="lookup", num_speculative_tokens=3)
    try:
        got = llm.generate(prompts, greedy(20)) + llm.generate(prompts[:1], sampled)
        assert [o["token_ids"] for o in got[:-1]] == _reference()
        assert [o["token_ids"] for o in got] == [o["token_ids"] for o in want]
        assert llm.spec_stats.accepted > 0
    finally:
        llm.shutdown()


def test_a_hybrid_model_refuses_speculation_by_name():
    from hybrid_checkpoints import HYBRID_RECIPES, hybrid_checkpoint

    ckpt = hybrid_checkpoint(next(iter(HYBRID_RECIPES)))
    with pytest.raises(ValueError, match="speculative='lookup' is not supported.*DeltaNet"):
        build_llm(ckpt, cache_type="naive", speculative="lookup")


def test_a_drafter_proposing_ids_outside_the_vocabulary_is_named():
    class Broken(ReferenceDrafter):
        def propose(self, reqs, k):
            return [[-3] for _ in reqs]

    llm = build_llm(speculative="lookup")
    llm.drafter = Broken([], llm.vocab_size)
    with pytest.raises(RuntimeError, match=r"Broken\) proposed token ids outside .*\[-3\]"):
        llm.generate([_prompts()[0]], greedy(4))
