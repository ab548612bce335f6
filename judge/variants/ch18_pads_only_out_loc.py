"""Only out_loc of the padding slots set to the dummy's (the scratch location); input_ids,
positions, rows and seqlens keep the previous batch's values there.

No KV lands outside the scratch location, and the batch's own logits are right, but the padding
slots compute a previous request's step on its row, which the contract rules out: every buffer's
padding holds the dummy request.
"""


def replay(self, batch, padded):
    bs = batch.size
    meta = batch.attn_metadata
    self.input_ids[:bs].copy_(batch.input_ids)
    self.positions[:bs].copy_(batch.positions)
    self.out_loc[:bs].copy_(batch.out_loc)
    self.rows[:bs].copy_(meta.rows)
    self.seqlens[:bs].copy_(meta.cache_seqlens)
    if padded > bs:  # a larger batch may have left real requests in the padding slots
        self.out_loc[bs:padded].fill_(self._dummy["out_loc"])  # the bug: the other buffers stale
    graph, logits = self.graphs[padded]
    graph.replay()
    self.replays += 1
    return logits[:bs]
