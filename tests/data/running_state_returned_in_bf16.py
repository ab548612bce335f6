# A Triton kernel shaped like chapter 17's: a running state (m_i, l_i, acc) carried through a loop
# and a step that returns l_i in the values' bfloat16, so the kernel's tl.log after the loop
# refuses it ("Expected dtype ['fp32', 'fp64'] but got bf16"). The judge's message for it is
# tested in test_judge_messages.py.
import triton
import triton.language as tl


@triton.jit
def step(x, m_i, l_i, acc):
    m_new = tl.maximum(m_i, tl.max(x, 0))
    p = tl.exp(x - m_new)
    return m_new, (l_i + tl.sum(p, 0)).to(tl.bfloat16), acc  # the mistake: l_i in bfloat16


@triton.jit
def lse(src, dst, N: tl.constexpr):
    m_i = tl.full([1], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([1], dtype=tl.float32)
    x = tl.load(src + tl.arange(0, N))
    m_i, l_i, acc = step(x, m_i, l_i, acc)
    tl.store(dst + tl.arange(0, 1), m_i + tl.log(l_i))
