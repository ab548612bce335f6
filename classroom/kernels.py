"""Chapter 17's classroom: the engine's attention kernels run with the notebook's version of one of
their @triton.jit helpers, and small paged scenes to run them on.

A kernel calls its helpers by their global names in its own module: Triton's interpreter (a CPU,
`TRITON_INTERPRET=1`) looks them up every time the kernel runs, the compiler (a GPU) once, when it
first compiles the kernel. `helper_in_place` therefore sets the name in the kernel's module and
makes that module's compiled kernels forget what they compiled, before and after.
"""

from __future__ import annotations

import inspect
import math
import sys
from contextlib import contextmanager
from typing import Iterator, List, Sequence

import torch

from .interpreter_bf16 import fix_bf16_dot, fix_bf16_elementwise, fix_bf16_reductions
from .interpreter_masked_load import poison_masked_loads
from .interpreter_tf32 import honour_tf32_dot

# on a CPU, the try-outs' bfloat16 scenes need the interpreter's tl.dot, reductions and arithmetic
# to compute on numbers, a tl.dot left in TF32 must round as a GPU's does, and a masked-off lane
# loaded without other= is as undefined as a GPU's (NaN)
fix_bf16_dot()
fix_bf16_reductions()
fix_bf16_elementwise()
honour_tf32_dot()
poison_masked_loads()


def _forget_compiled(module) -> None:
    for value in list(vars(module).values()):
        caches = getattr(value, "device_caches", None)
        if caches is not None and hasattr(value, "hash"):  # a compiled JITFunction
            value.hash = None
            value.used_global_vals = {}
            caches.clear()


def _unwritten(fn) -> NotImplementedError | None:
    """The stub's NotImplementedError if `fn` (a jitted helper) is still the stub: it raises it at
    once, before any Triton operation (which outside a kernel raises something else)."""
    python = getattr(fn, "fn", fn)
    try:
        python(*[None] * len(inspect.signature(python).parameters))
    except NotImplementedError as e:
        return e
    except Exception:
        return None
    return None


def _holders(original) -> List[object]:
    """The loaded kernel modules that hold `original` as a global (a helper is imported by name
    into each kernel's module, and the kernel looks it up there)."""
    return [
        m
        for name, m in list(sys.modules.items())
        if name.startswith("minisgl.kernel.") and m is not None
        for value in [vars(m).get(getattr(original, "__name__", ""))]
        if value is original
    ]


@contextmanager
def helper_in_place(module, name: str, fn) -> Iterator[None]:
    """Run the kernels with `fn` as their helper `name` (the one `module` defines) inside the
    block: set in every kernel module that imported it, jitted if `fn` is not (only a jitted
    function can be called from a compiled kernel). A stub's NotImplementedError comes out as
    itself (the interpreter wraps errors raised in a kernel)."""
    stub = _unwritten(fn)
    if stub is not None:
        raise stub
    if not hasattr(fn, "fn"):
        import triton

        fn = triton.jit(fn)
    original = getattr(module, name)
    holders = _holders(original)
    for m in holders:
        setattr(m, name, fn)
        _forget_compiled(m)
    try:
        yield
    except Exception as e:
        if isinstance(e.__cause__, NotImplementedError):
            raise e.__cause__ from None
        raise
    finally:
        for m in holders:
            setattr(m, name, original)
            _forget_compiled(m)


