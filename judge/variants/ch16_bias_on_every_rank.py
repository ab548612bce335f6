"""The bias added by every rank before the all-reduce, as a plain `Linear` adds it.

Each rank's product is a partial sum, and the all-reduce adds them; a bias added on each rank is
added once per rank, so the output is off by (ranks - 1) times the bias. Models without biases in
o_proj and down_proj (the bundled Qwen3) hide it; an attention with biases shows it at once.
"""


def forward(self, x):
    y = F.linear(x, self.weight, self.bias if self._has_bias else None)  # the bug: before the sum
    return self._comm.all_reduce(y)
