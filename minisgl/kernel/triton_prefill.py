"""Prefill attention over the paged KV cache as one Triton kernel (GPU only).

The reference backend attends request by request: on a GPU that is some ten small kernels per
request and layer, launched from Python, and a prefill step of 8,192 tokens from a dozen requests
spends its time launching them. Here one launch covers the whole batch.

Each program takes one request, one block of its new tokens (queries) and one query head. Query
j of a request with `len_k` keys of which the last `len_q` are new sits at absolute position
`len_k - len_q + j` and sees keys 0 to that position (earlier chunks and the cached prefix
included). The program walks those keys block by block through the request's page-table row with
an online softmax, as flash attention does, so the scores are never written to memory.

`triton` is imported only here; nothing on the CPU path imports this module.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_blocks import key_block_scores, online_softmax_step
from .triton_launch import check_vectors, launch, paged_kv_strides


@triton.jit
def causal_scores(s, offs, m, len_q, len_k, scale):
    """The causal mask of one block of prefill scores, with the scale applied.

    Receives: s [BLOCK_M, BLOCK_N], unscaled scores of a block of queries against a block of keys;
        m [BLOCK_M], the queries' indices among the request's len_q new tokens; offs [BLOCK_N], the
        keys' positions in its sequence of len_k keys (the new tokens are the last len_q of them,
        after a cached prefix); scale, 1 / sqrt(head_dim). Called by `_paged_prefill_kernel`.
    Returns: [BLOCK_M, BLOCK_N] float32, s * scale where the key is visible to the query (at or
        before its own position), -inf where it is not (or a finite value no score can reach,
        such as -1e30: the chapter says why either is right).
    Leaves: s as it was.
    Uses: `tl.where` and broadcasting a column against a row (`[:, None]`, `[None, :]`).
    Checked: float32 scores, s * scale exactly; a hidden key below visible scores near -5e4;
        against float64 torch causal attention after cached prefixes of several lengths, across
        query blocks, for GQA 1/2/8 and pages of 1 and 4, the first token of a fresh prompt.
    """
    # query m sits at absolute position len_k - len_q + m and sees keys 0 to that position. Keys
    # past the loop's end (offs >= end) are past every real query's position, so no separate
    # mask is needed for them; rows of padding queries (m >= len_q) are never stored.
    qpos = len_k - len_q + m
    return tl.where(offs[None, :] <= qpos[:, None], s * scale, float("-inf"))


@triton.jit
def _paged_prefill_kernel(
    Q,
    K,
    V,
    PT,
    ROWS,
    CU_Q,
    SEQLENS,
    O,
    stride_qt,
    stride_qh,
    stride_kl,
    stride_kh,
    stride_vl,
    stride_vh,
    stride_pt,
    stride_ot,
    stride_oh,
    scale,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
):
    b = tl.program_id(0)
    block = tl.program_id(1)
    h = tl.program_id(2)
    q_start = tl.load(CU_Q + b)
    len_q = tl.load(CU_Q + b + 1) - q_start
    if block * BLOCK_M < len_q:  # programs past a shorter request's queries do nothing
        len_k = tl.load(SEQLENS + b)
        row = tl.load(ROWS + b).to(tl.int64)
        kv_head = h // GROUP
        m = block * BLOCK_M + tl.arange(0, BLOCK_M)  # query index within the request
        m_ok = m < len_q
        d = tl.arange(0, HEAD_DIM)
        q_rows = (q_start + m).to(tl.int64)
        q = tl.load(
            Q + q_rows[:, None] * stride_qt + h * stride_qh + d[None, :],
            mask=m_ok[:, None],
            other=0.0,
        )

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        # past the block's last query
        end = tl.minimum(len_k, len_k - len_q + (block + 1) * BLOCK_M)
        for n0 in range(0, end, BLOCK_N):
            offs = n0 + tl.arange(0, BLOCK_N)
            n_ok = offs < end
            loc = tl.load(PT + row * stride_pt + offs, mask=n_ok, other=0).to(tl.int64)
            s = key_block_scores(q, K, loc, n_ok, kv_head, d, stride_kl, stride_kh, IEEE)
            # key 0 is visible to every query, so no row is all -inf after the first block
            s = causal_scores(s, offs, m, len_q, len_k, scale)
            m_i, l_i, acc = online_softmax_step(
                s, V, loc, n_ok, kv_head, d, stride_vl, stride_vh, m_i, l_i, acc, IEEE
            )
        out = acc / l_i[:, None]
        tl.store(
            O + q_rows[:, None] * stride_ot + h * stride_oh + d[None, :],
            out.to(O.dtype.element_ty),
            mask=m_ok[:, None],
        )


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    rows: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seqlens: torch.Tensor,
    max_seqlen_q: int,
    scale: float,
) -> torch.Tensor:
    """q: [T, H, D], the new tokens of all requests back to back (request i owns rows
    cu_seqlens_q[i]:cu_seqlens_q[i+1]); k_cache, v_cache: [locations, Hkv, D], this step's keys
    and values already stored; page_table: [R, max_len] locations; rows: [B] row of each request
    in page_table; seqlens: [B] keys of each request, new ones included; max_seqlen_q: the
    largest new-token count (a host int: it sizes the launch). Returns [T, H, D] in q's dtype."""
    tokens, num_heads, head_dim = q.shape
    batch = rows.shape[0]
    group = num_heads // k_cache.shape[1]
    kv_strides = paged_kv_strides(q, k_cache, v_cache, page_table)
    check_vectors(rows=rows, cu_seqlens_q=cu_seqlens_q, seqlens=seqlens)
    ieee = q.dtype == torch.float32
    block_m, block_n = (32, 32) if ieee else (64, 64)  # float32 tiles take twice the shared memory
    out = torch.empty_like(q)
    grid = (batch if tokens else 0, triton.cdiv(max_seqlen_q, block_m), num_heads)
    launch(
        _paged_prefill_kernel,
        grid,
        q,
        k_cache,
        v_cache,
        page_table,
        rows,
        cu_seqlens_q,
        seqlens,
        out,
        *kv_strides,
        out.stride(0),
        out.stride(1),
        scale,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        IEEE=ieee,
        num_warps=4,
        num_stages=2,
    )
    return out
