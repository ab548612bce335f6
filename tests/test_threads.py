"""The engine's thread policy (minisgl/utils/threads.py): what `auto` picks, that MINISGL_THREADS
overrides it, and that building an engine applies it in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from minisgl import env
from minisgl.models import BUNDLED_MODEL, ModelConfig
from minisgl.utils import threads

REPO = Path(__file__).resolve().parent.parent


def test_the_setting_takes_auto_keep_or_a_positive_count():
    assert env.THREADS.parse(None) == "auto" and env.THREADS.parse("") == "auto"
    assert env.THREADS.parse("keep") == "keep" and env.THREADS.parse(" Keep ") == "keep"
    assert env.THREADS.parse("3") == 3
    for bad in ("0", "-2", "two", "1.5"):
        with pytest.raises(env.SettingError, match="MINISGL_THREADS.*positive integer"):
            env.THREADS.parse(bad)


def test_the_readme_table_says_it_takes_a_count():
    assert "`auto` / `keep` / a positive integer" in env.markdown_table([env.THREADS])


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(env.THREADS.name, raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 8)
    return monkeypatch


def test_auto_gives_one_thread_to_small_models_and_gpu_engines(clean_env):
    small = threads.matmul_params(ModelConfig.from_dir(BUNDLED_MODEL))
    assert small < threads.LARGE_MODEL_PARAMS
    assert threads.choose_threads("cpu", small)[0] == 1
    assert threads.choose_threads("cpu", None)[0] == 1
    assert threads.choose_threads("cuda", 10 * threads.LARGE_MODEL_PARAMS)[0] == 1


def test_auto_gives_half_the_cores_to_large_models_on_a_cpu(clean_env):
    assert threads.choose_threads("cpu", threads.LARGE_MODEL_PARAMS)[0] == 4
    clean_env.setattr(threads, "usable_cores", lambda: 1)
    assert threads.choose_threads("cpu", threads.LARGE_MODEL_PARAMS)[0] == 1


def test_matmul_params_counts_the_projections_and_the_lm_head():
    cfg = SimpleNamespace(
        hidden_size=4, head_dim=2, num_heads=2, num_kv_heads=1, intermediate_size=8,
        num_layers=3, vocab_size=10,
    )  # fmt: skip
    # attention 4*2*(2*2+2*1) = 48, mlp 3*4*8 = 96, per layer 144; LM head 40
    assert threads.matmul_params(cfg) == 3 * 144 + 40


def test_an_explicit_omp_num_threads_wins_over_auto_but_not_over_the_setting(clean_env):
    clean_env.setenv("OMP_NUM_THREADS", "3")
    assert threads.choose_threads("cpu", 1)[0] is None  # torch already read it
    clean_env.setenv(env.THREADS.name, "2")
    assert threads.choose_threads("cpu", 1) == (2, "MINISGL_THREADS=2")
    clean_env.setenv(env.THREADS.name, "keep")
    assert threads.choose_threads("cpu", 1)[0] is None


CHILD = """
import json, os
import torch
from minisgl import LLM
before = torch.get_num_threads()
llm = LLM(max_running_req=2, device="cpu")
first = (torch.get_num_threads(), torch.get_num_interop_threads(), llm.engine.threads.reason)
os.environ["MINISGL_THREADS"] = "2"
llm2 = LLM(max_running_req=2, device="cpu")
second = (torch.get_num_threads(), torch.get_num_interop_threads(), llm2.engine.threads.reason)
print(json.dumps({"before": before, "first": first, "second": second,
                  "tokenizers": os.environ.get("TOKENIZERS_PARALLELISM")}))
"""


def test_building_an_llm_applies_the_policy_and_the_setting_overrides_it():
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM")
        and k != env.THREADS.name
    }
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO), environ.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=environ, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["first"] == [1, 1, "auto: small model on a CPU"], got
    # set again later: intra-op threads follow; inter-op ones can be set only once, and stay
    assert got["second"] == [2, 1, "MINISGL_THREADS=2"], got
    assert got["tokenizers"] == "false"