class PagedScene:
    """A KV pool of pages of `page_size` locations, random keys and values at the locations the
    requests own and NaN at every other (location 0 too, where the page table's padding points),
    and a page table whose rows, in a shuffled order, list each request's locations."""

    def __init__(
        self,
        lengths: Sequence[int],
        page_size: int = 4,
        kv_heads: int = 2,
        head_dim: int = 16,
        seed: int = 0,
        device: str = "cpu",
    ):
        g = torch.Generator().manual_seed(seed)
        self.head_dim, self.lengths = head_dim, list(lengths)
        pages = sum(-(-n // page_size) for n in lengths) + 3
        shape = (pages * page_size, kv_heads, head_dim)
        k, v = torch.full(shape, float("nan")), torch.full(shape, float("nan"))
        order = (torch.randperm(pages - 1, generator=g) + 1).tolist()
        rows = torch.randperm(len(lengths) + 2, generator=g)[: len(lengths)]
        table = torch.zeros(len(lengths) + 2, max(lengths) + 5, dtype=torch.int32)
        self.locations: List[torch.Tensor] = []
        for row, n in zip(rows.tolist(), lengths):
            own = [order.pop() for _ in range(-(-n // page_size))]
            locs = torch.tensor([own[p // page_size] * page_size + p % page_size for p in range(n)])
            table[row, :n] = locs.to(torch.int32)
            k[locs] = torch.randn(n, kv_heads, head_dim, generator=g)
            v[locs] = torch.randn(n, kv_heads, head_dim, generator=g)
            self.locations.append(locs)
        self.g = g
        self.k_cache, self.v_cache = k.to(device), v.to(device)
        self.page_table, self.rows = table.to(device), rows.to(device)
        self.scale = 1 / math.sqrt(head_dim)

    def queries(self, tokens: int, heads: int, scale: float = 1.0) -> torch.Tensor:
        q = torch.randn(tokens, heads, self.head_dim, generator=self.g) * scale
        return q.to(self.k_cache.device)

    def seqlens(self) -> torch.Tensor:
        return torch.tensor(self.lengths, dtype=torch.int32, device=self.k_cache.device)

    def attention(self, i: int, q: torch.Tensor) -> torch.Tensor:
        """Request i's last q.shape[0] queries attended causally over its keys, in float64 torch
        (the answer the kernels must give), as float32."""
        locs = self.locations[i].to(q.device)
        k, v = self.k_cache[locs].double(), self.v_cache[locs].double()
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        n, len_q = self.lengths[i], q.shape[0]
        scores = torch.einsum("qhd,khd->hqk", q.double(), k) * self.scale
        qpos = torch.arange(n - len_q, n, device=q.device)[:, None]
        scores = scores.masked_fill(torch.arange(n, device=q.device)[None, :] > qpos, -math.inf)
        return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).float()

    def decode_reference(self, q: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.attention(i, q[i : i + 1])[0] for i in range(q.shape[0])])

    def prefill_reference(self, q: torch.Tensor, new: Sequence[int]) -> torch.Tensor:
        starts = [sum(new[:i]) for i in range(len(new) + 1)]
        return torch.cat([self.attention(i, q[starts[i] : starts[i + 1]]) for i in range(len(new))])

    def cu_seqlens(self, new: Sequence[int]) -> torch.Tensor:
        cu = [sum(new[:i]) for i in range(len(new) + 1)]
        return torch.tensor(cu, dtype=torch.int32, device=self.k_cache.device)


def merge_of_two_slices(lse0: float, lse1: float, device: torch.device | str = "cpu") -> float:
    """The decode kernel's merge (`_combine_kernel`, so `combine_splits` as it is now) of two
    slices whose outputs are all 1s and all 3s, with log-sum-exps lse0 and lse1: one value of its
    output, 1 * w0 + 3 * w1 with w = softmax([lse0, lse1]) when the merge is right."""
    from minisgl.kernel import triton_decode
    from minisgl.kernel.triton_launch import launch

    dim = 16  # the smallest head the kernels take
    o = torch.stack([torch.ones(dim), torch.full((dim,), 3.0)])[None, None].to(device)
    lse = torch.tensor([[[lse0, lse1]]], device=device)
    out = torch.empty(1, 1, dim, device=device)
    launch(
        triton_decode._combine_kernel,
        (1, 1),
        o,
        lse,
        out,
        *o.stride()[:3],
        *lse.stride()[:2],
        *out.stride()[:2],
        NUM_SPLITS=2,
        HEAD_DIM=dim,
        num_warps=4,
    )
    return float(out[0, 0, 0])


def largest_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest absolute difference, inf where one holds NaN and the other does not."""
    diff = (got.float() - want.float()).abs()
    return float("inf") if torch.isnan(diff).any() else float(diff.max())


# Why a kernel's output holds NaN or inf where the answer is a number: each of these makes one.
NAN_CAUSES = (
    "a masked location's value read (a tl.load with mask= and no other=: its masked lanes are "
    "undefined, NaN here), exp overflowing, -inf minus -inf, or the running state (m_i, l_i, acc) "
    "not kept in float32"
)

# combine_splits' own: its weights and their sum are where a NaN or an inf comes from
COMBINE_NAN_CAUSES = (
    "exp of a raw lse overflowing to inf (lse in the hundreds) or every weight underflowing to 0 "
    "(lse far below 0), where exp(lse - the largest lse) stays in (0, 1]; or a division by a sum "
    "of weights that is 0 or inf (0/0 and inf/inf are NaN)"
)
# causal_scores' own: a query whose row of scores is all -inf has a softmax of 0/0
CAUSAL_NAN_CAUSES = (
    "a query that sees no key at all (its row all -inf: exp gives 0s, and 0/0 is NaN): does "
    "each query see its own key (<=, not <), and is m turned into its position among all len_k "
    "keys, after the cached prefix?"
)

# A float32 result off by this much, and no more, is what TF32 products give: each float32 operand
# keeps 10 of its 23 mantissa bits, about 1e-3 relative, where full float32 products stay near 1e-6.
TF32_SIZED = (2e-5, 5e-3)
TF32_CAUSE = "TF32-sized: float32 caches need IEEE products, not tl.dot's TF32 default"


def _place(index: Sequence[int], new: Sequence[int] | None) -> str:
    """Where a value of a [tokens, heads, dim] output is: its request (and new token), its head."""
    token, head = index[0], index[1]
    if new is None:  # decode: one token a request
        return f"request {token}, head {head}"
    start = 0
    for i, n in enumerate(new):
        if token < start + n:
            return f"request {i}'s new token {token - start}, head {head}"
        start += n
    return f"token {token}, head {head}"


def difference_note(
    got: torch.Tensor,
    want: torch.Tensor,
    new: Sequence[int] | None = None,
    causes: str = NAN_CAUSES,
) -> str:
    """What `got` (a kernel's [tokens, heads, dim] output) does differently from `want`, in one
    phrase: the largest difference and where, or where NaN or inf came instead of a number, with
    `causes`, the exercise's own ways of making one (online_softmax_step's by default). `new`:
    the requests' new tokens of a prefill (None for a decode, one token a request)."""
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    got_dtype = got.dtype
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    bad = ~torch.isfinite(got) & torch.isfinite(want)
    if bad.any():
        kinds = [
            k for k, m in (("NaN", torch.isnan(got)), ("inf", torch.isinf(got))) if (m & bad).any()
        ]
        first = bad.nonzero()[0].tolist()
        return (
            f"{' and '.join(kinds)} in {int(bad.sum())} of {got.numel()} values, the first at "
            f"{_place(first, new)} (possible causes: {causes})"
        )
    float32 = got_dtype == torch.float32
    diff = (got - want).abs()
    where = torch.nonzero(diff == diff.max())[0].tolist()
    note = f"largest difference {float(diff.max()):.3g}, at {_place(where, new)}"
    if float32 and TF32_SIZED[0] < float(diff.max()) < TF32_SIZED[1]:
        note += f" ({TF32_CAUSE})"
    return note
