"""A failure inside a step fails only its own requests.

When a step raises (here: the sampler, as a NaN probability or an out-of-memory error would), the
requests of that batch get an error reply, their slots and KV pages go back without anything the
failed step computed reaching the prefix cache, and the engine goes on serving: the other requests
finish with transformers' tokens and the next generation is right. With overlap on and off.
"""

from __future__ import annotations

import pytest
import torch

from helpers import assert_tokens_equal, build_llm, greedy, hf_greedy, prompt_ids
from minisgl import SamplingParams
from minisgl.env import ENV


def assert_all_returned(llm) -> None:
    assert llm.table_manager.available_size == llm.table_manager.capacity, (
        f"{llm.table_manager.capacity - llm.table_manager.available_size} request slot(s) "
        "never came back"
    )
    llm.cache_manager.check_integrity()


class FailingSampler:
    """Makes the sampler raise for the first batch that holds one of `doomed`, after scribbling over
    the KV that batch just wrote (a half-finished step): a failed request's KV must not be
    cached."""

    def __init__(self, llm, doomed):
        self.llm, self.doomed, self.failures, self.current = llm, set(doomed), 0, None
        engine = llm.engine
        self._forward_batch, self._sample = engine.forward_batch, engine.sampler.sample
        engine.forward_batch, engine.sampler.sample = self.forward_batch, self.sample

    def forward_batch(self, fi):
        self.current = fi.batch
        return self._forward_batch(fi)

    def sample(self, logits, args):
        batch = self.current
        if self.failures == 0 and self.doomed & {r.uid for r in batch.reqs}:
            self.failures += 1
            kv = self.llm.engine.kv_cache
            for layer in range(self.llm.engine.model_config.num_layers):
                kv.k_cache(layer)[batch.out_loc] = 1e4
                kv.v_cache(layer)[batch.out_loc] = -1e4
            raise RuntimeError("injected sampler failure")
        return self._sample(logits, args)


@pytest.fixture(params=["overlap", "normal loop"])
def loop(request):
    ENV.DISABLE_OVERLAP_SCHEDULING.value = request.param == "normal loop"  # put back by conftest
    return request.param


def test_a_failed_prefill_fails_only_its_requests(loop):
    p = prompt_ids()
    want = hf_greedy(p, 8)
    llm = build_llm()
    injector = FailingSampler(llm, doomed=[1])
    a = llm.add_request(p[0], greedy(8))
    llm.step()  # a is running on its own
    llm.step()
    b = llm.add_request(p[1], greedy(8))  # its prefill fails
    llm.run_until_idle()
    assert injector.failures == 1, "the test should have failed exactly one step"
    ra, rb = llm.results[a], llm.results[b]
    assert rb.error is not None and "injected sampler failure" in rb.error, (
        "the request whose step failed should end with an error naming the failure, got "
        f"error={rb.error!r}"
    )
    assert ra.error is None, (
        f"a request outside the failed batch should not fail, got error={ra.error!r}"
    )
    assert_tokens_equal([ra.token_ids], [want[0]], f"{loop}: the request outside the failed batch")
    assert_all_returned(llm)
    # the engine still serves, and the failed prompt's scribbled KV was not cached
    again = [o["token_ids"] for o in llm.generate(p[:2], greedy(8))]
    assert_tokens_equal(again, want[:2], f"{loop}: the next generation after a failed step")
    assert_all_returned(llm)


def test_a_failed_decode_step_fails_its_batch_and_the_engine_goes_on(loop):
    p = prompt_ids()
    want = hf_greedy(p, 8)
    llm = build_llm()
    a = llm.add_request(p[0], greedy(8))
    b = llm.add_request(p[1], greedy(8))
    llm.step()  # prefill a and b together
    injector = FailingSampler(llm, doomed=[a])  # the next batch with a: a decode step of a and b
    llm.run_until_idle()
    assert injector.failures == 1, "the test should have failed exactly one step"
    errors = {uid: llm.results[uid].error for uid in (a, b)}
    assert all(e is not None for e in errors.values()), (
        f"both requests of the failed decode batch should end with an error, got {errors}"
    )
    assert all(len(llm.results[u].token_ids) < 8 for u in (a, b)), (
        "a failed request should not run to the end"
    )
    assert_all_returned(llm)
    again = [o["token_ids"] for o in llm.generate(p, greedy(8))]
    assert_tokens_equal(again, want, f"{loop}: the next generation after a failed decode step")
    assert_all_returned(llm)


def test_generate_reports_the_failed_request_and_returns_the_others(loop):
    p = prompt_ids()
    want = hf_greedy(p, 6)
    llm = build_llm(max_running_req=2)  # two at a time: the later prompts run in later batches
    FailingSampler(llm, doomed=[2])
    out = llm.generate(p, greedy(6))
    assert "error" in out[2] and "error" not in out[0], (
        "generate: only prompt 2 should carry an error, got errors on "
        f"{[i for i, o in enumerate(out) if 'error' in o]}"
    )
    ok = [i for i, o in enumerate(out) if "error" not in o]
    assert_tokens_equal(
        [out[i]["token_ids"] for i in ok], [want[i] for i in ok], f"{loop}: the other prompts"
    )
    assert_all_returned(llm)


def test_bad_sampling_values_sent_as_messages_are_refused_not_run():
    # A message that did not come through generate (a server's, say) is checked by the scheduler
    # too: a NaN temperature must never reach the sampler (on a GPU, a device-side assert).
    from minisgl.llm.llm import RequestResult
    from minisgl.message import UserMsg

    llm = build_llm()
    params = SamplingParams(max_tokens=4)
    params.temperature = float("nan")  # assigned after construction: nothing has checked it
    llm.results[99] = RequestResult(99)
    llm.io.put(
        UserMsg(
            uid=99,
            input_ids=torch.tensor(prompt_ids()[0], dtype=torch.int32),
            sampling_params=params,
        )
    )
    llm.run_until_idle()
    error = llm.results[99].error
    assert error is not None and "temperature" in error, (
        f"a request with temperature NaN should be refused naming temperature, got error={error!r}"
    )
    assert llm.steps_launched == 0, "a refused request should not run a single step"
    assert_all_returned(llm)
