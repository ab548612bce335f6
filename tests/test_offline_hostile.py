"""The offline LLM's two silent answers of issue 44, now errors: a checkpoint whose values do not
fit float16 loaded as float16 (it generated token 0 over and over), and a call on a shut-down LLM
(it returned empty text)."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import MODEL, build_llm
from minisgl import SamplingParams

KEY = "model.layers.0.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def too_large_for_float16(tmp_path_factory):
    """The bundled model with one value of one weight beyond float16's range (65504)."""
    target = tmp_path_factory.mktemp("overflow") / MODEL.name
    shutil.copytree(MODEL, target)
    weights = load_file(target / "model.safetensors")
    weights[KEY] = weights[KEY].clone()
    weights[KEY][0, 0] = 1e6
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    return target


def test_weights_beyond_float16_are_refused_at_load_naming_the_weight(too_large_for_float16):
    with pytest.raises(ValueError, match=rf"weight {KEY} does not fit float16: 1 of its"):
        build_llm(too_large_for_float16, dtype=torch.float16)


def test_the_same_weights_load_in_float32(too_large_for_float16):
    llm = build_llm(too_large_for_float16)
    assert llm.generate("ROMEO:", SamplingParams(max_tokens=2))[0]["token_ids"]


def test_a_shut_down_llm_says_so():
    llm = build_llm()
    assert llm.generate("ROMEO:", SamplingParams(max_tokens=2))[0]["text"]
    llm.shutdown()
    for call in (
        lambda: llm.generate("ROMEO:", SamplingParams(max_tokens=2)),
        lambda: llm.add_request("ROMEO:"),
        llm.step,
    ):
        with pytest.raises(RuntimeError, match="this LLM was shut down"):
            call()
