"""Each upstream variant (judge/variants/ch11_upstream_*) must be caught by the test written for
its bug: a regression test that passes on the bug proves nothing.

The variant's functions are put on a *subclass* of LLM (nothing is patched on the engine itself),
and the same check the chapter-11 test runs against LLM is run against the subclass."""

from __future__ import annotations

import ast

import pytest

import test_ch11_overlap as ch11
from judge.variant_edits import variant_path, variant_source
from minisgl.llm import LLM


def variant_llm(name: str) -> type:
    """A subclass of LLM whose methods are the variant's top-level functions, compiled in the
    namespace of the scheduler's modules (where the reference versions live)."""
    from minisgl.scheduler import batch_inputs, intake, lifecycle, scheduler

    path = variant_path(name)
    source = variant_source(path)
    names = [n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]
    namespace = {}  # the scheduler's modules together: a variant may replace any of its methods
    for module in (intake, lifecycle, batch_inputs, scheduler):
        namespace.update(vars(module))
    exec(compile(source, str(path), "exec"), namespace)
    return type(f"LLM_{name}", (LLM,), {n: namespace[n] for n in names})


# (variant, check, what the check's failure must say: it fails for the variant's own bug)
CASES = [
    (
        "ch11_upstream_finished",
        lambda cls: ch11.check_finished_flag_on_last_token(cls, overlap=True),
        "finished flags",
    ),
    (
        "ch11_upstream_stale",
        lambda cls: ch11.check_no_message_after_eos(cls, overlap=True),
        r"messages .* expected",
    ),
    (
        "ch11_upstream_slot",
        ch11.check_slot_not_reused_in_flight,
        r"slot \d+ given to request \d+ while step",
    ),
    (
        "ch11_upstream_slot",
        ch11.check_slot_race_gives_right_tokens_deferred,
        "the request that waits for the freed slot continues another text",
    ),
    (
        "ch11_upstream_abort",
        ch11.check_abort_while_prefill_in_flight,
        "the aborted request was sent",
    ),
]


def on_cpu_streams(check):
    """The slot race shows as wrong tokens only with the CPU's deferred streams: that check runs on
    the CPU under --device cuda too (on a GPU:
    test_ch11_gpu.py::test_slot_reuse_race_on_the_gpu_upstream_vs_fix)."""
    if check is ch11.check_slot_race_gives_right_tokens_deferred:
        return lambda cls: check(cls, device="cpu")
    return check


IDS = [c.__name__ if c.__name__ != "<lambda>" else v.split("_")[-1] for v, c, _ in CASES]


@pytest.mark.parametrize(
    "variant,check,says", CASES, ids=[f"{v}-{i}" for (v, _, _), i in zip(CASES, IDS)]
)
def test_variant_is_caught(variant, check, says):
    with pytest.raises(AssertionError, match=says):
        on_cpu_streams(check)(variant_llm(variant))


@pytest.mark.parametrize("variant,check,says", CASES, ids=[f"all4-{i}" for i in IDS])
def test_all_four_bugs_together_are_caught(variant, check, says):
    # together, the early finished flag cuts the first request short before the slot race can
    # show in the second one: that check then fails on the first request's tokens
    if check is ch11.check_slot_race_gives_right_tokens_deferred:
        says = "the request that ends at EOS"
    with pytest.raises(AssertionError, match=says):
        on_cpu_streams(check)(variant_llm("ch11_upstream"))


# Mistakes of a learner's own (not upstream's), each caught by the check written for its rule.
OWN_CASES = [
    (
        "ch11_release_after_freeing",
        ch11.check_slot_not_reused_in_flight,
        r"slot \d+ given to request \d+ while step",
    ),
    (
        "ch11_abort_misses_last_step",
        ch11.check_abort_meets_the_last_step_in_flight,
        "the abort found the request 'not running'",
    ),
]


@pytest.mark.parametrize("variant,check,says", OWN_CASES, ids=[v for v, _, _ in OWN_CASES])
def test_own_mistake_is_caught(variant, check, says):
    with pytest.raises(AssertionError, match=says):
        check(variant_llm(variant))


@pytest.mark.parametrize(
    "check",
    [ch11.check_slot_not_reused_in_flight, ch11.check_slot_race_gives_right_tokens_deferred],
    ids=["in_flight", "deferred"],
)
def test_an_early_finish_is_named_by_the_slot_checks(check):
    # upstream's finished flag (`not req.can_decode`) ends the request that got the slot one token
    # early: the slot checks must say so, not blame the slot
    with pytest.raises(
        AssertionError, match="the request that waits for the freed slot finished early"
    ):
        on_cpu_streams(check)(variant_llm("ch11_upstream_finished"))
