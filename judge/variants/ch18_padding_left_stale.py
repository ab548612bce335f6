"""The padding slots left as the previous replay left them.

After a batch of four, a batch of three runs in the same graph; slot 3 still holds the fourth
request's token, position, row and KV location, so the padding recomputes that request's step and
writes its KV where that request's last token lives: a location that may belong to someone else
by now. The three real requests get the right logits; the damage is in the cache.
"""


def replay(self, batch, padded):
    bs = batch.size
    meta = batch.attn_metadata
    self.input_ids[:bs].copy_(batch.input_ids)
    self.positions[:bs].copy_(batch.positions)
    self.out_loc[:bs].copy_(batch.out_loc)
    self.rows[:bs].copy_(meta.rows)
    self.seqlens[:bs].copy_(meta.cache_seqlens)
    # the bug: no dummy requests in slots bs..padded-1
    graph, logits = self.graphs[padded]
    graph.replay()
    self.replays += 1
    return logits[:bs]
