"""Upstream mini-sglang #98: the logits gathered into one flat tensor, then reshaped.

`all_gather_into_tensor` stacks the ranks' [batch, rows] pieces along the first dimension: rank
0's whole batch, then rank 1's. Reshaping that to [batch, ranks * rows] is right for a batch of
one row only; with more, row 0 of the result holds rank 0's rows 0 and 1 instead of row 0 of each
rank, and every request but the first samples from another's logits.
"""


def all_gather(self, x, dim=-1):
    if self.size == 1:
        return x
    import torch.distributed as dist

    x = x.contiguous()
    flat = x.new_empty((self.size * x.shape[0],) + tuple(x.shape[1:]))
    with self._timed("all_gather"):
        dist.all_gather_into_tensor(flat, x, group=self._group)
    return flat.reshape(x.shape[0], -1)  # the bug: interleaves the rows of a batch
