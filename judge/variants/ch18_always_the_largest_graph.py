"""Every decode batch that fits runs in the largest graph.

The tokens are right (the padding is dummy requests), but a batch of one pays for a batch of
max_bs: on a GPU the graph of 64 costs about twice the graph of 1 (the H200's 2.44 ms against
1.12 ms a step), which is the whole point of capturing several sizes.
"""


def graph_size(self, batch):
    meta = batch.attn_metadata
    if not batch.is_decode or meta is None or meta.rows is None or batch.size > self.max_bs:
        return None
    return self.max_bs  # the bug: not the smallest size that holds the batch
