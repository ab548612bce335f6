"""Chapter 18: CUDA graphs for decode (minisgl/engine/graph.py).

On a CPU the engine asked for graphs (`use_cuda_graph=True`) captures emulated ones
(minisgl/engine/graph_emulation.py): a replay re-runs the captured operators on the static buffers
and nothing else, so a buffer not refreshed before a replay gives wrong logits and tokens here as on
a GPU. With `--device cuda` the same tests run real CUDA graphs.
"""

from __future__ import annotations

import re

import pytest
import torch

from helpers import assert_tokens_equal, build_llm, greedy, prompt_ids
from minisgl.attention import AttentionMetadata
from minisgl.core import Batch
from minisgl.engine.graph import graph_batch_sizes
from minisgl.engine.graph_emulation import EmulatedGraph, capture
from refusals import refuses

MAX_BS = 4  # graphs of 1, 2 and 4 requests
STEPS = 10  # tokens per request in the generation tests: 1 from prefill, 9 decode steps


@pytest.fixture(scope="module")
def graph_llm():
    return build_llm(use_cuda_graph=True, cuda_graph_max_bs=MAX_BS)


@pytest.fixture(scope="module")
def eager_llm():
    return build_llm(use_cuda_graph=False)


@pytest.fixture
def graph_engine():
    """An engine of its own: the tests below fill its KV cache with noise."""
    engine = build_llm(use_cuda_graph=True, cuda_graph_max_bs=MAX_BS).engine
    torch.manual_seed(0)
    engine.kv_cache.buffer.normal_()
    return engine


def fake_batch(rows, lens=None, phase="decode", meta=True, with_rows=True) -> Batch:
    """A batch of len(rows) requests for graph_size: only its phase, size and metadata matter."""
    batch = Batch(reqs=[None] * len(rows), phase=phase)
    if meta:
        n = len(rows)
        batch.attn_metadata = AttentionMetadata(
            cu_seqlens_q=torch.arange(n + 1, dtype=torch.int32),
            cache_seqlens=torch.tensor(lens or [1] * n, dtype=torch.int32),
            page_table=torch.zeros(n, 1, dtype=torch.int32),
            last_indices=torch.arange(n),
            max_seqlen_q=1,
            max_seqlen_k=1,
            rows=torch.tensor(rows) if with_rows else None,
        )
    return batch


def decode_batch(engine, rows, lens, seed: int) -> Batch:
    """A real decode batch on `engine`: request i owns table row rows[i], holds lens[i] keys at
    locations rows[i] * 64 + 0..lens[i]-1, and computes its token at position lens[i] - 1."""
    dev, g = engine.device, torch.Generator().manual_seed(seed)
    for r, n in zip(rows, lens):
        engine.page_table[r, :n] = torch.arange(n, dtype=torch.int32, device=dev) + r * 64
    n = len(rows)
    rows_t = torch.tensor(rows, dtype=torch.int64, device=dev)
    batch = Batch(reqs=[None] * n, phase="decode")
    batch.input_ids = torch.randint(0, 300, (n,), generator=g, dtype=torch.int32).to(dev)
    batch.positions = torch.tensor([x - 1 for x in lens], dtype=torch.int64, device=dev)
    batch.out_loc = torch.tensor([r * 64 + x - 1 for r, x in zip(rows, lens)], device=dev)
    batch.attn_metadata = AttentionMetadata(
        cu_seqlens_q=torch.arange(n + 1, dtype=torch.int32, device=dev),
        cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=dev),
        page_table=engine.page_table[rows_t, : max(lens)],
        last_indices=torch.arange(n, device=dev),
        max_seqlen_q=1,
        max_seqlen_k=max(lens),
        rows=rows_t,
        cu_seqlens_q_host=list(range(n + 1)),
        cache_seqlens_host=list(lens),
    )
    return batch


