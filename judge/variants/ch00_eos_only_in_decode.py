"""`generate` that looks for the EOS only among the decode steps' tokens.

The prefill's token is a generated token like any other: when it is the EOS, generation must stop
right there with that one token. This version takes it, then decodes, and checks only the later
tokens, so a prompt whose first continuation is the EOS runs on.
"""


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=None):
    cache = KVCache(model.config.num_layers)
    logits = forward(model, torch.tensor(list(prompt_ids)), torch.arange(len(prompt_ids)), cache)
    out = [int(logits[-1].argmax())]  # the bug: this token is never compared with the EOS
    while len(out) < max_new_tokens:
        logits = forward(model, torch.tensor([out[-1]]), torch.tensor([len(cache)]), cache)
        out.append(int(logits[-1].argmax()))
        if out[-1] == eos_token_id:
            break
    return out
