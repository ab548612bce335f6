"""Chapter 16: tensor parallelism's three pieces that put the ranks' partial results together.

- `RowParallelLinear.forward` (minisgl/layers/parallel.py): each rank's columns give a partial sum,
  one all-reduce adds them, the bias is added once, after it;
- `lookup_own_rows` (same file): a rank's part of the embedding, zeros for the ids it does not own;
- `Collectives.all_gather` (minisgl/distributed/comm.py): every rank's logits joined along the
  vocabulary, rank 0's first, for a batch of several rows (mini-sglang #98).

The layer tests run the function on every rank of a real gloo group of forked processes
(classroom/ranks.py), so the code under test runs in each rank, and a rank that hangs is named
and killed after RANK_TIMEOUT_S. The engine tests run `LLM(tp_size=2)`, whose ranks are spawned
and run the judge's swap through MINISGL_SERVER_INIT; MINISGL_TP_TIMEOUT makes a collective that
another rank never reaches fail in seconds, naming the rank that waited.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from checkpoints import checkpoint
from classroom.ranks import run_ranks
from helpers import MODEL, assert_tokens_equal, build_llm, greedy, hf_greedy, prompt_ids
from minisgl.distributed import SINGLE, Collectives
from minisgl.layers.parallel import RowParallelLinear, lookup_own_rows
from minisgl.models.sharding import vocab_rows

RANK_TIMEOUT_S = 10.0  # a group of 2 to 4 ranks does its work in well under a second
TP_TIMEOUT_S = "10"  # MINISGL_TP_TIMEOUT for the engine's ranks: a step takes milliseconds


def _row_parallel(comm, weight, bias, x):
    """On one rank: its columns of `weight` and of `x` through RowParallelLinear."""
    n, r = comm.size, comm.rank
    cols = weight.shape[1] // n
    op = RowParallelLinear(cols, weight.shape[0], bias is not None, weight.dtype, "cpu", comm)
    op.weight = weight[:, r * cols : (r + 1) * cols].clone()
    if bias is not None:
        op.bias = bias.clone()
    return op.forward(x[..., r * cols : (r + 1) * cols].clone())


def _tensors(*shapes, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(dtype) for s in shapes]


# ---------------------------------------------------------------- RowParallelLinear.forward


@pytest.mark.parametrize("ranks", [2, 4])
def test_row_parallel_linear_equals_the_whole_linear_on_every_rank(ranks):
    weight, bias, x = _tensors((24, 32), (24,), (5, 32))
    want = F.linear(x, weight, bias)
    got = run_ranks(ranks, _row_parallel, weight, bias, x, timeout_s=RANK_TIMEOUT_S)
    for r, y in enumerate(got):
        assert y.shape == want.shape, (
            f"rank {r}: shape {tuple(y.shape)}, expected {tuple(want.shape)}"
        )
        diff = float((y - want).abs().max())
        assert diff < 1e-5, f"rank {r}: differs from the whole linear layer by {diff:.3g}"


def test_row_parallel_bias_is_added_once_after_the_sum():
    weight = torch.zeros(8, 16)
    bias = torch.arange(8, dtype=torch.float32)
    x = torch.randn(3, 16)
    for ranks in (2, 4):
        got = run_ranks(ranks, _row_parallel, weight, bias, x, timeout_s=RANK_TIMEOUT_S)
        for r, y in enumerate(got):
            assert torch.equal(y, bias.expand(3, 8)), (
                f"{ranks} ranks, rank {r}: a zero weight must give the bias alone, got row 0 "
                f"{y[0].tolist()} for the bias {bias.tolist()}"
            )


def test_row_parallel_without_bias_and_for_one_row():
    weight, x = _tensors((12, 16), (1, 16), seed=3)
    got = run_ranks(2, _row_parallel, weight, None, x, timeout_s=RANK_TIMEOUT_S)
    want = F.linear(x, weight)
    for r, y in enumerate(got):
        shape = tuple(y.shape)
        assert y.shape == want.shape, (
            f"rank {r}: one row, no bias: shape {shape}, expected {tuple(want.shape)}"
        )
        diff = float((y - want).abs().max())
        assert diff < 1e-5, (
            f"rank {r}: one row, no bias: differs from x W^T (the sum of the ranks' partial "
            f"products) by {diff:.3g}"
        )


def _row_parallel_counted(comm, weight, bias, x):
    y = _row_parallel(comm, weight, bias, x)
    return y, comm.counts["all_reduce"]


def test_row_parallel_makes_one_all_reduce_through_the_groups_collectives():
    weight, bias, x = _tensors((8, 16), (8,), (3, 16), seed=4)
    want = F.linear(x, weight, bias)
    for r, (y, count) in enumerate(
        run_ranks(2, _row_parallel_counted, weight, bias, x, timeout_s=RANK_TIMEOUT_S)
    ):
        diff = float((y - want).abs().max())
        assert diff < 1e-5, f"rank {r}: differs from the whole linear layer by {diff:.3g}"
        assert count == 1, (
            f"rank {r}: Collectives.counts['all_reduce'] is {count} after one forward, expected 1 "
            "(one all-reduce, through self._comm)"
        )


# ---------------------------------------------------------------- lookup_own_rows


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_ranks_lookups_add_up_to_the_whole_embedding_with_a_padded_vocabulary(ranks):
    vocab, hidden = 257, 6  # no rank count divides it: the last rank's rows end in padding
    (table,) = _tensors((vocab, hidden), seed=1)
    per = vocab_rows(vocab, ranks)
    padded = torch.cat([table, torch.zeros(per * ranks - vocab, hidden)])
    ids = torch.tensor([0, 1, per - 1, per, per + 1, min(2 * per, vocab) - 1, vocab - 1, 5, 5, 200])
    given = ids.clone()
    parts = []
    for r in range(ranks):
        parts.append(lookup_own_rows(ids, padded[r * per : (r + 1) * per], r * per))
        assert torch.equal(ids, given), (
            f"rank {r}'s lookup (start {r * per}) changed the ids it was given: "
            f"{given.tolist()} became {ids.tolist()}; every rank looks up the same ids, so "
            "lookup_own_rows must leave them as they are"
        )
    for r, part in enumerate(parts):
        assert part.shape == (len(ids), hidden), f"rank {r}: shape {tuple(part.shape)}"
    total = torch.stack(parts).sum(0)
    assert torch.equal(total, table[ids]), "the sum of the ranks' lookups is not the embedding"


def test_an_id_another_rank_owns_looks_up_zeros():
    weight = torch.arange(1, 13, dtype=torch.float32).reshape(4, 3)  # no zero row anywhere
    ids = torch.tensor([3, 4, 7, 8, 11, 0])
    got = lookup_own_rows(ids, weight, 4)  # this rank owns ids 4..7
    want = torch.zeros(6, 3)
    want[1], want[2] = weight[0], weight[3]
    assert torch.equal(got, want), (
        f"rows owned by this rank (ids 4 and 7) are its own, all others zero: got {got.tolist()}"
    )


def test_lookup_keeps_the_weights_dtype_and_the_ids_shape():
    weight = torch.randn(8, 4).to(torch.bfloat16)
    ids = torch.tensor([[1, 9], [15, 8]])
    got = lookup_own_rows(ids, weight, 8)
    assert got.dtype == torch.bfloat16 and got.shape == (2, 2, 4), (
        f"dtype {got.dtype}, expected torch.bfloat16 (the weight's); shape {tuple(got.shape)}, "
        "expected (2, 2, 4) (the ids' [2, 2], then hidden 4)"
    )
    assert torch.equal(got[0, 1], weight[1]) and not got[0, 0].any(), (
        f"ids [[1, 9], ...] with this rank's rows starting at 8: id 9 should get row 1 and id 1 "
        f"zeros, got {got[0].float().tolist()}"
    )


def test_lookup_runs_in_every_rank_of_a_group():
    (table,) = _tensors((16, 4), seed=2)
    ids = torch.tensor([0, 7, 8, 15, 3])

    def embed(comm):
        rows = 16 // comm.size
        own = table[comm.rank * rows : (comm.rank + 1) * rows]
        return comm.all_reduce(lookup_own_rows(ids, own, comm.rank * rows))

    for r, y in enumerate(run_ranks(2, embed, timeout_s=RANK_TIMEOUT_S)):
        assert torch.equal(y, table[ids]), f"rank {r}: the all-reduced lookup is not the embedding"


# ---------------------------------------------------------------- Collectives.all_gather


def _gather(comm, batch, cols, dim):
    x = torch.arange(batch * cols, dtype=torch.float32).reshape(batch, cols) + 100 * comm.rank
    return comm.all_gather(x, dim=dim)


@pytest.mark.parametrize("ranks", [2, 4])
def test_all_gather_joins_each_rows_pieces_in_rank_order_for_a_batch(ranks):
    batch, cols = 3, 5  # mini-sglang #98: a flat gather reshaped to [batch, -1] mixes the rows
    pieces = [torch.arange(batch * cols).reshape(batch, cols) + 100 * r for r in range(ranks)]
    want = torch.cat(pieces, dim=-1).float()
    for r, y in enumerate(run_ranks(ranks, _gather, batch, cols, -1, timeout_s=RANK_TIMEOUT_S)):
        assert y.shape == want.shape, (
            f"rank {r}: shape {tuple(y.shape)}, expected {tuple(want.shape)}"
        )
        assert torch.equal(y, want), (
            f"rank {r}: row 0 is {y[0].tolist()}, expected rank 0's row 0 then rank 1's ..."
        )


def test_all_gather_along_the_first_dimension():
    want = torch.cat([torch.arange(4.0).reshape(2, 2) + 100 * r for r in range(2)], dim=0)
    for r, y in enumerate(run_ranks(2, _gather, 2, 2, 0, timeout_s=RANK_TIMEOUT_S)):
        assert torch.equal(y, want), f"rank {r}: gathered along dim 0: {y.tolist()}"


def _gather_transposed(comm):
    """A piece that is not contiguous (a transposed view), and the gather's own count."""
    x = (torch.arange(6.0).reshape(2, 3) + 100 * comm.rank).t()
    return comm.all_gather(x, dim=-1), comm.counts["all_gather"]