def generated(llm, n: int):
    """Greedy tokens of the first n test prompts (repeated past four). A step that raises ends its
    requests with an error reply (the engine goes on); it is raised here again, so that an exercise
    not written yet reads as such."""
    outputs = llm.generate((prompt_ids() * 2)[:n], greedy(STEPS))
    for out in outputs:
        error = out.get("error")
        if error is None:
            continue
        stub = re.search(r"NotImplementedError: (ch18\.\w+: .*)", error)
        if stub:
            raise NotImplementedError(stub.group(1))
        pytest.fail(f"a step failed: {error}")
    return [o["token_ids"] for o in outputs]


def captured_size(engine, n: int) -> int:
    return next(s for s in engine.graph_runner.sizes if s >= n)


@torch.inference_mode()
def replayed(engine, batch: Batch) -> torch.Tensor:
    logits = engine.graph_runner.replay(batch, captured_size(engine, batch.size)).clone()
    engine.synchronize()
    if engine.kit.is_cuda:
        torch.cuda.synchronize()
    return logits


@torch.inference_mode()
def eager(engine, batch: Batch) -> torch.Tensor:
    with engine.ctx.forward_batch(batch):
        return engine.model.forward().clone()


# A step of four requests, then one of three (padded to four) that differs in every input: rows,
# lengths, positions, tokens and KV locations.
STEP_A = dict(rows=[4, 5, 6, 7], lens=[30, 41, 17, 25], seed=1)
STEP_B = dict(rows=[1, 0, 3], lens=[12, 50, 33], seed=2)


# ---------------------------------------------------------------- the emulated graph


def test_an_emulated_graph_replays_its_captured_work_on_the_static_buffers():
    x, w = torch.ones(3), torch.randn(3, 3)
    cache, loc = torch.zeros(5, 3), torch.tensor([1, 2, 3])
    graph = EmulatedGraph()
    with capture(graph):
        y = (x @ w).relu()
        cache[loc] = y.expand(3, 3)
    x.copy_(torch.tensor([1.0, -2.0, 3.0]))
    loc.copy_(torch.tensor([0, 2, 4]))
    graph.replay()
    torch.testing.assert_close(y, (x @ w).relu())  # the same tensor, recomputed in place
    torch.testing.assert_close(cache[[0, 2, 4]], y.expand(3, 3))  # written where loc says now


def test_a_new_tensor_or_a_changed_host_value_never_reaches_a_replay():
    x, scale = torch.ones(2), 3.0
    graph = EmulatedGraph()
    with capture(graph):
        y = x * scale
    x = torch.full((2,), 5.0)  # a new tensor under the old name: the graph still reads the old one
    scale = 10.0  # noqa: F841 (a host value, frozen at capture)
    graph.replay()
    assert y.tolist() == [3.0, 3.0]


def test_capture_refuses_a_host_read_and_replay_refuses_a_new_shape():
    graph = EmulatedGraph()
    with refuses(RuntimeError, "a capture that reads a value on the host (.item())", match="host"):
        with capture(graph):
            torch.ones(2).sum().item()
    mask, graph = torch.tensor([True, False]), EmulatedGraph()
    with capture(graph):
        torch.arange(2)[mask]  # boolean indexing: its shape depends on the mask's values
    mask.fill_(True)
    with refuses(RuntimeError, "replay after a mask changed a shape", match="shapes are fixed"):
        graph.replay()


def test_a_cpu_engine_has_no_graphs_unless_asked():
    assert build_llm(device="cpu").engine.graph_runner is None


# ---------------------------------------------------------------- capture (reference code)


def test_graphs_of_doubling_sizes_captured_largest_first_in_one_pool(graph_llm):
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(5) == [1, 2, 4, 5]
    runner = graph_llm.engine.graph_runner
    assert runner.sizes == [1, 2, 4]
    assert runner.captured == [4, 2, 1]
    pools = {
        id(g.pool()) if isinstance(g, EmulatedGraph) else g.pool()
        for g, _ in runner.graphs.values()
    }
    assert len(pools) == 1, "every graph shares the first (largest) graph's memory pool"


