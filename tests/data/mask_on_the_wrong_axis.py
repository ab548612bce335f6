# A Triton kernel with chapter 17's masking mistake: a [N, D] tile loaded with a row mask laid
# along the wrong axis (ok[None, :], a [1, N] mask, where [N, 1] belongs). The judge's and the
# try-out's messages for it are tested in test_judge_messages.py and test_workbook_tool.py.
import triton
import triton.language as tl


@triton.jit
def copy(src, dst, n, N: tl.constexpr, D: tl.constexpr):
    rows, cols = tl.arange(0, N), tl.arange(0, D)
    ok = rows < n
    tile = tl.load(src + rows[:, None] * D + cols[None, :], mask=ok[None, :], other=0.0)
    tl.store(dst + rows[:, None] * D + cols[None, :], tile)