def test_all_gather_of_a_non_contiguous_piece_is_counted_once():
    want = torch.cat([(torch.arange(6.0).reshape(2, 3) + 100 * r).t() for r in range(2)], dim=-1)
    for r, (y, count) in enumerate(run_ranks(2, _gather_transposed, timeout_s=RANK_TIMEOUT_S)):
        assert torch.equal(y, want), f"rank {r}: a transposed piece gathered as {y.tolist()}"
        assert count == 1, f"rank {r}: Collectives.counts['all_gather'] is {count} after one gather"


def _gather_bfloat16(comm):
    x = (torch.arange(6.0).reshape(2, 3) + 100 * comm.rank).to(torch.bfloat16)
    return comm.all_gather(x, dim=-1)


def test_all_gather_keeps_the_pieces_dtype():
    want = torch.cat([torch.arange(6.0).reshape(2, 3) + 100 * r for r in range(2)], dim=-1)
    for r, y in enumerate(run_ranks(2, _gather_bfloat16, timeout_s=RANK_TIMEOUT_S)):
        assert y.dtype == torch.bfloat16, (
            f"rank {r}: bfloat16 pieces gathered as {y.dtype}, "
            "expected bfloat16 (the pieces' dtype)"
        )
        assert torch.equal(y.float(), want), f"rank {r}: bfloat16 pieces gathered as {y.tolist()}"