# ---------------------------------------------------------------- graph_size


def test_a_batch_replays_from_the_smallest_captured_size_that_holds_it(graph_llm):
    runner = graph_llm.engine.graph_runner
    want = {1: 1, 2: 2, 3: 4, 4: 4, 5: None}
    got = {n: runner.graph_size(fake_batch(list(range(n)))) for n in want}
    assert got == want, f"graph size by batch size: expected {want}, got {got}"


def test_a_batch_replays_from_the_smallest_size_when_the_largest_is_not_a_power_of_two(graph_llm):
    # cuda_graph_max_bs = 6 (at most max_running_req, which need not be a power of two): sizes
    # 1, 2, 4, 6; graph_size reads the sizes and max_bs (or the graphs' keys, or the captured
    # list), so a runner whose graphs were never captured
    runner = object.__new__(type(graph_llm.engine.graph_runner))
    runner.sizes, runner.max_bs = graph_batch_sizes(6), 6
    runner.graphs, runner.captured = dict.fromkeys(runner.sizes), runner.sizes[::-1]
    want = {1: 1, 2: 2, 3: 4, 4: 4, 5: 6, 6: 6, 7: None}
    got = {n: runner.graph_size(fake_batch(list(range(n)))) for n in want}
    assert got == want, f"graphs of {runner.sizes}: expected {want}, got {got}"


def test_prefill_and_batches_without_rows_get_no_graph(graph_llm):
    runner = graph_llm.engine.graph_runner
    cases = {
        "a prefill batch": fake_batch([0], phase="prefill"),
        "a batch without metadata": fake_batch([0], meta=False),
        "metadata without rows": fake_batch([0, 1], with_rows=False),
    }
    for what, batch in cases.items():
        size = runner.graph_size(batch)
        assert size is None, f"{what} must run eagerly, got graph size {size}"


@pytest.mark.parametrize("n", range(1, MAX_BS + 1))
def test_each_decode_step_replays_and_prefill_never_does(graph_llm, n):
    runner = graph_llm.engine.graph_runner
    before = runner.replays
    generated(graph_llm, n)
    want = STEPS - 1  # one replay per decode step, none for the prefill that gave the first token
    assert runner.replays - before == want, (
        f"{n} requests, {STEPS} tokens each: expected {want} replays, got {runner.replays - before}"
    )


def test_a_batch_larger_than_every_graph_runs_eagerly_with_eager_tokens(eager_llm):
    # An engine of its own: the shared one's prefix cache holds KV that earlier tests' replays
    # wrote, so a wrong replay would fail this test, which judges graph_size.
    llm = build_llm(use_cuda_graph=True, cuda_graph_max_bs=MAX_BS)
    runner = llm.engine.graph_runner
    before = runner.replays
    got = generated(llm, MAX_BS + 1)
    assert runner.replays == before, (
        f"{MAX_BS + 1} requests replayed {runner.replays - before} steps"
    )
    assert_tokens_equal(got, generated(eager_llm, MAX_BS + 1), f"{MAX_BS + 1} requests, eager")


# ---------------------------------------------------------------- replay


@pytest.mark.parametrize("n", range(1, MAX_BS + 1))
def test_greedy_tokens_through_graphs_equal_eager_tokens(graph_llm, eager_llm, n):
    got, want = generated(graph_llm, n), generated(eager_llm, n)
    assert_tokens_equal(got, want, f"{n} requests through graphs")


def assert_logits_equal(got, want, what: str) -> None:
    assert got.shape == want.shape, (
        f"{what}: logits of shape {tuple(got.shape)}, expected {tuple(want.shape)} (one row per "
        "request of the batch)"
    )
    diff = (got - want).abs()
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), (
        f"{what}: logits differ from the eager step's (largest difference "
        f"{diff.max().item():.3g} in request {int(diff.amax(-1).argmax())}): a static buffer kept "
        "the previous batch's values"
    )


