"""The partial sums all-reduced with torch.distributed directly, around the layer's `self._comm`.

The values come out right where the default group is the layer's group (here it is), but the
collective is neither counted nor timed (the engine's count of 2 * layers + 1 all-reduces a
forward, the benchmark's share of time in communication), and a layer given another group (or a
facade that records or fakes its collectives) is bypassed.
"""

import torch.distributed as dist


def forward(self, x):
    y = local_product(x, self.weight)
    dist.all_reduce(y)  # the bug: not self._comm.all_reduce(y)
    if self._has_bias:
        y = y + self.bias
    return y
