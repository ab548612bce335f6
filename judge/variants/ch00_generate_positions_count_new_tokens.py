"""`generate` that gives a decode token the position len(out), counting only the new tokens.

The first new token should sit right after the prompt, at len(prompt); here it sits at 1, so RoPE
places it inside the prompt and every later token is predicted from a scrambled order.
"""


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens, eos_token_id=None):
    cache = KVCache(model.config.num_layers)
    logits = forward(model, torch.tensor(list(prompt_ids)), torch.arange(len(prompt_ids)), cache)
    out = []
    while True:
        out.append(int(logits[-1].argmax()))
        if len(out) == max_new_tokens or out[-1] == eos_token_id:
            return out
        position = len(out)  # the bug: the prompt's tokens are not counted
        logits = forward(model, torch.tensor([out[-1]]), torch.tensor([position]), cache)
