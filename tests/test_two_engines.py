"""Two engines in one process (a notebook that builds a second LLM, a benchmark comparing
settings) must not share per-forward state: each runs its layers against its own KV cache, with
its own attention backend and its own choice of fused kernels."""

import pytest

from helpers import assert_tokens_equal, build_llm, greedy, hf_greedy, prompt_ids, test_device
from minisgl.env import ENV


def test_two_llms_in_one_process_interleaved():
    first, second = build_llm(), build_llm(page_size=4)
    prompts = prompt_ids()
    want = hf_greedy(prompts, 6)
    for llm in (first, second, first):
        got = [o["token_ids"] for o in llm.generate(prompts, greedy(6))]
        assert_tokens_equal(got, want, "an LLM used after another one was built")


def test_the_loop_is_each_engines_own_with_the_environment_as_default(monkeypatch):
    # the environment says: normal loop
    monkeypatch.setattr(ENV.DISABLE_OVERLAP_SCHEDULING, "value", True)
    overlap, default = build_llm(overlap_scheduling=True), build_llm()
    prompts = prompt_ids()
    for llm in (overlap, default):
        llm.add_request(prompts[0], greedy(4))
        llm.step()  # launches the prefill; only the overlap loop leaves it in flight
    assert (overlap.in_flight, default.in_flight) == (True, False), (
        "after one step, an engine built with overlap_scheduling=True should have its batch "
        "in flight and one "
        f"following the environment (normal loop) should not; got {overlap.in_flight} and "
        f"{default.in_flight}"
    )
    for llm in (overlap, default):
        llm.run_until_idle()


def test_the_attention_backend_is_each_engines_own_with_the_environment_as_default(monkeypatch):
    """MINISGL_ATTENTION_BACKEND is the default of `attention_backend`; an engine that names one
    keeps it. On a CPU the triton default cannot be honoured, and saying so is the proof it was
    read."""
    if test_device() == "cpu":
        monkeypatch.setattr(ENV.ATTENTION_BACKEND, "value", "triton")
        with pytest.raises(ValueError, match="triton attention backend needs a CUDA device"):
            build_llm()
        assert build_llm(attention_backend="torch").engine.backend_name == "torch", (
            "an engine built with attention_backend='torch' must use it whatever the "
            "environment says"
        )
        return
    monkeypatch.setattr(ENV.ATTENTION_BACKEND, "value", "torch")
    default, triton = build_llm(), build_llm(attention_backend="triton")
    assert (default.engine.backend_name, triton.engine.backend_name) == ("torch", "triton"), (
        f"expected backends torch (the environment's) and triton (asked for), got "
        f"{default.engine.backend_name} and {triton.engine.backend_name}"
    )
    prompts = prompt_ids()
    want = hf_greedy(prompts, 6)
    for llm in (default, triton, default):
        got = [o["token_ids"] for o in llm.generate(prompts, greedy(6))]
        assert_tokens_equal(
            got, want, f"the {llm.engine.backend_name} engine, used after the other"
        )


@pytest.mark.gpu
def test_two_engines_keep_their_own_fused_kernel_choice(monkeypatch):
    """An engine without fused kernels built after one with them must not turn them off for the
    first, nor use them itself."""
    from minisgl.kernel import triton_ops

    fused, plain = build_llm(), build_llm(fused_kernels=False)
    calls = []
    real = triton_ops.fused_add_rms_norm
    monkeypatch.setattr(
        triton_ops, "fused_add_rms_norm", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    prompts = prompt_ids()
    want = hf_greedy(prompts, 6)
    for llm, uses in ((fused, True), (plain, False), (fused, True)):
        before = len(calls)
        got = [o["token_ids"] for o in llm.generate(prompts, greedy(6))]
        assert_tokens_equal(got, want, f"the engine built with fused_kernels={uses}")
        assert (len(calls) > before) == uses, (
            f"the engine built {'with' if uses else 'without'} fused kernels "
            f"{'did not call' if uses else 'called'} the fused RMSNorm"
        )
