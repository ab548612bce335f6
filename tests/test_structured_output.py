"""Structured output in the offline engine (issue 45): every output of the bundled model under a
JSON schema, a regular expression or a choice parses and validates, with overlap on and off, both
prefix caches, chunked prefill and page size 4, next to free requests whose tokens do not change;
greedy constrained output is the argmax over the allowed tokens of Hugging Face's logits; the
features a request may combine with a constraint (seeds, logprobs, stops, aborts) keep working;
a grammar that does not compile is refused at the door with the library's error."""

from __future__ import annotations

import json
import re

import jsonschema
import llguidance
import pytest
import torch

from helpers import PROMPT_TEXTS, build_llm, cpu_streams_llm, greedy, hf_logits
from minisgl import SamplingParams
from minisgl.structured.bitmask import apply_bitmask_
from minisgl.structured.constraint import grammar_text
from structured_cases import CHOICES, REGEXES, SCHEMAS

MAX_TOKENS = 64  # every case ends well before (tests/structured_cases.py)

# (name, LLM options): the loop, the prefix cache, chunked prefill with page size 4, and the
# CPU's deferred streams, on which a mask filled before step N's tokens are handled shows up
CONFIGS = {
    "overlap_radix": dict(overlap_scheduling=True),
    "normal_naive": dict(overlap_scheduling=False, cache_type="naive"),
    "overlap_chunked_page4": dict(overlap_scheduling=True, page_size=4, max_extend_tokens=8),
    "normal_chunked_page4": dict(overlap_scheduling=False, page_size=4, max_extend_tokens=8),
    "overlap_deferred_streams": dict(overlap_scheduling=True, deferred=True),
}


def _build(options):
    options = dict(options)
    if options.pop("deferred", False):
        return cpu_streams_llm("deferred", **options)
    return build_llm(**options)


@pytest.fixture(scope="module")
def llm():
    engine = build_llm()
    yield engine
    engine.shutdown()


def _constraints():
    cases = [(f"schema {n}", {"json_schema": s}) for n, s in SCHEMAS.items()]
    cases += [(f"regex {n}", {"regex": r}) for n, r in REGEXES.items()]
    cases += [("choice", {"choice": CHOICES})]
    return cases


def _check_output(name: str, constraint: dict, out: dict) -> None:
    """The output ended where its grammar did (EOS: finish_reason "stop") and is what it must be."""
    text = out["text"]
    assert out["finish_reason"] == "stop", (
        f"{name}: finish_reason {out['finish_reason']!r} after {len(out['token_ids'])} tokens, "
        f"expected 'stop' (the grammar's end): {text!r}"
    )
    ((kind, value),) = constraint.items()
    if kind in ("json_schema", "json_object"):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as e:
            pytest.fail(f"{name}: the output is not JSON ({e}): {text!r}")
        schema = value if kind == "json_schema" else {"type": "object"}
        try:
            jsonschema.validate(parsed, schema)
        except jsonschema.ValidationError as e:
            pytest.fail(f"{name}: {text!r} does not follow the schema: {e.message}")
    elif kind == "regex":
        assert re.fullmatch(value, text), f"{name}: {text!r} does not match {value!r}"
    else:
        assert text in value, f"{name}: {text!r} is not one of {value}"


