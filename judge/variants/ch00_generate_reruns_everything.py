"""`generate` that runs the whole sequence through the model at every step, with a fresh cache.

The tokens are right (it is what a model without a KV cache does), but step n computes the keys
and values of all n tokens again: the work grows with the square of the length, which is what the
KV cache exists to avoid.
"""
# whole function: no cache kept across steps, a loop of its own (an edit would be the whole body)


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=None):
    out = []
    while True:
        seq = list(prompt_ids) + out
        cache = KVCache(model.config.num_layers)  # the bug: nothing is kept between steps
        logits = forward(model, torch.tensor(seq), torch.arange(len(seq)), cache)
        out.append(int(logits[-1].argmax()))
        if len(out) == max_new_tokens or out[-1] == eos_token_id:
            return out
