"""`generate` that runs the model once more after its output is complete.

Every token it returns is right, but each call pays one forward pass whose logits nobody reads:
the step computes the next token's logits before it asks whether another token is wanted. On a
long prompt that is one more pass through every layer per request, for nothing.
"""


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=None):
    cache = KVCache(model.config.num_layers)
    logits = forward(model, torch.tensor(list(prompt_ids)), torch.arange(len(prompt_ids)), cache)
    out = []
    while True:
        next_id = int(logits[-1].argmax())
        out.append(next_id)
        logits = forward(model, torch.tensor([next_id]), torch.tensor([len(cache)]), cache)
        if next_id == eos_token_id or len(out) == max_new_tokens:  # the bug: asked after the pass
            return out
