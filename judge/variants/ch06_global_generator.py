"""Sampling that draws from torch's global generator instead of the sampler's own.

`torch.multinomial(probs, 1)` without `generator=`: the engine's seed no longer decides the
draws, whatever else the process draws moves them, and two engines with the same seed give
different text.
"""


def sample(self, logits, args):
    greedy = logits.argmax(dim=-1)
    if args.temperatures is None:
        return greedy.to(torch.int32)
    temps = args.temperatures.clamp_min(1e-6).unsqueeze(1)
    probs = top_k_top_p_filter(logits.float() / temps, args.top_k, args.top_p).softmax(dim=-1)
    drawn = torch.multinomial(probs, 1).squeeze(1)  # the bug: the global generator
    return torch.where(args.temperatures == 0, greedy, drawn).to(torch.int32)
