"""Two engines in one process (a notebook that builds a second LLM, a benchmark comparing
settings) must not share per-forward state: each runs its layers against its own KV cache."""

from helpers import assert_tokens_equal, build_llm, greedy, hf_greedy, prompt_ids


def test_two_llms_in_one_process_interleaved():
    first, second = build_llm(), build_llm(page_size=4)
    prompts = prompt_ids()
    want = hf_greedy(prompts, 6)
    for llm in (first, second, first):
        got = [o["token_ids"] for o in llm.generate(prompts, greedy(6))]
        assert_tokens_equal(got, want, "an LLM used after another one was built")
