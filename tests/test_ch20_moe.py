"""Chapter 20: a mixture-of-experts MLP (minisgl/kernel/moe.py), judged against transformers'
Qwen3-MoE router and experts, and through the engine on a small random Qwen3-MoE checkpoint that
transformers wrote (tests/checkpoints.py).
"""

from __future__ import annotations

import re

import pytest
import torch

from checkpoints import checkpoint
from classroom.experts import Products  # what the try-out counts, the tests count
from contract_types import assert_dtype
from helpers import assert_tensors_close, assert_tokens_equal, build_llm, greedy, hf_greedy
from minisgl.kernel.moe import group_by_expert, moe_experts, route

HIDDEN, INTER, EXPERTS = 64, 32, 8


def hf_block(norm: bool, top_k: int = 2, experts: int = EXPERTS, seed: int = 0):
    """transformers' sparse MoE block with random weights, and the same weights stacked as the
    engine keeps them: (block, router weight, gate_up, down)."""
    import transformers
    from transformers.models.qwen3_moe import modeling_qwen3_moe as hf

    cfg = transformers.Qwen3MoeConfig(
        hidden_size=HIDDEN,
        moe_intermediate_size=INTER,
        num_experts=experts,
        num_experts_per_tok=top_k,
        norm_topk_prob=norm,
    )
    torch.manual_seed(seed)
    block = hf.Qwen3MoeSparseMoeBlock(cfg).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
    ex = block.experts
    if hasattr(ex, "gate_up_proj"):  # transformers 5: stacked already
        gate_up, down = ex.gate_up_proj.data, ex.down_proj.data
    else:  # transformers 4: one module per expert
        gate_up = torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight]) for e in ex])
        down = torch.stack([e.down_proj.weight for e in ex])
    return block, block.gate.weight.data, gate_up, down


def hf_output(block, x):
    with torch.no_grad():
        out = block(x[None])
    return (out[0] if isinstance(out, tuple) else out)[0]


def tokens(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(seed))


def logits(n: int, experts: int = EXPERTS, seed: int = 3) -> torch.Tensor:
    return torch.randn(n, experts, generator=torch.Generator().manual_seed(seed)) * 2


def assert_close(got, want, what: str, atol: float = 1e-5, rtol: float = 1.3e-6) -> None:
    assert_tensors_close(got, want, what, atol, rtol)  # torch.testing's tolerances for float32


# ---------------------------------------------------------------- route


@pytest.mark.parametrize("norm", [True, False], ids=["renormalised", "not-renormalised"])
def test_route_chooses_what_transformers_router_chooses(norm):
    block, router, _, _ = hf_block(norm)
    x = tokens(17)
    with torch.no_grad():
        out = block.gate(x)
    hf_weights, hf_ids = out[1], out[2]
    weights, ids = route(x @ router.t(), 2, norm)
    assert torch.equal(ids, hf_ids), (
        f"the experts transformers' router chooses (norm_topk_prob={norm}): expected "
        f"{hf_ids.tolist()[:3]}..., got {ids.tolist()[:3]}..."
    )
    assert_close(
        weights,
        hf_weights.float(),
        f"the weights of transformers' router (norm_topk_prob={norm})",
        atol=1e-6,
        rtol=1e-6,
    )


def test_route_weights_are_probabilities_over_all_experts():
    # Without renormalisation a token's weights are the softmax over all 8 experts, so the two
    # chosen sum to less than 1; a softmax over just the chosen two would sum to exactly 1.
    lg = logits(9)
    weights, ids = route(lg, 2, False)
    want = torch.softmax(lg, dim=-1).gather(1, ids)
    assert_close(
        weights, want, "without renormalisation a weight is its softmax over all 8 experts"
    )
    sums = weights.sum(-1)
    assert (sums < 1 - 1e-3).all(), (
        f"without renormalisation the top-2 of 8 probabilities sum below 1; got row sums "
        f"{[round(v, 4) for v in sums.tolist()]}"
    )


def test_route_renormalised_weights_sum_to_one_in_float32():
    lg = logits(9).to(torch.bfloat16)
    weights, ids = route(lg, 3, True)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64, (
        f"weights float32 and ids int64 expected, got {weights.dtype} and {ids.dtype}"
    )
    assert_close(weights.sum(-1), torch.ones(9), "renormalised, each row of weights sums to 1")
    probs = torch.softmax(lg.float(), dim=-1).gather(1, ids)
    assert_close(
        weights,
        probs / probs.sum(-1, keepdim=True),
        "bfloat16 logits: the softmax in float32 (then renormalised), not in bfloat16",
    )


