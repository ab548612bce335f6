"""`generate` that stops at the EOS but leaves it out of the output.

The caller can no longer tell a reply that ended from one that ran out of max_new_tokens: the
output of a prompt whose first continuation is the EOS is empty.
"""


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=None):
    cache = KVCache(model.config.num_layers)
    logits = forward(model, torch.tensor(list(prompt_ids)), torch.arange(len(prompt_ids)), cache)
    out = []
    while True:
        next_id = int(logits[-1].argmax())
        if next_id == eos_token_id:
            return out  # the bug: the EOS belongs to the output
        out.append(next_id)
        if len(out) == max_new_tokens:
            return out
        logits = forward(model, torch.tensor([next_id]), torch.tensor([len(cache)]), cache)