def assert_kv_equal(got, want, what: str) -> None:
    """`got`, `want`: [k/v, layers, locations, heads, head_dim] views of the flat KV cache."""
    off = ~torch.isclose(got, want, rtol=1e-4, atol=1e-4)
    locs = off.flatten(3).any(-1).any(0).any(0).nonzero().flatten().tolist()
    assert not locs, (
        f"{what} wrote KV where the eager step did not: at location(s) {locs[:6]} (largest "
        f"difference {(got - want).abs().max().item():.3g}): a padding slot's out_loc, or a "
        "request's, left as the previous batch had it"
    )


def test_replay_equals_eager_after_another_batch_left_every_buffer_different(graph_engine):
    engine, flat = graph_engine, graph_engine.kv_cache._flat
    scratch = engine.graph_runner._dummy["out_loc"]
    noise = engine.kv_cache.buffer.clone()
    replayed(engine, decode_batch(engine, **STEP_A))
    engine.kv_cache.buffer.copy_(noise)
    batch = decode_batch(engine, **STEP_B)
    got = replayed(engine, batch)
    kv_graph = flat[:, :, :scratch].clone()
    engine.kv_cache.buffer.copy_(noise)
    want = eager(engine, batch)
    assert_logits_equal(got, want, "a batch of 3 in the graph of 4 after a batch of 4")
    assert_kv_equal(kv_graph, flat[:, :, :scratch], "the replay")


def test_a_padding_slot_writes_only_the_scratch_location(graph_engine):
    engine, flat = graph_engine, graph_engine.kv_cache._flat
    scratch = engine.graph_runner._dummy["out_loc"]
    replayed(engine, decode_batch(engine, **STEP_A))
    # Request 4 of step A is gone; its last location now belongs to someone else.
    gone = STEP_A["rows"][3] * 64 + STEP_A["lens"][3] - 1
    flat[:, :, gone] = 7.0
    flat[:, :, scratch] = 7.0
    replayed(engine, decode_batch(engine, **STEP_B))  # three requests in the graph of four
    assert bool((flat[:, :, gone] == 7.0).all()), (
        "the padding slot wrote KV at a location of a request of the previous step"
    )
    assert not bool((flat[:, :, scratch] == 7.0).all()), "the padding slot never wrote the scratch"


def test_every_padding_slot_of_every_buffer_holds_the_dummy_request():
    # graphs of 1, 2, 4 and 8: a step of eight requests fills every slot, then a step of five runs
    # in the graph of 8 with three padding slots, each holding one of the first step's requests
    engine = build_llm(use_cuda_graph=True, cuda_graph_max_bs=8).engine
    runner, flat = engine.graph_runner, engine.kv_cache._flat
    torch.manual_seed(0)
    engine.kv_cache.buffer.normal_()
    step_a = dict(rows=list(range(8)), lens=[30, 41, 17, 25, 12, 50, 33, 21], seed=4)
    replayed(engine, decode_batch(engine, **step_a))
    gone = [r * 64 + n - 1 for r, n in zip(step_a["rows"][5:], step_a["lens"][5:])]
    flat[:, :, gone] = 7.0  # the last three requests of step A are gone: their locations reused
    replayed(engine, decode_batch(engine, rows=[2, 0, 7, 5, 1], lens=[9, 44, 28, 16, 35], seed=5))
    stale = {
        name: getattr(runner, name)[5:8].tolist()
        for name, value in runner._dummy.items()
        if bool((getattr(runner, name)[5:8] != value).any())
    }
    assert not stale, (
        f"after a batch of 5 in the graph of 8, slots 5..7 of every buffer must hold the dummy "
        f"request {runner._dummy}; they hold {stale}"
    )
    written = [loc for loc in gone if not bool((flat[:, :, loc] == 7.0).all())]
    assert not written, (
        f"a batch of 5 in the graph of 8 wrote KV at location(s) {written} of requests of the "
        "previous step (a padding slot that kept one of them)"
    )
