"""Bad input is refused at the door with an error naming what was wrong, queues nothing, and leaves
the engine serving (minisgl/llm/inputs.py, SamplingParams.validate, EngineConfig, env.py)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import MODEL, build_llm, greedy, prompt_ids
from minisgl import SamplingParams
from minisgl.models import ModelConfig


@pytest.fixture(scope="module")
def llm():
    return build_llm()


def assert_still_serving(llm) -> None:
    assert not llm.results and not llm.busy, "a refused call must queue nothing"
    out = llm.generate([prompt_ids()[0]], greedy(2))
    assert len(out[0]["token_ids"]) == 2, (
        "after a refused call the engine must still serve the next one"
    )


def gen(x):
    yield from x


@pytest.mark.parametrize(
    "prompts,error,words",
    [
        (7, TypeError, "prompts must be"),
        (None, TypeError, "prompts must be"),
        (3.5, TypeError, "prompts must be"),
        ({"text": "hi"}, TypeError, "prompts must be"),
        (gen([[1, 2]]), TypeError, "prompts must be"),
        ([b"\x01\x02"], TypeError, "decode bytes"),
        ([None], TypeError, "prompt 0: a prompt must be"),
        ([[1, 2], 5], TypeError, "prompt 1: a prompt must be"),
        ([[1, True, 2]], ValueError, "prompt 0: .*holds True"),
        ([[1, 2**31]], ValueError, "prompt 0: token id 2147483648 is outside the vocabulary"),
        ([torch.ones(2, 3, dtype=torch.int64)], TypeError, "1-D integer"),
        ([np.array([1.0, 2.0])], TypeError, "1-D integer"),
        (["ab\ud800c"], ValueError, "prompt 0: the text is not valid Unicode.*character 2"),
    ],
)
def test_bad_prompts_are_refused_naming_what_was_wrong(llm, prompts, error, words):
    with pytest.raises(error, match=words):
        llm.generate(prompts, greedy(2))
    assert_still_serving(llm)


def test_token_ids_may_come_as_a_tensor_or_a_numpy_array(llm):
    ids = prompt_ids()[0]
    want = llm.generate([ids], greedy(3))[0]["token_ids"]
    for prompt in (
        torch.tensor(ids),
        torch.tensor(ids, dtype=torch.int32),
        np.array(ids),
        tuple(ids),
        list(np.array(ids)),  # numpy integer scalars
    ):
        got = llm.generate(prompt, greedy(3))[0]["token_ids"]
        assert got == want, (
            f"a prompt given as {type(prompt).__name__} gave {got}, as a list {want}"
        )


@pytest.mark.parametrize(
    "kwargs,error,field",
    [
        (dict(temperature=float("nan")), ValueError, "temperature"),
        (dict(temperature=float("inf")), ValueError, "temperature"),
        (dict(temperature="0.7"), TypeError, "temperature"),
        (dict(top_p=float("nan")), ValueError, "top_p"),
        (dict(top_k=True), TypeError, "top_k"),
        (dict(top_k=2.0), TypeError, "top_k"),
        (dict(max_tokens=True), TypeError, "max_tokens"),
        (dict(max_tokens=2.5), TypeError, "max_tokens"),
        (dict(ignore_eos=1), TypeError, "ignore_eos"),
    ],
)
def test_sampling_params_refuse_nan_and_wrong_types(kwargs, error, field):
    with pytest.raises(error, match=field):
        SamplingParams(**kwargs)


def test_a_field_changed_after_construction_is_checked_again(llm):
    params = SamplingParams(max_tokens=2, temperature=0.7)
    params.top_p = 0.0
    with pytest.raises(ValueError, match="top_p"):
        llm.generate([prompt_ids()[0]], params)
    params.top_p, params.temperature = 1.0, math.nan
    with pytest.raises(ValueError, match="temperature"):
        llm.add_request(prompt_ids()[0], params)
    assert_still_serving(llm)


@pytest.mark.parametrize(
    "params,words",
    [
        ({"max_tokens": 3}, "must be a SamplingParams or a list"),
        ([greedy(2), {"max_tokens": 3}], r"sampling_params\[1\] must be a SamplingParams"),
    ],
)
def test_sampling_params_of_another_type_are_refused(llm, params, words):
    with pytest.raises(TypeError, match=words):
        llm.generate(prompt_ids()[:2], params)
    assert_still_serving(llm)


def test_dtype_by_name_and_a_bad_one():
    assert build_llm(dtype="float16").engine.dtype == torch.float16
    assert build_llm(dtype="torch.bfloat16").engine.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be one of float32, float16, bfloat16"):
        build_llm(dtype="int8")


@pytest.mark.parametrize("device", ["tpu", "gpu", "meta", 3.5])
def test_a_device_the_engine_cannot_run_on_is_named(device):
    from minisgl.llm import LLM

    with pytest.raises(ValueError) as e:
        LLM(device=device)
    assert "device" in str(e.value) and repr(device) in str(e.value), (
        f"LLM(device={device!r}) should be refused naming the device, got: {e.value}"
    )


@pytest.mark.parametrize(
    "options,error,words",
    [
        ({"model": 123}, TypeError, "model must be a directory path.*int 123"),
        ({"model": None}, TypeError, "model must be a directory path"),
        ({"max_running_req": 0}, ValueError, "max_running_req must be >= 1"),
        ({"max_running_req": "4"}, TypeError, "max_running_req must be an integer"),
        ({"page_size": True}, TypeError, "page_size must be an integer"),
        ({"max_extend_tokens": True}, TypeError, "max_extend_tokens must be an integer"),
        ({"max_extend_tokens": 0}, ValueError, "max_extend_tokens must be >= 1"),
        ({"cpu_kv_tokens": 0}, ValueError, "cpu_kv_tokens must be >= 1"),
        ({"memory_ratio": 2.0}, ValueError, "memory_ratio must be a number in"),
        ({"memory_ratio": "0.5"}, ValueError, "memory_ratio must be a number in"),
        ({"seed": 1.5}, TypeError, "seed must be an integer"),
        ({"use_cuda_graph": "no"}, TypeError, "use_cuda_graph must be True, False or None"),
        ({"cache_type": "lru"}, ValueError, "cache_type must be 'radix' or 'naive'"),
        ({"overlap_scheduling": "yes"}, TypeError, "overlap_scheduling must be True"),
    ],
    ids=lambda v: str(v) if isinstance(v, dict) else None,
)
def test_an_engine_option_of_the_wrong_type_or_range_is_named(options, error, words):
    # A bool where a number goes is a mistake, not 1; "0.5" is not a ratio.
    from minisgl.llm import LLM

    with pytest.raises(error, match=words):
        LLM(**options)


def test_a_context_longer_than_the_model_allows_is_refused():
    limit = ModelConfig.from_dir(MODEL).max_position_embeddings
    build_llm(max_seq_len_override=limit)
    with pytest.raises(ValueError, match=f"max_seq_len_override={limit + 1} exceeds .*{limit}"):
        build_llm(max_seq_len_override=limit + 1)


@pytest.mark.parametrize(
    "name,value,good",
    [
        ("MINISGL_DISABLE_OVERLAP_SCHEDULING", "garbage", "off"),
        ("MINISGL_CPU_STREAMS", "lazy", "deferred"),
        ("MINISGL_ATTENTION_BACKEND", "cuda", "torch"),
        ("MINISGL_FUSED_KERNELS", "none", "0"),
    ],
)
def test_an_env_switch_accepts_only_its_documented_values(name, value, good):
    env = {**os.environ, name: value}
    proc = subprocess.run(
        [sys.executable, "-c", "import minisgl.env"], env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0 and f"{name}={value!r}: use one of" in proc.stderr, proc.stderr[
        -300:
    ]
    env[name] = good
    assert subprocess.run([sys.executable, "-c", "import minisgl.env"], env=env).returncode == 0


@pytest.mark.parametrize(
    "shape,why",
    [
        ((8, 4, 80), "head_dim 80"),
        ((8, 8, 12), "head_dim 12"),
        ((64, 2, 64), "32 query heads share a KV head"),
    ],
)
def test_a_shape_the_triton_kernels_cannot_run_falls_back_or_is_refused(
    monkeypatch, capsys, shape, why
):
    # Decided before anything runs: on a GPU, 'auto' takes the torch backend with a one-line notice,
    # and 'triton' asked for explicitly is refused naming the reason (not an assert deep in a
    # kernel).
    from minisgl.attention import select

    monkeypatch.setattr(select, "triton_available", lambda: True)
    cuda = torch.device("cuda")
    assert select.resolve_backend_name("auto", cuda, (8, 2, 128)) == "triton", (
        "a shape Triton runs keeps Triton"
    )
    assert select.resolve_backend_name("auto", cuda, shape) == "torch", (
        f"{shape}: 'auto' should fall back to torch"
    )
    notice = capsys.readouterr().err
    assert why in notice and notice.count("\n") == 1, (
        f"{shape}: expected a one-line notice naming {why!r}, got {notice!r}"
    )
    with pytest.raises(ValueError, match=why):
        select.resolve_backend_name("triton", cuda, shape)
