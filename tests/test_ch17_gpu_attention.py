"""Chapter 17: the engine's Triton attention kernels against the torch reference.

The paged decode kernel (split over each request's keys, then the combine of the slices' partial
softmaxes) and the paged prefill kernel, on scattered pages of several sizes, GQA ratios from 1 to
8 query heads per KV head, lengths from one key to several blocks, and split counts from 1 to 16.
On a CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by conftest), so the
shapes are small; with `--device cuda` they are compiled for the GPU.

Every location of the KV pool that no request owns holds NaN, and so does location 0, where the
page table's padding points: a kernel that reads one key too many, or a value it masked out,
returns NaN instead of a number that might pass.
"""

from __future__ import annotations

import math
from typing import List, Sequence

import pytest
import torch

from extras import module_needs_extra

pytestmark = module_needs_extra("triton")  # before the imports that need it

from classroom.interpreter_bf16 import (  # noqa: E402
    fix_bf16_dot,
    fix_bf16_elementwise,
    fix_bf16_reductions,
)
from classroom.interpreter_masked_load import poison_masked_loads  # noqa: E402
from classroom.interpreter_tf32 import honour_tf32_dot  # noqa: E402
from classroom.kernel_errors import causes as _causes  # noqa: E402
from classroom.kernel_errors import in_chapter_words  # noqa: E402
from classroom.kernels import (  # noqa: E402
    CAUSAL_NAN_CAUSES,
    NAN_CAUSES,
    difference_note,
    merge_of_two_slices,
)
from helpers import test_device  # noqa: E402
from minisgl.attention import TorchAttentionBackend, prepare_metadata  # noqa: E402
from minisgl.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from minisgl.core import Batch, Req, SamplingParams  # noqa: E402
from minisgl.kernel.triton_decode import num_splits, paged_decode_attention  # noqa: E402
from minisgl.kernel.triton_prefill import paged_prefill_attention  # noqa: E402
from minisgl.kvcache import KVCache  # noqa: E402

DIM = 16  # the smallest head the kernels take: one tensor-core tile
fix_bf16_dot()  # on a CPU: the interpreter's bfloat16 tl.dot multiplies numbers, not their bits
fix_bf16_reductions()  # and its tl.sum / tl.max of a bfloat16 tile reduce numbers, not bits
fix_bf16_elementwise()  # and its *, +, exp, comparisons of bfloat16 tiles compute on numbers
honour_tf32_dot()  # on a CPU: a tl.dot left in TF32 rounds its operands as a GPU does
poison_masked_loads()  # and a masked-off lane loaded without other= is NaN, undefined as on a GPU
TOL = dict(atol=2e-5, rtol=2e-5)


def device() -> torch.device:
    return torch.device(test_device())


def assert_attention(got, want, case: str, rule: str, new=None, tol: float = TOL["atol"]) -> None:
    """`got` within `tol` of `want` (as torch.testing.assert_close with atol = rtol = tol), or a
    one-line failure: the case, the rule, and the largest difference or where NaN or inf came."""
    close = got.shape == want.shape and torch.allclose(
        got.float(), want.float(), atol=tol, rtol=tol
    )
    if close:
        return
    # a prefill's NaN is causal_scores' first (a query that sees no key), then the online step's
    causes = f"{CAUSAL_NAN_CAUSES}; or {NAN_CAUSES}" if case.startswith("prefill") else NAN_CAUSES
    note = difference_note(got, want, new, causes=causes)
    bound = f" (tolerance {tol:g})" if note.startswith("largest difference") else ""
    merge = merge_diagnosis() if case.startswith("decode") and "1 slice(s)" not in case else ""
    if merge:  # the slices' merge is wrong: say so first, in numbers, whatever else the case shows
        rule = f"{merge} (the rule this case checks: {rule})"
    assert close, f"{case}: {rule}: {note}{bound}"


def _case(kind: str, scene: "Scene", heads: int, kv_heads: int, page_size: int, splits=None) -> str:
    slices = "" if splits is None else f", {splits} slice(s)"
    return (
        f"{kind} of requests of {scene.lengths} keys{slices}, page size {page_size}, "
        f"{heads // kv_heads} query head(s) per KV head"
    )