@pytest.mark.parametrize("config", list(CONFIGS))
def test_every_constrained_output_validates_and_free_neighbours_keep_their_tokens(config):
    engine = _build(CONFIGS[config])
    try:
        free_prompts = PROMPT_TEXTS[:2]
        alone = engine.generate(free_prompts, greedy(12))
        cases = _constraints()
        prompts, params = [], []
        for i, (_, constraint) in enumerate(cases):
            prompts.append(PROMPT_TEXTS[i % len(PROMPT_TEXTS)])
            params.append(SamplingParams(max_tokens=MAX_TOKENS, constraint=constraint))
            if i % 8 == 3:  # free requests ride in the same batches as constrained ones
                prompts.append(free_prompts[(i // 8) % 2])
                params.append(greedy(12))
        outs = engine.generate(prompts, params)
        constrained = [o for o, p in zip(outs, params) if p.constraint is not None]
        for (name, constraint), out in zip(cases, constrained):
            _check_output(name, constraint, out)
        free = [(o, pr) for o, p, pr in zip(outs, params, prompts) if p.constraint is None]
        assert free, "no free request rode with the constrained ones"
        for out, prompt in free:
            want = alone[free_prompts.index(prompt)]["token_ids"]
            assert out["token_ids"] == want, (
                f"a free request's tokens changed next to constrained ones: {out['token_ids']}, "
                f"alone {want}"
            )
        assert engine._matchers == {}, (
            f"matchers left after every request ended: {engine._matchers}"
        )
    finally:
        engine.shutdown()


def _reference_argmax(prompt_ids, constraint, max_tokens):
    """Greedy decoding by hand: Hugging Face's logits of the whole sequence at each step, the
    tokens a fresh llguidance matcher allows, their argmax; until EOS or max_tokens."""
    from helpers import MODEL
    from minisgl.models.tokenizer import load_tokenizer
    from minisgl.structured.grammars import GrammarBook

    book = GrammarBook(load_tokenizer(MODEL), 4096, [0])
    matcher = llguidance.LLMatcher(book.ll_tokenizer, grammar_text(constraint))
    ids, out = list(prompt_ids), []
    for _ in range(max_tokens):
        logits = hf_logits(ids)[-1]
        allowed = torch.zeros(logits.shape[0], dtype=torch.bool)
        mask = book.bitmask([matcher])[0]
        for t in range(logits.shape[0]):
            allowed[t] = bool((int(mask[t // 32]) >> (t % 32)) & 1)
        token = int(logits.masked_fill(~allowed, float("-inf")).argmax())
        out.append(token)
        assert matcher.consume_token(token)
        if token == 0:
            break
        ids.append(token)
    return out


REFERENCE_CASES = [
    ("nested_object", {"json_schema": SCHEMAS["nested_object"]}),
    ("array_of_objects", {"json_schema": SCHEMAS["array_of_objects"]}),
    ("pattern_id", {"json_schema": SCHEMAS["pattern_id"]}),
    ("regex word_then_bang", {"regex": REGEXES["word_then_bang"]}),
]


@pytest.mark.parametrize("overlap", [False, True])
def test_greedy_constrained_output_is_the_argmax_over_allowed_tokens(llm, overlap):
    llm.config.overlap_scheduling = overlap
    try:
        prompts = [PROMPT_TEXTS[i] for i in range(len(REFERENCE_CASES))]
        params = [SamplingParams(max_tokens=48, constraint=c) for _, c in REFERENCE_CASES]
        outs = llm.generate(prompts + [PROMPT_TEXTS[1]], params + [greedy(8)])[: len(prompts)]
    finally:
        llm.config.overlap_scheduling = None
    for (name, constraint), prompt, out in zip(REFERENCE_CASES, prompts, outs):
        want = _reference_argmax(llm.encode(prompt).tolist(), constraint, 48)
        assert out["token_ids"] == want, (
            f"{name}: the engine's greedy tokens {out['token_ids']} are not the argmax over the "
            f"allowed tokens of Hugging Face's logits {want}"
        )


def test_any_json_object_is_a_prefix_of_one_when_max_tokens_cuts_it(llm):
    # the bundled model writes an endless key under "any object": what it wrote is still a
    # beginning a JSON object can have, token by token
    from helpers import MODEL
    from minisgl.models.tokenizer import load_tokenizer
    from minisgl.structured.grammars import GrammarBook

    constraint = {"json_object": True}
    out = llm.generate(PROMPT_TEXTS[1], SamplingParams(max_tokens=24, constraint=constraint))[0]
    assert out["text"].startswith("{"), out["text"]
    book = GrammarBook(load_tokenizer(MODEL), 4096, [0])
    matcher = book.matcher(constraint)
    for i, token in enumerate(out["token_ids"]):
        assert matcher.consume_token(token), (
            f"token {i} ({token}) of {out['text']!r} cannot continue a JSON object"
        )


def test_sampled_constrained_outputs_stay_in_the_grammar_and_seeds_repeat(llm):
    schema = SCHEMAS["nested_object"]
    params = [
        SamplingParams(
            max_tokens=MAX_TOKENS,
            temperature=1.2,
            top_k=50,
            top_p=0.95,
            seed=s,
            constraint={"json_schema": schema},
        )
        for s in range(6)
    ]
    outs = llm.generate([PROMPT_TEXTS[0]] * 6, params)
    for i, out in enumerate(outs):
        _check_output(f"sampled, seed {i}", {"json_schema": schema}, out)
    # the same seed alone, and next to other requests, gives the same tokens
    again = llm.generate([PROMPT_TEXTS[0], PROMPT_TEXTS[1]], [params[3], greedy(5)])[0]
    assert again["token_ids"] == outs[3]["token_ids"]


def test_logprobs_of_a_constrained_request_name_only_allowed_tokens(llm):
    constraint = {"choice": CHOICES}
    out = llm.generate(
        PROMPT_TEXTS[0], SamplingParams(max_tokens=16, logprobs=5, constraint=constraint)
    )[0]
    _check_output("choice with logprobs", constraint, out)
    first = out["logprobs"][0]
    # the grammar allows, first, any token whose text begins one of the choices
    top = first["top_logprobs"]
    texts = {t: llm.decode([t]) for t, _ in top}
    forbidden = [(t, texts[t]) for t, lp in top if not any(c.startswith(texts[t]) for c in CHOICES)]
    assert top and not forbidden, (
        f"the first position's alternatives {top} hold tokens the grammar forbids: {forbidden} "
        f"(none begins one of {CHOICES})"
    )
    assert first["logprob"] > float("-inf")


def test_prompt_logprobs_next_to_a_constrained_request_keep_the_mask_on_its_row(llm):
    # a batch with prompt logprobs has more logits rows than requests: the mask must land on the
    # constrained request's sampling row
    constraint = {"regex": REGEXES["phone"]}
    outs = llm.generate(
        [PROMPT_TEXTS[1], PROMPT_TEXTS[0]],
        [
            SamplingParams(max_tokens=4, prompt_logprobs=True),
            SamplingParams(max_tokens=20, constraint=constraint),
        ],
    )
    _check_output("regex after a prompt-logprobs request", constraint, outs[1])


def test_a_stop_string_and_max_tokens_end_a_constrained_request_early(llm):
    constraint = {"json_schema": SCHEMAS["nested_object"]}
    full = llm.generate(PROMPT_TEXTS[0], SamplingParams(max_tokens=64, constraint=constraint))[0]
    cut = llm.generate(
        PROMPT_TEXTS[0], SamplingParams(max_tokens=64, constraint=constraint, stop=["house"])
    )[0]
    assert (
        cut["finish_reason"] == "stop" and cut["text"] == full["text"][: full["text"].find("house")]
    )
    short = llm.generate(PROMPT_TEXTS[0], SamplingParams(max_tokens=5, constraint=constraint))[0]
    assert short["finish_reason"] == "length" and short["token_ids"] == full["token_ids"][:5]


@pytest.mark.parametrize("overlap", [False, True])
def test_an_aborted_constrained_request_drops_its_matcher(llm, overlap):
    llm.config.overlap_scheduling = overlap
    try:
        constraint = {"json_schema": SCHEMAS["nested_object"]}
        uid = llm.add_request(PROMPT_TEXTS[0], SamplingParams(max_tokens=64, constraint=constraint))
        other = llm.add_request(PROMPT_TEXTS[1], greedy(6))
        for _ in range(3):
            llm.step()
        assert uid in llm._matchers, "the constrained request has no matcher while it runs"
        llm.abort(uid)
        llm.run_until_idle()
        assert llm._matchers == {}, f"matchers left after an abort: {llm._matchers}"
        assert len(llm.results[other].token_ids) == 6
    finally:
        llm.config.overlap_scheduling = None


@pytest.mark.parametrize(
    "constraint, message",
    [
        ({"regex": "[a-"}, "unclosed character class"),
        ({"json_schema": {"type": "integer", "minimum": 5, "maximum": 2}}, "Unsatisfiable"),
        ({"json_schema": {"type": "strin"}}, "strin"),
        ({"lark": "start: foo"}, "unknown name"),
    ],
)
def test_a_grammar_that_does_not_compile_is_refused_at_the_door(llm, constraint, message):
    with pytest.raises(ValueError, match="(?s)does not compile.*" + message):
        llm.add_request(PROMPT_TEXTS[0], SamplingParams(constraint=constraint))
    assert llm._matchers == {}


@pytest.mark.parametrize(
    "bad, error",
    [
        ({"regex": ""}, "non-empty string"),
        ({"json": {}}, "kind must be one of"),
        ("{}", "a dict with one key"),
        ({"choice": ["a", ""]}, "empty string"),
    ],
)
def test_a_malformed_constraint_is_refused_by_name(bad, error):
    with pytest.raises((TypeError, ValueError), match=error):
        SamplingParams(constraint=bad)


def test_ignore_eos_is_refused_with_a_constraint():
    with pytest.raises(ValueError, match="ignore_eos cannot go with a constraint"):
        SamplingParams(ignore_eos=True, constraint={"regex": "a"})


def test_the_bitmask_masks_only_its_rows_and_forbids_columns_past_it():
    logits = torch.arange(3 * 40, dtype=torch.float32).reshape(3, 40)
    before = logits.clone()
    bitmask = torch.tensor([[0b101, 0]], dtype=torch.int32)  # tokens 0 and 2 of 32 columns
    apply_bitmask_(logits, torch.tensor([1]), bitmask)
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    kept = (logits[1] > float("-inf")).nonzero().flatten().tolist()
    assert kept == [0, 2], f"row 1 keeps tokens {kept}, expected [0, 2]"


def test_a_library_that_cannot_serve_the_tokenizer_refuses_the_request_not_the_scheduler(
    llm, monkeypatch
):
    """llguidance 1.6 takes one EOS id where the bundled model has a list: its TypeError, raised
    by the library's set-up at the first constraint, once ended the server's scheduler (every
    request then a 500). It is the request's refusal, naming the library; the engine serves on."""
    import llguidance

    def too_old(*args, **kwargs):
        raise TypeError("argument 'eos_token': 'list' object cannot be interpreted as an integer")

    book = llm.grammars
    monkeypatch.setattr(book, "_ll_tokenizer", None)
    monkeypatch.setattr(llguidance, "LLTokenizer", too_old)
    with pytest.raises(ValueError, match="llguidance .* cannot serve this tokenizer: TypeError"):
        llm.add_request(PROMPT_TEXTS[0], SamplingParams(constraint={"regex": "a+"}))
    assert llm._matchers == {}
    (out,) = llm.generate([PROMPT_TEXTS[0]], SamplingParams(max_tokens=3))
    assert len(out["token_ids"]) == 3, out