def test_route_picks_the_most_probable_experts_in_falling_order_each_once():
    lg = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 4.0, 4.5, -1.0]])
    weights, ids = route(lg, 3, False)
    assert ids.tolist() == [[1, 3, 2], [0, 2, 1]], (
        f"the top 3 of {lg.tolist()}, most probable first: expected [[1, 3, 2], [0, 2, 1]], "
        f"got {ids.tolist()}"
    )
    assert (weights[:, :-1] >= weights[:, 1:]).all(), (
        f"weights must fall along each row, got {weights.tolist()}"
    )
    one, _ = route(lg, 1, True)
    assert torch.equal(one, torch.ones(2, 1)), (
        f"one expert (top_k 1), renormalised, weighs exactly 1; got {one.flatten().tolist()}"
    )


def test_route_with_a_tie_at_the_cut_keeps_top_k_distinct_experts():
    # Experts 1 and 2 tie for the second place. Which of them is kept is not fixed (torch.topk,
    # which transformers uses, leaves the order of ties unspecified), but exactly top_k distinct
    # experts are: expert 0 first, then one of the tied two with their shared probability.
    lg = torch.tensor([[3.0, 1.0, 1.0, 0.0]])
    weights, ids = route(lg, 2, False)
    probs = torch.softmax(lg, dim=-1)[0]
    got = ids.tolist()
    assert len(got) == 1 and len(got[0]) == 2 and got[0][0] == 0 and got[0][1] in (1, 2), (
        f"a tie at the top-2 cut of logits {lg.tolist()}: expert 0, then expert 1 or 2 (one of "
        f"them, once) expected, got {got}"
    )
    assert_close(weights, probs[[0, 1]][None], "the tied expert keeps the probability they share")


# ---------------------------------------------------------------- group_by_expert


def test_grouping_lists_each_experts_choices_together_in_rising_order():
    ids = torch.tensor([[3, 0], [0, 5], [5, 3], [1, 0]])
    order, counts = group_by_expert(ids, 7)
    # int64, as the contract says: moe_experts indexes with order and slices by counts' sums
    assert_dtype(order, torch.int64, "order (the entries sorted by expert)", shape=[8])
    assert_dtype(counts, torch.int64, "counts (one per expert)", shape=[7])
    assert order.tolist() == [1, 2, 7, 6, 0, 5, 3, 4], (
        f"the entries of {ids.tolist()} sorted by expert, each expert's in rising order: "
        f"expected order [1, 2, 7, 6, 0, 5, 3, 4], got {order.tolist()}"
    )
    assert counts.tolist() == [3, 1, 0, 2, 0, 2, 0], (
        f"one count per expert of 7, zero for the unused ones: expected counts "
        f"[3, 1, 0, 2, 0, 2, 0], got {counts.tolist()}"
    )


def test_grouping_of_a_random_routing_is_a_permutation_matching_the_counts():
    _, ids = route(logits(50, 16), 4, True)
    order, counts = group_by_expert(ids, 16)
    got = sorted(order.tolist())
    assert got == list(range(200)), (
        f"order holds each of the 200 entries exactly once; got {len(got)} entries, "
        f"{len(set(got))} distinct, from {got[0] if got else None} to {got[-1] if got else None}"
    )
    experts = ids.reshape(-1)[order]
    assert (experts[1:] >= experts[:-1]).all(), (
        f"choices must be sorted by expert; the experts in that order begin {experts.tolist()[:12]}"
    )
    assert counts.shape == (16,) and int(counts.sum()) == 200, (
        f"16 counts summing to 200 expected, got shape {tuple(counts.shape)} summing to "
        f"{int(counts.sum())}"
    )
    for e in range(16):
        mine = order[experts == e]
        assert int(counts[e]) == mine.numel(), (
            f"expert {e}: expected count {mine.numel()} (its entries), got {int(counts[e])}"
        )
        assert (mine[1:] > mine[:-1]).all(), (
            f"expert {e}'s entries in rising order (a stable sort) expected, got {mine.tolist()}"
        )


# ---------------------------------------------------------------- moe_experts


@pytest.mark.parametrize("norm,top_k", [(True, 2), (False, 2), (True, 3)])
def test_experts_equal_transformers_experts(norm, top_k):
    block, router, gate_up, down = hf_block(norm, top_k)
    x = tokens(23)
    weights, ids = route(x @ router.t(), top_k, norm)
    got = moe_experts(x, gate_up, down, weights, ids)
    assert_close(
        got,
        hf_output(block, x),
        f"transformers' experts on 23 tokens (top_k {top_k}, norm_topk_prob={norm})",
        atol=1e-5,
        rtol=1e-5,
    )


def test_each_choice_uses_its_own_experts_weights_and_its_own_weight():
    # One token, sent to experts 2 and 5 with weights 0.75 and 0.25: the sum of those two
    # experts' SwiGLU MLPs, so scaled.
    _, _, gate_up, down = hf_block(True)
    x = tokens(1)
    got = moe_experts(x, gate_up, down, torch.tensor([[0.75, 0.25]]), torch.tensor([[2, 5]]))

    def mlp(e):
        h = x @ gate_up[e].t()
        return (torch.nn.functional.silu(h[:, :INTER]) * h[:, INTER:]) @ down[e].t()

    assert_close(
        got,
        0.75 * mlp(2) + 0.25 * mlp(5),
        "one token to experts 2 and 5 with weights 0.75 and 0.25: 0.75 x MLP 2 + 0.25 x MLP 5",
    )
    # weights that do not sum to 1 (a route without renormalisation): used as they are
    got = moe_experts(x, gate_up, down, torch.tensor([[0.6, 0.1]]), torch.tensor([[2, 5]]))
    assert_close(
        got,
        0.6 * mlp(2) + 0.1 * mlp(5),
        "weights 0.6 and 0.1 (not renormalised): 0.6 x MLP 2 + 0.1 x MLP 5, the weights as given",
    )