class Scene:
    """A KV pool of `pages` pages of `page_size` locations with random keys and values at the
    locations the requests own and NaN everywhere else, a page table whose rows list each request's
    locations (its pages in a scattered order; 0 past its length), and the rows in a shuffled
    order."""

    def __init__(
        self,
        lengths: Sequence[int],
        page_size: int,
        kv_heads: int,
        seed: int = 0,
        key_scale: float = 1.0,
    ):
        g = torch.Generator().manual_seed(seed)
        need = sum(-(-n // page_size) for n in lengths)
        pages = need + 3  # page 0 (the padding's target) and two spare pages stay unused
        self.k_cache = torch.full((pages * page_size, kv_heads, DIM), float("nan"))
        self.v_cache = torch.full((pages * page_size, kv_heads, DIM), float("nan"))
        order = (torch.randperm(pages - 1, generator=g) + 1).tolist()  # page 0 is never handed out
        self.num_rows = len(lengths) + 2
        self.rows = torch.randperm(self.num_rows, generator=g)[: len(lengths)]
        width = max(lengths) + 5
        self.page_table = torch.zeros(self.num_rows, width, dtype=torch.int32)
        self.locations: List[torch.Tensor] = []
        for row, n in zip(self.rows.tolist(), lengths):
            own = [order.pop() for _ in range(-(-n // page_size))]
            locs = torch.tensor([own[p // page_size] * page_size + p % page_size for p in range(n)])
            self.page_table[row, :n] = locs.to(torch.int32)
            self.k_cache[locs] = torch.randn(n, kv_heads, DIM, generator=g) * key_scale
            self.v_cache[locs] = torch.randn(n, kv_heads, DIM, generator=g)
            self.locations.append(locs)
        self.g = g
        self.lengths = list(lengths)
        dev = device()
        self.k_cache, self.v_cache = self.k_cache.to(dev), self.v_cache.to(dev)
        self.page_table, self.rows = self.page_table.to(dev), self.rows.to(dev)

    def queries(self, tokens: int, heads: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(tokens, heads, DIM, generator=self.g) * scale).to(device())

    def reference(self, i: int, q: torch.Tensor, len_q: int) -> torch.Tensor:
        """Request i's last len_q queries q [len_q, H, D] attended causally over its keys, in
        float64 torch: what the kernels must give."""
        locs = self.locations[i].to(q.device)
        k, v = self.k_cache[locs].double(), self.v_cache[locs].double()
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        n = self.lengths[i]
        scores = torch.einsum("qhd,khd->hqk", q.double(), k) / math.sqrt(DIM)
        qpos = torch.arange(n - len_q, n, device=q.device)[:, None]
        scores = scores.masked_fill(torch.arange(n, device=q.device)[None, :] > qpos, -math.inf)
        return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).float()


def decode(scene: Scene, q: torch.Tensor, splits: int | None = None) -> torch.Tensor:
    seqlens = torch.tensor(scene.lengths, dtype=torch.int32, device=q.device)
    tuning = None if splits is None else {"splits": splits}
    return paged_decode_attention(
        q, scene.k_cache, scene.v_cache, scene.page_table, scene.rows, seqlens, DIM**-0.5, tuning
    )


def decode_reference(scene: Scene, q: torch.Tensor) -> torch.Tensor:
    return torch.stack([scene.reference(i, q[i : i + 1], 1)[0] for i in range(q.shape[0])])


def prefill(scene: Scene, q: torch.Tensor, new: Sequence[int]) -> torch.Tensor:
    cu = [0]
    for n in new:
        cu.append(cu[-1] + n)
    dev = q.device
    return paged_prefill_attention(
        q,
        scene.k_cache,
        scene.v_cache,
        scene.page_table,
        scene.rows,
        torch.tensor(cu, dtype=torch.int32, device=dev),
        torch.tensor(scene.lengths, dtype=torch.int32, device=dev),
        max(new),
        DIM**-0.5,
    )


def scale_diagnosis(scene: Scene, q: torch.Tensor, new: Sequence[int], got: torch.Tensor) -> str:
    """What is wrong with the scale, in numbers, when the prefill's output is the causal
    attention of scores scaled otherwise than by 1 / sqrt(head_dim) (not at all, or twice); ""
    when it is not."""
    scale = DIM**-0.5
    for wrong, what in ((1.0, "not scaled at all"), (scale * scale, "scaled twice")):
        other = prefill_reference(scene, q * (wrong / scale), new)
        if got.shape == other.shape and torch.allclose(got.float(), other, atol=1e-4, rtol=1e-4):
            return (
                f"the output is the causal attention of scores {what} (a factor of {wrong:g} where "
                f"causal_scores returns s * scale, scale = 1 / sqrt({DIM}) = {scale:g}); the mask "
                "itself is right"
            )
    return ""


def assert_prefill(got, scene: Scene, q: torch.Tensor, new: Sequence[int], case: str, rule: str):
    """assert_attention against float64 torch's causal attention, naming a wrong scale first."""
    want = prefill_reference(scene, q, new)
    close = got.shape == want.shape and torch.allclose(got.float(), want, atol=2e-5, rtol=2e-5)
    scale = "" if close else scale_diagnosis(scene, q, new, got)
    assert_attention(
        got, want, case, f"{scale} (the rule this case checks: {rule})" if scale else rule, new=new
    )


def prefill_reference(scene: Scene, q: torch.Tensor, new: Sequence[int]) -> torch.Tensor:
    parts, start = [], 0
    for i, n in enumerate(new):
        parts.append(scene.reference(i, q[start : start + n], n))
        start += n
    return torch.cat(parts)


# ---------------------------------------------------------------- decode


@pytest.mark.parametrize("page_size", [1, 4], ids=["page1", "page4"])
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 2), (8, 1)], ids=["gqa1", "gqa2", "gqa8"])
def test_decode_equals_attention_over_each_requests_own_keys(page_size, heads, kv_heads):
    # one key, a few, exactly one block of 32 (the float32 block), and past two blocks
    scene = Scene([1, 7, 32, 70], page_size, kv_heads, seed=page_size * 10 + heads)
    q = scene.queries(4, heads)
    got = decode(scene, q)
    case = _case("decode", scene, heads, kv_heads, page_size, num_splits(4, kv_heads))
    assert got.shape == q.shape and got.dtype == q.dtype, (
        f"{case}: shape {tuple(got.shape)} and {got.dtype}, expected the queries' "
        f"{tuple(q.shape)} and {q.dtype}"
    )
    rule = "each request's query attends over its own keys as float64 torch does"
    assert_attention(got, decode_reference(scene, q), case, rule)


@pytest.mark.parametrize("splits", [1, 2, 4, 16], ids=lambda n: f"splits{n}")
def test_every_split_count_gives_the_same_attention(splits):
    # with 16 slices of a 9-key request most slices are empty; the 100-key one has full and
    # partial slices
    scene = Scene([9, 100, 33], 4, 2, seed=splits)
    q = scene.queries(3, 4)
    case = _case("decode", scene, 4, 2, 4, splits)
    rule = "the slices' partial results combine into float64 torch's attention (some slices empty)"
    assert_attention(decode(scene, q, splits), decode_reference(scene, q), case, rule)


def test_the_default_split_count_depends_on_the_batch_alone():
    assert num_splits(1, 8) == 16 and num_splits(64, 8) == 2 and num_splits(128, 8) == 1
    assert num_splits(3, 2) == num_splits(4, 2)  # a batch padded to 4 for a CUDA graph splits alike


def _merge_of_slices_of_1s_and_3s(lse0: float, lse1: float) -> float:
    """combine_splits (through the kernel that calls it) on two slices whose outputs are all 1s
    and all 3s, with lse lse0 and lse1: the merge is 1 * w0 + 3 * w1, w = softmax(lse)."""
    return merge_of_two_slices(lse0, lse1, device())


def merge_diagnosis() -> str:
    """What the merge of slices does wrong, in numbers (combine_splits on two known slices), or ""
    when it merges them right or cannot run (not written yet: the test's own failure says so)."""
    ln3 = math.log(3.0)
    for lse0, lse1 in ((0.0, ln3), (300.0, 300.0 + ln3), (-300.0, -300.0 + ln3), (0.0, 200.0)):
        try:
            got = _merge_of_slices_of_1s_and_3s(lse0, lse1)
        except Exception as e:
            refused = in_chapter_words(e)
            if refused is None:
                return ""
            # with as many slices as the head is wide (16 and 16), the same product broadcast
            # silently: o [NUM_SPLITS, HEAD_DIM] times w [NUM_SPLITS] weighs o's columns
            if "[2, 16] and [1, 2]" not in refused:  # o [2, 16] times w as a row [1, 2]
                return f"combine_splits of 2 slices of a 16-wide head raised: {refused}"
            return (
                "combine_splits applies the weights along the head dimension instead of one per "
                "slice (weigh each row: w[:, None]): with 16 slices and a 16-wide head the product "
                "runs, with 2 slices it raised: " + refused.split(", which")[0]
            )
        w1 = 1.0 / (1.0 + math.exp(lse0 - lse1))
        want = 1.0 * (1.0 - w1) + 3.0 * w1
        if not abs(got - want) <= 1e-4:  # NaN included
            why = (
                "not finite: exp of an lse far from 0 overflows, or of one far below 0 gives 0/0, "
                "in float32 (weigh each slice relative to the largest lse)"
                if not math.isfinite(got)
                else "equal weights: a plain mean of the slices"
                if abs(got - 2.0) < 1e-4
                else "the weights are not exp(lse_k) / sum of exp(lse) (normalised, one per slice)"
            )
            return (
                f"combine_splits of two slices of 1s and 3s with lse {lse0:g} and {lse1:g} "
                f"gave {got:.4g}, expected {want:.4g} (weights {1 - w1:.3g} and {w1:.3g}): {why}"
            )
    return ""


@pytest.mark.parametrize(
    "lse",
    [(-300.0, -300.0 + math.log(3.0)), (-400.0, -200.0), (0.0, 200.0), (200.0, 0.0)],
    ids=[
        "all far below 0",
        "far below 0 and far apart",
        "far apart",
        "far apart with the largest first",
    ],
)
def test_combine_splits_weighs_the_slices_whatever_their_lse(lse):
    # a slice's lse is the log of its keys' softmax denominator: below -88 when every key points
    # away from the query (exp of it is 0 in float32), hundreds apart between slices. Weighed
    # relative to the largest lse, the weights stay finite and the largest is exactly 1.
    got = _merge_of_slices_of_1s_and_3s(*lse)
    w = torch.softmax(torch.tensor(lse, dtype=torch.float64), dim=0)
    want = float(w[0] + 3 * w[1])
    assert math.isfinite(got) and abs(got - want) < 1e-4, (
        f"combine_splits of two slices of 1s and 3s with lse {lse[0]:g} and {lse[1]:g} gave "
        f"{got:.6g}, expected {want:.6g} (weights softmax(lse) = {w[0]:.3g}, {w[1]:.3g}): each "
        "slice's weight is exp(its lse minus the largest lse), whatever sign and spread they have"
    )


def _large_scores_rule(rule: str, splits: int, one_slice_right: bool) -> str:
    """The rule a large-scores decode breaks: the online softmax's, unless one slice (no merge)
    was right and more slices are not, which blames combine_splits, not the running maximum."""
    if splits > 1 and one_slice_right:
        return "one slice gives the right attention, so the merge of the slices is what fails"
    return rule


def test_decode_with_large_scores_rescales_by_the_running_max():
    # scores of a few hundred: exp of one overflows float32, so each block and each slice must
    # be weighted relative to a maximum; the largest scores sit in the last keys (a later block,
    # a later slice), where the running maximum changes
    scene = Scene([90, 50], 1, 2, seed=3, key_scale=4.0)
    q = scene.queries(2, 4, scale=12.0)
    want = decode_reference(scene, q)
    one_slice_right = False
    for splits in (1, 4):
        got = decode(scene, q, splits)
        case = _case("decode", scene, 4, 2, 1, splits) + ", scores up to a few hundred"
        rule = "the largest scores come last: rescaled to each new running maximum"
        rule = _large_scores_rule(rule, splits, one_slice_right)
        assert_attention(got, want, case, rule, tol=1e-4)
        one_slice_right = True


def test_decode_with_the_largest_scores_first_keeps_the_running_max():
    # the largest scores sit in the first 10 keys (the first block): every later block's own
    # maximum is smaller, and the running maximum must stay the first block's; a step that took
    # the block's maximum alone would rescale what it holds by exp(old - new), which overflows
    scene = Scene([90, 50], 1, 1, seed=3)
    scene.k_cache[scene.locations[0][:10]] *= 6.0
    q = scene.queries(2, 2, scale=12.0)
    want = decode_reference(scene, q)
    one_slice_right = False
    for splits in (1, 2):  # 2 slices: request 0's first slice is two blocks
        got = decode(scene, q, splits)
        case = _case("decode", scene, 2, 1, 1, splits) + ", scores up to a few hundred"
        rule = (
            "the largest scores come first: the running maximum is the larger of the old one "
            "and the block's"
        )
        rule = _large_scores_rule(rule, splits, one_slice_right)
        assert_attention(got, want, case, rule, tol=1e-4)
        one_slice_right = True


def test_decode_of_a_slice_whose_keys_outweigh_the_others():
    # one key of request 0 matches its query far better than the rest, and sits in the last of
    # 4 slices: the combine must give that slice almost all the weight, not a quarter of it
    scene = Scene([64], 1, 1, seed=5)
    q = scene.queries(1, 1)
    loc = scene.locations[0][60]
    scene.k_cache[loc] = q[0] * 8.0
    got = decode(scene, q, 4)
    want = decode_reference(scene, q)
    case = _case("decode", scene, 1, 1, 1, 4)
    rule = "key 60 (in the last slice) matches the query far better than the rest"
    assert_attention(got, want, case, rule)
    off = float((got[0, 0] - scene.v_cache[loc, 0]).abs().max())
    assert off < 0.05, (
        f"{case}: {rule}: the output is {off:.3g} from key 60's value, expected < 0.05"
    )


# ---------------------------------------------------------------- prefill


@pytest.mark.parametrize("page_size", [1, 4], ids=["page1", "page4"])
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 2), (8, 1)], ids=["gqa1", "gqa2", "gqa8"])
def test_prefill_is_causal_after_each_requests_cached_prefix(page_size, heads, kv_heads):
    # a fresh prompt; a chunk after a cached prefix; one new token after a prefix; a chunk longer
    # than a query block (32) after a prefix of odd length
    new, cached = [6, 9, 1, 40], [0, 5, 3, 13]
    scene = Scene([n + c for n, c in zip(new, cached)], page_size, kv_heads, seed=heads)
    q = scene.queries(sum(new), heads)
    got = prefill(scene, q, new)
    case = _case("prefill", scene, heads, kv_heads, page_size) + f", {new} new tokens"
    assert got.shape == q.shape and got.dtype == q.dtype, (
        f"{case}: shape {tuple(got.shape)} and {got.dtype}, expected the queries' "
        f"{tuple(q.shape)} and {q.dtype}"
    )
    rule = "each new token attends to the cached prefix and the new tokens up to its own"
    assert_prefill(got, scene, q, new, case, rule)


def test_the_first_token_of_a_fresh_prompt_attends_to_itself_alone():
    scene = Scene([5], 1, 1, seed=7)
    q = scene.queries(5, 2)
    got = prefill(scene, q, [5])
    first = scene.v_cache[scene.locations[0][0]]  # [1, D]: its own value, for both query heads
    case = _case("prefill", scene, 2, 1, 1) + ", a fresh prompt of 5 tokens"
    assert_attention(
        got[:1], first.expand(1, 2, DIM), case, "token 0 sees its own key alone: its value", new=[1]
    )
    rule = "each token attends to the tokens up to its own"
    assert_prefill(got, scene, q, [5], case, rule)


def test_causal_scores_returns_float32_scores():
    # the online softmax takes the scores' max and exponentiates them in float32: scores rounded
    # to bfloat16 are off by up to 0.4 % first, which the attention tests see only as a small
    # difference blamed on the mask
    from classroom.causal_scores_check import scores_dtype_problem

    problem = scores_dtype_problem(device())
    assert not problem, (
        f"causal_scores on one block of float32 scores: {problem} (scale them and mask them, "
        "without a cast: the raw scores are float32 and so is the online softmax's state)"
    )


def test_a_hidden_key_loses_to_every_visible_one():
    # the attention tests' scores lie within a few units of 0, where -1e4 looks like -inf; a
    # query and keys pointing apart give scores far below it
    from classroom.causal_scores_check import hidden_key_problem

    problem = hidden_key_problem(device())
    rule = (
        ""  # the scores' dtype: test_causal_scores_returns_float32_scores says that rule
        if problem.startswith("the scores come back")
        else " (a hidden key must lose to every visible one: -inf, or a value no score reaches, "
        "such as -1e30)"
    )
    assert not problem, f"causal_scores on one block: {problem}{rule}"


def test_a_chunk_sees_the_whole_cached_prefix():
    # 2 new tokens after 60 cached keys: the last key of the prefix outweighs everything, so both
    # new tokens must return (almost) its value
    scene = Scene([62], 1, 1, seed=8)
    q = scene.queries(2, 1)
    loc = scene.locations[0][59]
    scene.k_cache[loc] = (q[0] + q[1]) * 8.0
    got = prefill(scene, q, [2])
    case = _case("prefill", scene, 1, 1, 1) + ", 2 new tokens after 60 cached"
    rule = "both new tokens see the whole cached prefix, whose key 59 outweighs the rest"
    assert_prefill(got, scene, q, [2], case, rule)
    off = float((got[:, 0] - scene.v_cache[loc, 0]).abs().max())
    assert off < 0.05, (
        f"{case}: {rule}: the output is {off:.3g} from key 59's value, expected < 0.05"
    )


# ---------------------------------------------------------------- bfloat16, as on a GPU


def test_the_online_step_keeps_its_running_state_in_float32():
    # The kernels carry m_i, l_i and acc through their loop over key blocks, float32 from the
    # start; a step that returns one of them in the values' bfloat16 changes a loop-carried value's
    # dtype, which a GPU does not compile and the interpreter runs into NaN.
    from classroom.online_step_check import running_state_dtype_problem

    # a step whose tl.dot mixes float32 and bfloat16 operands does not run at all: that rule first
    problem = _bf16_run(
        lambda: running_state_dtype_problem(device()),
        "one online step on a float32 running state and bfloat16 values",
    )
    which = next((n for n in ("acc", "l_i", "m_i") if f"returned {n} " in problem), "it")
    assert not problem, (
        f"one step on a float32 running state and bfloat16 values: {problem} (the kernels carry "
        "m_i, l_i and acc through their loop over key blocks in float32, and a GPU compiles no "
        f"loop whose carried value changes dtype: compute {which} in float32 and return it so, "
        "without casting it to the values' dtype)"
    )


def test_a_masked_load_gives_the_masked_off_lanes_a_value():
    # Triton leaves a masked-off lane of tl.load undefined unless other= gives it a value. On a CPU
    # the interpreter here fills such lanes with NaN and the attention tests fail; compiled, a
    # GPU's lanes are often zeros, so those tests can pass on one GPU and fail on another: the
    # source is what shows the mistake on every device.
    from classroom.masked_loads import loads_without_other
    from classroom.online_step_check import running_state_dtype_problem
    from minisgl.kernel import triton_blocks

    # the source scan alone passes a stub, which loads nothing: run the step once, so that a stub's
    # NotImplementedError reads "not written" (any other failure is another test's to name)
    try:
        running_state_dtype_problem(device())
    except Exception as e:
        if any(isinstance(x, NotImplementedError) for x in _causes(e)):
            raise
    loose = loads_without_other(triton_blocks.online_softmax_step)
    assert not loose, (
        "online_softmax_step: a masked tl.load gives the masked-off lanes no value ("
        + "; ".join(loose)
        + "): Triton leaves them undefined (on a GPU a NaN or an infinity from an earlier tile, "
        "and 0 x NaN is NaN in the block's product): give other=0.0, or replace them with "
        "tl.where before their first use"
    )


def _bf16_run(kernel, case: str):
    """`kernel()`, or a one-line failure quoting Triton's first line when it refuses to run on
    bfloat16 caches (a stub's NotImplementedError goes through, so it reads "not written")."""
    try:
        return kernel()
    except Exception as e:
        chain = _causes(e)
        if any(isinstance(x, NotImplementedError) for x in chain):
            raise
        # Triton's refusal as the chapter words the rule it broke (tl.dot's operands of two
        # dtypes, a mask of the wrong shape), else its first line about a dtype
        said = in_chapter_words(e) or next(
            (ln for x in chain for ln in str(x).splitlines() if "dtype" in ln), str(e)
        )
        pytest.fail(
            f"{case}: with bfloat16 caches (the engine's dtype on a GPU) the kernel does not run: "
            f"{said.strip()[:500]}",
            pytrace=False,
        )


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_bfloat16_caches_give_the_attention_of_their_values(kind):
    scene = Scene([1, 7, 70], 4, 2, seed=5)
    scene.k_cache, scene.v_cache = scene.k_cache.bfloat16(), scene.v_cache.bfloat16()
    case = _case(kind, scene, 4, 2, 4) + ", bfloat16 caches and queries"
    if kind == "decode":
        q = scene.queries(3, 4).bfloat16()
        got = _bf16_run(lambda: decode(scene, q, splits=2), case)
        want, new = decode_reference(scene, q), None
    else:
        new = [1, 3, 5]
        q = scene.queries(sum(new), 4).bfloat16()
        got = _bf16_run(lambda: prefill(scene, q, new), case)
        want = prefill_reference(scene, q, new)
    assert got.dtype == torch.bfloat16, f"{case}: the output is {got.dtype}, expected the queries'"
    # bfloat16 keeps 8 bits of mantissa: the probabilities cast to it before the product, and the
    # output rounded to it, are each off by up to 2^-8 of the value
    assert_attention(got, want, case, "attention over the bfloat16 keys and values", new, tol=2e-2)


# ---------------------------------------------------------------- the backends


def test_triton_backend_equals_the_torch_backend_through_the_engines_metadata():
    """Prefill then decode, as the engine runs them: its KV pool, its page table, metadata from
    prepare_metadata; the Triton backend against the torch reference backend."""
    dev = device()
    page, heads, kv_heads = 4, 4, 2
    pool = KVCache(1, 24, page, kv_heads, DIM, torch.float32, dev)
    table = torch.zeros(4, 40, dtype=torch.int32, device=dev)
    free = [9, 2, 17, 5, 11, 0, 21, 7, 14, 3, 19, 1, 12, 6, 23, 8]
    g = torch.Generator().manual_seed(11)
    specs = [(3, 13, 5), (0, 7, 0), (1, 20, 19)]  # (row, length, cached) before the step
    reqs, new_kv = [], []
    for uid, (row, length, cached) in enumerate(specs):
        pages = [free.pop(0) for _ in range(-(-length // page))]
        locs = torch.tensor([pages[p // page] * page + p % page for p in range(length)])
        table[row, :length] = locs.to(torch.int32).to(dev)
        k = torch.randn(length, kv_heads, DIM, generator=g).to(dev)
        v = torch.randn(length, kv_heads, DIM, generator=g).to(dev)
        pool.k_cache(0)[locs.to(dev)] = k
        pool.v_cache(0)[locs.to(dev)] = v
        ids = torch.arange(length, dtype=torch.int32)
        reqs.append(Req(ids, row, cached, 4, uid, SamplingParams()))
        new_kv.append(locs)
    torch_backend = TorchAttentionBackend(pool, heads, kv_heads, DIM)
    triton_backend = TritonAttentionBackend(pool, heads, kv_heads, DIM, table)
    prefill_reqs = reqs[:2]
    batch = Batch(prefill_reqs, "prefill")
    batch.attn_metadata = prepare_metadata(batch, table, dev)
    tokens = sum(r.extend_len for r in prefill_reqs)
    q = torch.randn(tokens, heads, DIM, generator=g).to(dev)
    case = "the engine's metadata, page size 4, 2 query heads per KV head"
    assert_attention(
        triton_backend.attend(q, 0, batch),
        torch_backend.attend(q, 0, batch),
        f"{case}, prefill of 8 new tokens after 5 cached and of 7 fresh ones",
        "the Triton backend gives the torch backend's attention",
        new=[8, 7],
    )
    batch = Batch(reqs[2:] + reqs[:1], "decode")  # request 0 now decodes its 13th token
    reqs[0].cached_len = reqs[0].device_len - 1
    batch.attn_metadata = prepare_metadata(batch, table, dev)
    q = torch.randn(2, heads, DIM, generator=g).to(dev)
    assert_attention(
        triton_backend.attend(q, 0, batch),
        torch_backend.attend(q, 0, batch),
        f"{case}, decode of requests of 20 and 13 keys",
        "the Triton backend gives the torch backend's attention",
    )
