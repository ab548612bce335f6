"""The pieces cast to float32 before the gather, so bfloat16 logits come back as float32.

The values are the same, but the result is no longer in the model's dtype: every later step
that expects the logits' dtype (a bfloat16 engine's sampler, a CUDA graph's output buffer) gets
another one.
"""

import torch.distributed as dist


def all_gather(self, x, dim=-1):
    if self.size == 1:
        return x
    x = x.contiguous().float()  # the bug: the dtype changed
    parts = [torch.empty_like(x) for _ in range(self.size)]
    with self._timed("all_gather"):
        dist.all_gather(parts, x, group=self._group)
    return torch.cat(parts, dim=dim)
