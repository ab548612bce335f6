"""The batch's tensors bound to the buffer names instead of copied into the buffers.

`self.positions = batch.positions` makes the attribute name a new tensor; the graph captured the
old tensor and reads it at every replay, so the step computes the capture's dummy inputs (or the
last values copied in) and gives plausible but wrong tokens, with no error.
"""


def replay(self, batch, padded):
    bs = batch.size
    meta = batch.attn_metadata
    self.input_ids = batch.input_ids  # the bug: rebinding, where the graph reads the old tensors
    self.positions = batch.positions
    self.out_loc = batch.out_loc
    self.rows = meta.rows
    self.seqlens = meta.cache_seqlens
    graph, logits = self.graphs[padded]
    graph.replay()
    self.replays += 1
    return logits[:bs]
