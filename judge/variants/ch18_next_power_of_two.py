"""The graph size computed as the next power of two of the batch size.

Right while max_bs is a power of two (the sizes are then 1, 2, 4, ..., max_bs); with max_bs = 6
(cuda_graph_max_bs is at most max_running_req, which may be anything) the sizes are 1, 2, 4, 6, and
a batch of 5 asks for a graph of 8 that was never captured.
"""


def graph_size(self, batch):
    meta = batch.attn_metadata
    if not batch.is_decode or meta is None or meta.rows is None or batch.size > self.max_bs:
        return None
    return 1 << (batch.size - 1).bit_length()  # the bug: not one of self.sizes
