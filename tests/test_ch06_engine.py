"""Chapter 6: the engine runs one batch, the sampler turns logits into tokens.

The engine is driven here by hand, with no scheduler: a fixed page table gives request row r the KV
locations r * MAX_LEN + position, so every test below depends only on chapters 1-6."""

from __future__ import annotations

from typing import List, Sequence

import pytest
import torch

from helpers import MODEL, assert_tokens_equal, hf_greedy, hf_logits, prompt_ids, test_device
from minisgl.attention import prepare_metadata
from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import (
    BatchSamplingArgs,
    Engine,
    EngineConfig,
    ForwardInput,
    ForwardOutput,
    Sampler,
    top_k_top_p_filter,
)
from minisgl.scheduler.table import TableManager
from refusals import refuses

MAX_LEN = 128
ROWS = 4


class Harness:
    """An Engine plus the least a scheduler must do: request slots, index tensors, metadata."""

    def __init__(self, page_size: int = 1, device: str | None = None, **config) -> None:
        self.engine = e = Engine(
            EngineConfig(
                MODEL,
                dtype=torch.float32,
                device=device or test_device(),
                max_running_req=ROWS,
                page_size=page_size,
                num_page_override=(ROWS + 1) * MAX_LEN // page_size,
                max_seq_len_override=MAX_LEN,
                **config,
            )
        )
        self.device = e.device
        rows = e.page_table.shape[0]
        e.page_table.copy_(torch.arange(rows * MAX_LEN, dtype=torch.int32).view(rows, MAX_LEN))
        self.tables = TableManager(ROWS)
        self.vocab_size = e.model_config.vocab_size
        self._uid = 0

    def add(self, ids: Sequence[int], params: SamplingParams) -> Req:
        row = self.tables.allocate()
        self.engine.token_pool[row, : len(ids)] = torch.tensor(
            ids, dtype=torch.int32, device=self.device
        )
        self._uid += 1
        return Req(
            torch.tensor(ids, dtype=torch.int32), row, 0, params.max_tokens, self._uid, params
        )

    def prepare(self, reqs: List[Req], phase: str) -> ForwardInput:
        batch = Batch(reqs, phase)
        rows = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in reqs])
        cols = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs])
        input_tuple = (rows.to(self.device), cols.to(self.device))
        write_tuple = (
            torch.tensor([r.table_idx for r in reqs], device=self.device),
            torch.tensor([r.device_len for r in reqs], device=self.device),
        )
        batch.positions = input_tuple[1]
        batch.out_loc = self.engine.page_table[input_tuple].to(torch.int64)
        batch.attn_metadata = prepare_metadata(batch, self.engine.page_table, self.device)
        args = BatchSamplingArgs.from_params(
            [r.sampling_params for r in reqs], self.vocab_size, self.device
        )
        return ForwardInput(batch, args, input_tuple, write_tuple)

    def launch(self, reqs: List[Req], phase: str) -> ForwardOutput:
        fi = self.prepare(reqs, phase)
        if self.device.type == "cuda":
            # prepare() queued its index tensors and metadata on the default stream; the engine's
            # stream must not start before they are there (the scheduler waits on its own stream).
            torch.cuda.current_stream(self.device).synchronize()
        return self.engine.forward_batch(fi)

    def step(self, reqs: List[Req], phase: str) -> List[int]:
        out = self.launch(reqs, phase)
        assert out.next_tokens_gpu.device.type == self.device.type, (
            f"next_tokens_gpu is on {out.next_tokens_gpu.device}: it should be on the engine's "
            f"device ({self.device})"
        )
        out.copy_done.synchronize()
        for i, r in enumerate(reqs):
            r.append_host(out.next_tokens_cpu[i : i + 1])
        return out.next_tokens_cpu.tolist()

    def logits(self, reqs: List[Req], phase: str) -> torch.Tensor:
        """The model's logits for a batch, through the engine's context (no sampling)."""
        fi = self.prepare(reqs, phase)
        fi.batch.input_ids = self.engine.token_pool[fi.input_tuple]
        with torch.no_grad(), self.engine.ctx.forward_batch(fi.batch):
            return self.engine.model.forward().cpu()

    def generate(self, prompts: List[List[int]], n: int) -> List[List[int]]:
        reqs = [self.add(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p in prompts]
        self.step(reqs, "prefill")
        for _ in range(n - 1):
            self.step(reqs, "decode")
        return [r.input_ids[len(p) :].tolist() for r, p in zip(reqs, prompts)]


@pytest.fixture(scope="module")
def harness() -> Harness:
    return Harness()


# ---------------------------------------------------------------- the engine


def test_prefill_and_decode_logits_match_hf(harness):
    prompts = prompt_ids()[:3]
    reqs = [harness.add(p, SamplingParams(max_tokens=2)) for p in prompts]
    try:
        got = harness.logits(reqs, "prefill")  # one mixed batch of three prompts
        assert got.shape == (3, harness.vocab_size), (
            "expected logits of shape (3, vocab): one row per request, at its last position; "
            f"got {tuple(got.shape)}"
        )
        for i, p in enumerate(prompts):
            torch.testing.assert_close(got[i], hf_logits(p)[-1], atol=1e-4, rtol=1e-4)
        # decode: append each request's argmax and run one token per request against the cache
        nxt = got.argmax(-1)
        for r, t in zip(reqs, nxt.tolist()):
            r.complete_one()
            harness.engine.token_pool[r.table_idx, r.device_len - 1] = t
            r.append_host(torch.tensor([t]))
        got = harness.logits(reqs, "decode")
        for i, p in enumerate(prompts):
            torch.testing.assert_close(
                got[i], hf_logits(p + [int(nxt[i])])[-1], atol=1e-4, rtol=1e-4
            )
    finally:
        for r in reqs:
            harness.tables.free(r.table_idx)


@pytest.mark.parametrize("page_size", [1, 4])
def test_greedy_generation_through_forward_batch_matches_hf(page_size):
    prompts = prompt_ids()
    got = Harness(page_size).generate(prompts, 8)
    assert_tokens_equal(got, hf_greedy(prompts, 8), "engine vs Hugging Face")


def test_forward_batch_launches_and_advances_requests_without_waiting():
    # On the CPU whatever --device says: the deferred stream is a GPU that is always behind (a
    # real GPU's launch runs this Python at once, which hides requests advanced inside the work)
    h = Harness(device="cpu", cpu_streams="deferred")
    prompt = prompt_ids()[0]
    req = h.add(prompt, SamplingParams(max_tokens=4))
    out = h.launch([req], "prefill")
    # The CPU side moved on at once ...
    assert (req.cached_len, req.device_len) == (len(prompt), len(prompt) + 1), (
        "right after the launch the request should count the token being sampled: "
        "(cached_len, device_len) "
        f"= {(req.cached_len, req.device_len)}, expected {(len(prompt), len(prompt) + 1)}"
    )
    # ... while the work itself waits on the engine stream.
    assert not out.copy_done.query(), (
        "forward_batch waited for the step (or copy_done was not recorded after it)"
    )
    out.copy_done.synchronize()
    dtypes = (out.next_tokens_cpu.dtype, out.next_tokens_gpu.dtype)
    assert dtypes == (torch.int32, torch.int32), (
        f"the output's token tensors should be int32, got {dtypes}"
    )
    token = int(out.next_tokens_cpu[0])
    want = int(hf_logits(prompt)[-1].argmax())
    assert token == want, f"next_tokens_cpu holds {token}, expected the greedy token {want}"
    assert int(out.next_tokens_gpu[0]) == token, "next_tokens_gpu does not hold the sampled token"
    # The sample was written where the next step reads its input: the request's row, next column.
    assert int(h.engine.token_pool[req.table_idx, len(prompt)]) == token, (
        "after copy_done the sample is not in the token pool at (the request's row, column "
        "len(prompt))"
    )


@pytest.mark.gpu
def test_forward_batch_returns_before_the_step_is_done_on_a_gpu():
    """The CUDA counterpart of the test above: a sleep kernel keeps the engine stream busy, so a
    forward_batch that waits for its step (a blocking copy to the host, say) comes back too late."""
    h = Harness()
    prompt = prompt_ids()[0]
    # A process's first launch of a Triton kernel loads its module, which waits for the GPU: one
    # step first, so the one measured launches only kernels already loaded (run alone, this test
    # otherwise fails on the loads, not on forward_batch)
    h.launch([h.add(prompt, SamplingParams(max_tokens=4))], "prefill").copy_done.synchronize()
    req = h.add(prompt, SamplingParams(max_tokens=4))
    h.engine.stream.launch(lambda: torch.cuda._sleep(100_000_000))  # ~50 ms of GPU time
    out = h.launch([req], "prefill")
    assert not out.copy_done.query(), (
        "forward_batch waited for the step it launched (copy to the host with non_blocking=True)"
    )
    out.copy_done.synchronize()
    want = int(hf_logits(prompt)[-1].argmax())
    assert int(out.next_tokens_cpu[0]) == want, (
        f"next_tokens_cpu holds {int(out.next_tokens_cpu[0])}, expected {want}"
    )


def test_the_next_step_reads_the_sample_from_the_token_pool_without_waiting():
    """Two steps launched back to back, as chapter 11's loop does: the decode step's input is the
    prefill's sample, which is not computed yet when the decode step is launched. The engine
    stream runs them in order, and the decode step reads the token where the prefill wrote it."""
    h = Harness(device="cpu", cpu_streams="deferred")  # on the CPU whatever --device says
    prompts = prompt_ids()[:2]
    reqs = [h.add(p, SamplingParams(max_tokens=3)) for p in prompts]
    outs = [h.launch(reqs, "prefill"), h.launch(reqs, "decode")]  # no wait in between
    assert [(r.cached_len, r.device_len) for r in reqs] == [
        (len(p) + 1, len(p) + 2) for p in prompts
    ], "after two launches each request should count both samples"
    outs[1].copy_done.synchronize()
    assert all(o.copy_done.query() for o in outs), (
        "waiting for the second step did not finish the first"
    )
    got = [[int(o.next_tokens_cpu[i]) for o in outs] for i in range(len(reqs))]
    assert_tokens_equal(
        got, hf_greedy(prompts, 2), "two steps launched without waiting, vs Hugging Face"
    )


def test_engine_config_rejects_bad_values():
    for bad in (dict(max_running_req=0), dict(page_size=0), dict(num_page_override=0)):
        with refuses(ValueError, f"EngineConfig(model, **{bad})", match=next(iter(bad))):
            EngineConfig(MODEL, **bad)


def test_engine_reports_a_missing_model(tmp_path):
    with refuses(FileNotFoundError, "Engine of a folder without config.json", match="config.json"):
        Engine(EngineConfig(tmp_path, device="cpu"))


# ---------------------------------------------------------------- the sampler

V = 40
N = 20000  # draws per distribution: empirical frequencies within ~0.01 of the truth


def dev() -> torch.device:
    return torch.device(test_device())


def fixed_logits(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(V, generator=g) * 2.0).to(dev())


def args(n: int, temperature: float = 1.0, top_k: int = V, top_p: float = 1.0) -> BatchSamplingArgs:
    return BatchSamplingArgs(
        torch.full((n,), temperature, device=dev()),
        torch.full((n,), top_k, device=dev()),
        torch.full((n,), top_p, device=dev()),
    )


def draw(logits: torch.Tensor, a: BatchSamplingArgs, seed: int = 0) -> torch.Tensor:
    n = a.temperatures.shape[0] if a.temperatures is not None else N
    return Sampler(dev(), seed).sample(logits.expand(n, V).contiguous(), a).cpu()


def frequencies(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens.long(), minlength=V).float() / len(tokens)


def entropy(p: torch.Tensor) -> float:
    p = p[p > 0]
    return float(-(p * p.log()).sum())


def test_all_greedy_batch_takes_the_argmax():
    logits = torch.randn(5, V, device=dev())
    a = BatchSamplingArgs.from_params([SamplingParams()] * 5, V, dev())
    assert a.temperatures is None, "an all-greedy batch should build no sampling tensors"
    out = Sampler(dev(), 0).sample(logits, a)
    assert out.dtype == torch.int32, f"token ids should be int32, got {out.dtype}"
    assert out.tolist() == logits.argmax(-1).tolist(), (
        "an all-greedy batch did not take each row's argmax"
    )


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_sampling_follows_the_softmax(temperature):
    logits = fixed_logits()
    got = frequencies(draw(logits, args(N, temperature)))
    want = (logits.float().cpu() / temperature).softmax(-1)
    tv = 0.5 * float((got - want).abs().sum())
    assert tv < 0.05, (
        f"empirical distribution is {tv:.3f} (total variation) from softmax(logits / T)"
    )


def test_higher_temperature_gives_higher_entropy():
    logits = fixed_logits(1)
    h = [entropy(frequencies(draw(logits, args(N, t)))) for t in (0.3, 1.0, 3.0)]
    assert h[0] < h[1] < h[2], f"entropies at T = 0.3, 1, 3: {h}"


def test_temperature_near_zero_is_argmax():
    logits = fixed_logits(2)
    got = draw(logits, args(2000, 1e-4)).unique().tolist()
    assert got == [int(logits.argmax())], (
        f"at T = 1e-4 every draw should be the argmax; drew {len(got)} distinct tokens"
    )


def test_greedy_rows_stay_greedy_in_a_sampled_batch():
    logits = fixed_logits(3).expand(6, V).contiguous()
    params = [SamplingParams(), SamplingParams(temperature=2.0)] * 3
    a = BatchSamplingArgs.from_params(params, V, dev())
    best = int(logits[0].argmax())
    for seed in range(20):
        out = Sampler(dev(), seed).sample(logits, a).tolist()
        assert out[0::2] == [best] * 3, (
            f"seed {seed}: a greedy row next to sampled rows did not take the argmax"
        )


@pytest.mark.parametrize("k", [1, 5])
def test_top_k_never_samples_outside_the_top_k(k):
    logits = fixed_logits(4)
    tokens = draw(logits, args(N, 2.0, top_k=k))
    top = set(logits.topk(k).indices.tolist())
    outside = sorted(set(tokens.unique().tolist()) - top)
    assert not outside, f"top-k {k}: drew tokens {outside} outside the {k} most likely"
    # and all of the top k do occur at T = 2 (k = 1 is greedy)
    assert len(tokens.unique()) == k, (
        f"top-k {k} at T = 2: drew {len(tokens.unique())} distinct tokens, expected {k}"
    )


def nucleus(logits: torch.Tensor, p: float) -> set:
    """The smallest set of most likely tokens whose probability reaches p."""
    probs, order = logits.float().cpu().softmax(-1).sort(descending=True)
    n = int((probs.cumsum(0) < p).sum()) + 1
    return set(order[:n].tolist())


@pytest.mark.parametrize("p", [0.3, 0.6, 0.9])
def test_top_p_samples_the_renormalized_nucleus(p):
    logits = fixed_logits(5)
    got = frequencies(draw(logits, args(N, 1.0, top_p=p)))
    keep = sorted(nucleus(logits, p))
    outside = sorted(set(got.nonzero().flatten().tolist()) - set(keep))
    assert not outside, (
        f"top-p {p}: drew tokens {outside} outside the nucleus (its {len(keep)} tokens: {keep})"
    )
    want = torch.zeros_like(got)
    want[keep] = logits.float().cpu().softmax(-1)[keep]
    want /= want.sum()  # and in proportion inside it (greedy would pass the line above)
    tv = 0.5 * float((got - want).abs().sum())
    assert tv < 0.05, (
        f"empirical distribution is {tv:.3f} (total variation) from the renormalized nucleus"
    )


@pytest.mark.parametrize("temperature,p", [(0.5, 0.9), (2.0, 0.5)])
def test_top_p_applies_to_the_distribution_after_temperature(temperature, p):
    # The order is temperature, then the filters: the nucleus is taken from softmax(logits / T).
    # (At T = 0.5 it has 3 tokens where softmax(logits) would need 9; at T = 2, 6 instead of 2.)
    logits = fixed_logits(8)
    tempered = logits.float().cpu() / temperature
    keep = sorted(nucleus(tempered, p))
    got = frequencies(draw(logits, args(N, temperature, top_p=p)))
    outside = sorted(set(got.nonzero().flatten().tolist()) - set(keep))
    assert not outside, (
        f"T = {temperature}, top-p {p}: drew tokens {outside} outside the nucleus of "
        f"softmax(logits / T) (its {len(keep)} tokens: {keep})"
    )
    want = torch.zeros_like(got)
    want[keep] = tempered.softmax(-1)[keep]
    want /= want.sum()
    tv = 0.5 * float((got - want).abs().sum())
    assert tv < 0.05, (
        f"T = {temperature}, top-p {p}: the draws are {tv:.3f} (total variation) from "
        f"softmax(logits / T) renormalized over its nucleus"
    )


def test_each_row_uses_its_own_sampling_settings():
    # One batch, four kinds of rows interleaved: every row must follow its own settings.
    logits = fixed_logits(9)
    kinds = [  # (temperature, top_k, top_p); temperature 0 is greedy
        (0.5, V, 1.0),
        (2.0, 3, 1.0),
        (1.0, V, 0.6),
        (0.0, V, 1.0),
    ]
    n = 8000

    def column(i: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([k[i] for k in kinds] * n, dtype=dtype, device=dev())

    a = BatchSamplingArgs(
        column(0, torch.float32), column(1, torch.int64), column(2, torch.float32)
    )
    out = Sampler(dev(), 0).sample(logits.expand(n * len(kinds), V).contiguous(), a).cpu()
    assert out.dtype == torch.int32, f"token ids should be int32, got {out.dtype}"
    raw = logits.float().cpu()
    for i, (t, k, p) in enumerate(kinds):
        got = frequencies(out[i :: len(kinds)])
        if t == 0:
            want = torch.nn.functional.one_hot(raw.argmax(), V).float()
        else:
            tempered = raw / t
            keep = set(tempered.topk(k).indices.tolist()) & nucleus(tempered, p)
            want = torch.zeros(V)
            want[sorted(keep)] = tempered.softmax(-1)[sorted(keep)]
            want /= want.sum()
        tv = 0.5 * float((got - want).abs().sum())
        assert tv < 0.05, (
            f"rows with temperature {t}, top-k {k}, top-p {p}, in a batch with other "
            f"settings: their draws are {tv:.3f} (total variation) from what those settings give"
        )


def test_top_p_always_keeps_the_most_likely_token():
    logits = fixed_logits(6)
    got = draw(logits, args(1000, 1.0, top_p=1e-6)).unique().tolist()
    assert got == [int(logits.argmax())], (
        f"top-p 1e-6 should keep only the most likely token; drew {len(got)} distinct"
    )


def test_seeded_sampling_is_reproducible():
    logits = fixed_logits(7)
    a, b = draw(logits, args(500, 1.5), seed=11), draw(logits, args(500, 1.5), seed=11)
    assert torch.equal(a, b), (
        "two samplers with seed 11 drew different tokens: draw with the sampler's generator"
    )
    assert not torch.equal(a, draw(logits, args(500, 1.5), seed=12)), (
        "seeds 11 and 12 drew the same 500 tokens"
    )


def test_filter_masks_outside_top_k_then_top_p_per_row():
    logits = torch.log(
        torch.tensor(
            [[0.1, 0.4, 0.2, 0.3], [0.1, 0.4, 0.2, 0.3], [0.1, 0.4, 0.2, 0.3]], device=dev()
        )
    )
    out = top_k_top_p_filter(
        logits, torch.tensor([2, 4, 2], device=dev()), torch.tensor([1.0, 0.6, 0.5], device=dev())
    )
    kept = torch.isfinite(out).cpu()
    want = [
        ([False, True, False, True], "top-k 2"),
        ([False, True, False, True], "top-p 0.6: 0.4 alone is short of it, 0.4 + 0.3 reaches it"),
        ([False, True, False, False], "top-k 2 renormalized (0.57, 0.43), then top-p 0.5"),
    ]
    for row, (mask, rule) in enumerate(want):
        assert kept[row].tolist() == mask, (
            f"probabilities [0.1, 0.4, 0.2, 0.3], {rule}: "
            f"kept {kept[row].int().tolist()}, expected {[int(m) for m in mask]}"
        )
    survivors = kept.to(out.device)
    assert torch.equal(out[survivors], logits[survivors]), (
        "the filter changed the values of tokens it kept"
    )


def test_filters_off_keep_every_token():
    """top_k = vocabulary and top_p = 1 mean "off": every token stays, even where a float32 running
    total of the probabilities reaches 1.0 before the end of a 4096-token row."""
    logits = torch.randn(2, 4096, generator=torch.Generator().manual_seed(0)).to(dev()) * 3
    out = top_k_top_p_filter(
        logits, torch.tensor([4096, 4096], device=dev()), torch.tensor([1.0, 1.0], device=dev())
    )
    assert bool(torch.isfinite(out).all()), f"{int((~torch.isfinite(out)).sum())} tokens removed"


def test_a_row_with_filters_off_keeps_every_token_next_to_a_filtered_row():
    # "Off" is decided per row: another row of the batch using top-p must not cut this one.
    logits = torch.randn(2, 4096, generator=torch.Generator().manual_seed(1)).to(dev()) * 3
    out = top_k_top_p_filter(
        logits, torch.tensor([4096, 4096], device=dev()), torch.tensor([1.0, 0.5], device=dev())
    )
    kept = torch.isfinite(out).sum(-1).tolist()
    assert kept[0] == 4096, (
        f"the row with top-p 1.0 lost {4096 - kept[0]} tokens (its neighbour has top-p 0.5)"
    )
    assert kept[1] < 4096, "the row with top-p 0.5 kept every token"


def test_top_k_keeps_exactly_k_tokens_when_several_tie():
    # Rank r is removed when r >= k: of tokens that tie at the k-th place, only enough to make k
    # stay.
    logits = torch.tensor([[0.0, 2.0, 1.0, 1.0, 1.0, -1.0]] * 3, device=dev())
    out = top_k_top_p_filter(
        logits, torch.tensor([1, 2, 3], device=dev()), torch.ones(3, device=dev())
    )
    kept = torch.isfinite(out).cpu()
    counts = kept.sum(-1).tolist()
    assert counts == [1, 2, 3], (
        f"top-k 1, 2, 3 over logits with a three-way tie kept {counts} tokens, expected [1, 2, 3]"
    )
    assert kept[:, 1].all(), "the most likely token was removed"
    assert not kept[:, [0, 5]].any(), (
        "a token below the tied ones survived while tied ones were removed"
    )


def test_top_p_keeps_the_token_that_reaches_p_and_removes_the_ones_after_it():
    """A token stays while the mass *before* it is below p: the one that crosses p stays, and a
    token whose mass before is exactly p goes."""
    logits = torch.log(
        torch.tensor(
            [
                [0.25, 0.25, 0.25, 0.25],  # masses before: 0, .25, .5, .75
                [0.25, 0.25, 0.25, 0.25],
                [0.5, 0.25, 0.125, 0.125],  # masses before: 0, .5, .75, .875
                [0.5, 0.25, 0.125, 0.125],
            ],
            device=dev(),
        )
    )
    p = torch.tensor([0.5, 0.7, 0.5, 0.8], device=dev())
    out = top_k_top_p_filter(logits, torch.full((4,), 4, device=dev()), p)
    counts = torch.isfinite(out).sum(-1).tolist()
    want = [2, 3, 1, 3]
    for row in range(4):
        assert counts[row] == want[row], (
            f"top-p {float(p[row]):.2f} over probabilities {logits[row].exp().cpu().tolist()} kept "
            f"{counts[row]} tokens, expected {want[row]}"
        )
    first = torch.isfinite(out[2:]).cpu()[:, 0]
    assert first.all(), "top-p removed the most likely token"


def test_from_params_clamps_top_k_to_the_vocabulary():
    a = BatchSamplingArgs.from_params(
        [SamplingParams(temperature=1.0, top_k=10 * V), SamplingParams(temperature=0.5)], V, dev()
    )
    assert a.top_k.tolist() == [V, V], (
        f"top_k should be clamped to the vocabulary ({V}), got {a.top_k.tolist()}"
    )
    assert a.temperatures.tolist() == [1.0, 0.5], (
        f"temperatures: {a.temperatures.tolist()}, expected [1.0, 0.5]"
    )