def test_all_gather_of_one_rank_is_its_input_without_a_group():
    x = torch.randn(2, 3)
    assert torch.equal(SINGLE.all_gather(x, dim=-1), x)
    assert Collectives().all_gather(x).shape == (2, 3)


# ---------------------------------------------------------------- through the engine


@pytest.fixture(scope="module")
def biased_checkpoint(tmp_path_factory):
    """qwen3-head32-kv1-bias with random biases (transformers starts them at zero, which would
    hide a bias added on every rank): one KV head, fewer than the ranks. Returns the directory and
    transformers' model of it."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint("qwen3-head32-kv1-bias"), dtype=torch.float32
    ).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    path = tmp_path_factory.mktemp("biased") / "qwen3-kv1-random-bias"
    model.save_pretrained(path)
    return path, model


def _hf_greedy_of(model, prompts, new_tokens):
    outs = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            for _ in range(new_tokens):
                x = torch.cat([x, model(x).logits[0, -1].argmax().view(1, 1)], dim=1)
            outs.append(x[0, len(ids) :].tolist())
    return outs


@pytest.mark.parametrize("model", ["bundled", "biased-kv1", "qwen3-vocab257-untied"], ids=str)
def test_tp2_engine_gives_transformers_greedy_tokens(model, monkeypatch, request):
    """A batch of several prompts (the gathered logits must keep their rows apart), an attention
    with random biases (added once) and one KV head, and a vocabulary of 257 (padded)."""
    monkeypatch.setenv("MINISGL_TP_TIMEOUT", TP_TIMEOUT_S)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 256, (24,), generator=g).tolist()
    prompts = [ids[:5], ids[5:24], ids[5:17] + ids[:3]]
    if model == "bundled":
        path, prompts = MODEL, prompt_ids()
        want = hf_greedy(prompts, 8, model=path)
    elif model == "biased-kv1":
        path, hf = request.getfixturevalue("biased_checkpoint")
        want = _hf_greedy_of(hf, prompts, 8)
    else:
        path = checkpoint(model)
        want = hf_greedy(prompts, 8, model=path)
    llm = build_llm(path, tp_size=2, device="cpu")
    try:
        got = [o["token_ids"] for o in llm.generate(prompts, greedy(8))]
    finally:
        llm.shutdown()
    assert_tokens_equal(got, want, f"TP=2 on {model}, against transformers")
