"""Sampling that filters the raw logits and divides by the temperature only afterwards.

Top-k does not care, but the top-p nucleus is then taken from softmax(logits) instead of
softmax(logits / T): at T = 0.5 it keeps far more tokens than it should, at T = 2 far fewer.
"""


def sample(self, logits, args):
    greedy = logits.argmax(dim=-1)
    if args.temperatures is None:
        return greedy.to(torch.int32)
    temps = args.temperatures.clamp_min(1e-6).unsqueeze(1)
    filtered = top_k_top_p_filter(logits.float(), args.top_k, args.top_p) / temps
    probs = filtered.softmax(dim=-1)
    drawn = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
    return torch.where(args.temperatures == 0, greedy, drawn).to(torch.int32)
