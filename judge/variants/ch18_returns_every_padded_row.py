"""The graph's whole logits tensor returned, one row per slot, padding included.

A batch of three in the graph of four gets four rows of logits: the sampler would sample a token
for a request that does not exist.
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
        for name, value in self._dummy.items():
            getattr(self, name)[bs:padded].fill_(value)
    graph, logits = self.graphs[padded]
    graph.replay()
    self.replays += 1
    return logits  # the bug: the padding's rows too
