"""The engine's context length sizes every table indexed by position, never the model's limit.

A config may say `max_position_embeddings` 131,072 (Llama 3.1) or 2**31 - 1 (transformers loads
it). The context length is `max_seq_len_override` when set, else the model's limit capped at what
the KV pool holds (minisgl/engine/context.py); the page table, the token pool and RoPE's cos/sin
table are that long, and a GPU's pool leaves room for them.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from checkpoints import checkpoint
from helpers import assert_tokens_equal, greedy, hf_greedy
from minisgl.engine import EngineConfig
from minisgl.engine.context import plan_pool, table_bytes_per_position
from minisgl.kvcache import KVCache
from minisgl.llm import LLM
from minisgl.models import ModelConfig

PROMPTS = [[5, 17, 3, 99, 42], [7] * 12]


def with_limit(tmp_path, limit: int):
    model = tmp_path / f"limit-{limit}"
    shutil.copytree(checkpoint("llama"), model)
    raw = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**raw, "max_position_embeddings": limit}))
    return model


def tables_of(llm: LLM):
    rot = llm.engine.model.model._rotary
    return {
        "page table": llm.engine.page_table.shape[1],
        "token pool": llm.engine.token_pool.shape[1],
        "RoPE cos": rot._cos.shape[0],
        "RoPE sin": rot._sin.shape[0],
    }


@pytest.mark.parametrize("limit", [2**31 - 1, 131072], ids=["2**31-1", "131072"])
def test_a_huge_position_limit_loads_with_tables_sized_by_the_context_length(tmp_path, limit):
    model = with_limit(tmp_path, limit)
    llm = LLM(model, device="cpu", dtype=torch.float32, cpu_kv_tokens=4096, max_running_req=4)
    assert llm.engine.max_seq_len == 4096, (
        f"max_position_embeddings {limit}, a pool of 4096 tokens: the context length should be "
        f"4096 (no request can be longer), got {llm.engine.max_seq_len}"
    )
    assert set(tables_of(llm).values()) == {4096}, (
        f"every table indexed by position should be as long as the context length (4096), got "
        f"{tables_of(llm)}"
    )
    got = [o["token_ids"] for o in llm.generate(PROMPTS, greedy(8))]
    want = hf_greedy(PROMPTS, 8, model=checkpoint("llama"))
    assert_tokens_equal(got, want, f"max_position_embeddings {limit}")
    too_long = llm.engine.max_seq_len - 4
    with pytest.raises(ValueError, match="context length 4096"):
        llm.generate([[5] * too_long], greedy(8))


def test_the_context_length_is_the_model_limit_when_the_pool_holds_more(tmp_path):
    model = with_limit(tmp_path, 300)
    llm = LLM(model, device="cpu", dtype=torch.float32, cpu_kv_tokens=4096, max_running_req=2)
    assert llm.engine.max_seq_len == 300 and set(tables_of(llm).values()) == {300}, (
        f"a model limit of 300 under a 4096-token pool: context 300, got "
        f"{llm.engine.max_seq_len}, tables {tables_of(llm)}"
    )


def test_max_seq_len_override_sets_the_context_length(tmp_path):
    model = with_limit(tmp_path, 2**31 - 1)
    llm = LLM(model, device="cpu", cpu_kv_tokens=64, max_seq_len_override=1000, max_running_req=2)
    assert llm.engine.max_seq_len == 1000 and set(tables_of(llm).values()) == {1000}, (
        f"max_seq_len_override=1000: context 1000, got {llm.engine.max_seq_len}, "
        f"tables {tables_of(llm)}"
    )


def test_a_gpu_pool_leaves_room_for_the_tables():
    # plan_pool with a GPU's free memory, no GPU needed: pool + tables fit the memory share.
    cfg = ModelConfig.from_dir(checkpoint("llama"))
    free = 2 * 2**30
    for limit in (2**31 - 1, 131072, 256):
        model = ModelConfig(**{**cfg.__dict__, "max_position_embeddings": limit})
        for override in (None, 256):
            config = EngineConfig(
                model_path=".", max_seq_len_override=override, memory_ratio=0.5, page_size=4
            )
            plan = plan_pool(config, model, torch.bfloat16, free)
            per_page = KVCache.bytes_per_page(
                model.num_layers, 4, model.num_kv_heads, model.head_dim, torch.bfloat16
            )
            used = plan.num_pages * per_page + plan.max_seq_len * table_bytes_per_position(
                config, model
            )
            expect = override or min(limit, plan.num_pages * 4)
            assert plan.max_seq_len == expect, (
                f"limit {limit}, override {override}: context {plan.max_seq_len}, want {expect}"
            )
            assert 0.95 * free * 0.5 < used <= free * 0.5, (
                f"limit {limit}, override {override}: the pool and tables take {used:,} bytes "
                f"of a {free * 0.5:,.0f}-byte share"
            )


@pytest.mark.gpu
def test_a_huge_position_limit_on_a_gpu_fits_the_memory_share(tmp_path):
    # The pool takes a share of free memory and the tables come out of the same share: with a
    # limit of 2**31 - 1 the context length is what the pool holds, and nothing outgrows the share.
    model = with_limit(tmp_path, 2**31 - 1)
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    # this process's own allocations: other processes on the GPU (pytest -n) move its free memory
    reserved_before = torch.cuda.memory_reserved()
    llm = LLM(model, device="cuda", dtype=torch.float32, memory_ratio=0.02, max_running_req=4)
    engine = llm.engine
    assert engine.max_seq_len == engine.num_pages * engine.page_size, (
        f"context {engine.max_seq_len}, pool {engine.num_pages * engine.page_size} tokens"
    )
    assert set(tables_of(llm).values()) == {engine.max_seq_len}, tables_of(llm)
    used = torch.cuda.memory_reserved() - reserved_before
    assert used < 0.02 * free_before + 2**28, (
        f"the engine took {used:,} bytes, more than its share of {0.02 * free_before:,.0f} "
        "(plus room for the weights and kernels)"
    )
    got = [o["token_ids"] for o in llm.generate(PROMPTS, greedy(8))]
    assert_tokens_equal(got, hf_greedy(PROMPTS, 8, model=checkpoint("llama")), "on a GPU")
