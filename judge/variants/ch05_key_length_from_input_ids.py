"""`prepare_metadata` that takes each request's key length from the tokens the CPU has received
(`len(req.input_ids)`) instead of `device_len`.

The two agree in the normal loop, where a step is built only after the last one's token arrived.
With overlap scheduling (chapter 11) the next decode step is built while that token is still on its
way: `device_len` already counts it, `input_ids` do not, so every query misses its own key.
"""


def prepare_metadata(batch, page_table, device):
    seqlens_q = [req.extend_len for req in batch.reqs]
    seqlens_k = [len(req.input_ids) for req in batch.reqs]  # the bug: req.device_len
    cu = [0]
    for n in seqlens_q:
        cu.append(cu[-1] + n)
    cu_seqlens_q = torch.tensor(cu, dtype=torch.int32)
    max_k = max(seqlens_k)
    rows = torch.tensor([req.table_idx for req in batch.reqs], dtype=torch.int64).to(device)
    return AttentionMetadata(
        cu_seqlens_q=cu_seqlens_q.to(device),
        cache_seqlens=torch.tensor(seqlens_k, dtype=torch.int32).to(device),
        page_table=page_table[rows, :max_k],
        last_indices=(cu_seqlens_q[1:] - 1).to(torch.int64).to(device),
        max_seqlen_q=max(seqlens_q),
        max_seqlen_k=max_k,
    )
