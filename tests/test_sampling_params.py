"""SamplingParams is declared once (minisgl/core.py): each field one line, its default and its
checks; which fields a caller chose is decided at the edges (the server's request models,
`LLM.generate`'s keywords); and a request's tokens are drawn by one rule, `Sampler.sample`, seeded
rows included."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.engine.request_sampling import RequestSampler
from minisgl.engine.sampler import BatchSamplingArgs, Sampler
from minisgl.llm.inputs import sampling_list


def test_every_field_carries_its_checks_beside_it():
    unchecked = [
        f.name
        for f in dataclasses.fields(SamplingParams)
        if f.name != "fields_set" and not f.metadata.get("checks")
    ]
    assert not unchecked, (
        f"fields declared without their checks (_rule(default, *checks)): {unchecked}"
    )


def test_generates_keywords_alone_count_as_set():
    (chosen,) = sampling_list(None, 1, {"max_tokens": 3, "temperature": 0.5})
    assert chosen.fields_set == ["max_tokens", "temperature"], chosen.fields_set
    (nothing,) = sampling_list(None, 1)
    assert nothing.fields_set == [], f"no sampling settings: none set, got {nothing.fields_set}"
    (whole,) = sampling_list(SamplingParams(max_tokens=3), 1)
    assert all(whole.is_set(f.name) for f in dataclasses.fields(SamplingParams)), (
        "a SamplingParams given whole means what it says: every field is the caller's"
    )
    with pytest.raises(TypeError, match="max_tokens"):
        sampling_list(SamplingParams(), 1, {"max_tokens": 3})


def test_model_defaults_fill_only_the_fields_not_set():
    params = SamplingParams(temperature=0.5, fields_set=["temperature"])
    got = params.with_defaults({"temperature": 0.1, "max_tokens": 3})
    assert (got.temperature, got.max_tokens, got.fields_set) == (0.5, 3, ["temperature"]), got
    whole = SamplingParams(temperature=0.5).with_defaults({"temperature": 0.1, "max_tokens": 3})
    assert (whole.temperature, whole.max_tokens) == (0.5, 16), whole
    with pytest.raises(ValueError, match="fields_set names no sampling field: \\['temp'\\]"):
        SamplingParams(fields_set=["temp"])


def test_a_seeded_row_is_drawn_by_the_batchs_own_rule(monkeypatch):
    """A change to Sampler.sample (a logits mask, another filter) reaches seeded rows too: they
    are drawn again by the same rule, not by a copy of it."""
    logits = torch.zeros(2, 16)
    logits[:, 3] = 50.0  # any draw of the plain rule gives token 3
    params = [SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=1.0)]
    args = BatchSamplingArgs.from_params(params, 16, torch.device("cpu"))
    args.seeds = [(0, 123)]
    assert RequestSampler(torch.device("cpu")).sample(logits, args).tolist() == [3, 3]

    def always_seven(self, logits, args):
        return torch.full((logits.shape[0],), 7, dtype=torch.int32)

    monkeypatch.setattr(Sampler, "sample", always_seven)
    got = RequestSampler(torch.device("cpu")).sample(logits, args).tolist()
    assert got == [7, 7], f"the seeded row 0 was drawn by another rule than Sampler.sample: {got}"
