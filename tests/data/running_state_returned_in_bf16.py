# Triton kernels shaped like chapter 17's: a running state (m_i, l_i, acc) carried through a loop
# and steps that return l_i in the values' bfloat16 (the kernel's tl.log after the loop refuses
# it: "Expected dtype ['fp32', 'fp64'] but got bf16") or as [M, 1] (the kernel's tl.store refuses
# the values' tile). The judge's messages for them are tested in test_judge_messages.py.
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


@triton.jit
def misshapen_step(x, m_i, l_i, acc):
    m_new = tl.maximum(m_i, tl.max(x, 1))
    p = tl.exp(x - m_new[:, None])
    l_new = l_i + tl.sum(p, 1)
    return m_new, tl.reshape(l_new, (l_new.shape[0], 1)), acc + p  # the mistake: l_i [M, 1]


@triton.jit
def normalised(src, dst, M: tl.constexpr, N: tl.constexpr):
    rows, cols = tl.arange(0, M), tl.arange(0, N)
    m_i = tl.full([M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([M], dtype=tl.float32)
    acc = tl.zeros([M, N], dtype=tl.float32)
    x = tl.load(src + rows[:, None] * N + cols[None, :])
    m_i, l_i, acc = misshapen_step(x, m_i, l_i, acc)
    tl.store(dst + rows[:, None] * N + cols[None, :], acc / l_i[:, None])
