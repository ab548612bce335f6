"""Only slot bs padded with the dummy request (`[bs:bs + 1]`), not every slot up to `padded`.

Right whenever one slot is padded (three requests in the graph of four); a batch with several
padding slots leaves the others as the previous, larger batch left them: they recompute its
requests' steps and write KV at their locations.
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
            getattr(self, name)[bs : bs + 1].fill_(value)  # the bug: one slot
    graph, logits = self.graphs[padded]
    graph.replay()
    self.replays += 1
    return logits[:bs]