def test_an_expert_nobody_chose_adds_nothing():
    _, _, gate_up, down = hf_block(True)
    gate_up, down = gate_up.clone(), down.clone()
    gate_up[4], down[4] = float("nan"), float("nan")  # expert 4 is chosen by no token
    ids = torch.tensor([[0, 1], [2, 3], [5, 6], [7, 0]])
    got = moe_experts(tokens(4), gate_up, down, torch.full((4, 2), 0.5), ids)
    assert torch.isfinite(got).all(), "an unchosen expert's weights reached the output"


def test_each_used_expert_runs_once_over_all_its_tokens():
    # The point of grouping: one product per used expert over all the tokens that chose it (its
    # weights read once), not one per (token, choice). 16 tokens, each to experts e and 4 + e.
    _, _, gate_up, down = hf_block(True)
    ids = torch.tensor([[t % 4, 4 + t % 4] for t in range(16)])
    with Products(gate_up, down) as seen:
        moe_experts(tokens(16), gate_up, down, torch.full((16, 2), 0.5), ids)
    n = len(seen.experts_read)
    assert n <= 3 * EXPERTS, (
        f"{n} matrix products for 16 tokens x 2 choices over 8 experts: each used expert "
        "must run once, over all its tokens (about 2 products an expert), not once per token"
    )


def test_an_expert_nobody_chose_is_skipped():
    # The contract: an expert with no tokens is skipped, its weights unread (on a GPU every
    # product over no tokens is a launch for nothing). 4 tokens use experts 0 to 3 of 8.
    _, _, gate_up, down = hf_block(True)
    ids = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2]])
    with Products(gate_up, down) as seen:
        moe_experts(tokens(4), gate_up, down, torch.full((4, 2), 0.5), ids)
    unused = sorted(set().union(*seen.experts_read) - {0, 1, 2, 3})
    assert not unused and not seen.empty, (
        "an expert nobody chose is skipped, its weights never read: experts 4 to 7 have no "
        f"tokens, yet products read the weights of experts {unused} and {seen.empty} products "
        "ran over no rows"
    )


def test_experts_in_bfloat16_round_like_transformers_and_handle_an_empty_batch():
    block, router, gate_up, down = hf_block(True)
    block = block.to(torch.bfloat16)
    x = tokens(6).to(torch.bfloat16)
    weights, ids = route(x @ router.bfloat16().t(), 2, True)
    got = moe_experts(x, gate_up.bfloat16(), down.bfloat16(), weights, ids)
    assert got.dtype == torch.bfloat16, f"bfloat16 tokens give a bfloat16 output, got {got.dtype}"
    assert_close(
        got,
        hf_output(block, x),
        "bfloat16: transformers' rounding (each expert's output scaled by its weight in "
        "bfloat16, after the down projection)",
        atol=1e-2,
        rtol=1e-2,
    )
    empty = moe_experts(x[:0], gate_up.bfloat16(), down.bfloat16(), weights[:0], ids[:0])
    assert isinstance(empty, torch.Tensor) and empty.shape == (0, HIDDEN), (
        f"zero tokens give a [0, {HIDDEN}] output, got "
        f"{tuple(empty.shape) if isinstance(empty, torch.Tensor) else type(empty).__name__}"
    )


# ---------------------------------------------------------------- in the engine


def raise_step_errors(outputs) -> None:
    """A step that raises ends its requests with an error reply (the engine goes on); raise it
    here again, so that an exercise not written yet reads as such."""
    for out in outputs:
        error = out.get("error")
        if error is None:
            continue
        stub = re.search(r"NotImplementedError: (ch20\.\w+: .*)", error)
        if stub:
            raise NotImplementedError(stub.group(1))
        pytest.fail(f"a step failed: {error}")


@pytest.mark.parametrize("name", ["qwen3-moe", "qwen3-moe-mlp-only-layers"])
def test_a_qwen3_moe_checkpoint_gives_transformers_tokens(name):
    from test_checkpoints import NEW_TOKENS, prompts

    ckpt = checkpoint(name)
    outputs = build_llm(ckpt).generate(prompts(), greedy(NEW_TOKENS))
    raise_step_errors(outputs)
    got = [o["token_ids"] for o in outputs]
    assert_tokens_equal(got, hf_greedy(prompts(), NEW_TOKENS, model=ckpt), name)
