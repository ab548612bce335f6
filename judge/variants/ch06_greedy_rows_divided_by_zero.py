"""Sampling that divides every row by its temperature, greedy rows (T = 0) included.

A greedy row's logits over 0 are inf and nan, its softmax nan, and `torch.multinomial` refuses the
whole batch ("probability tensor contains either `inf`, `nan` or element < 0"): one greedy request
next to a sampled one stops every step.
"""


def sample(self, logits, args):
    greedy = logits.argmax(dim=-1)
    if args.temperatures is None:
        return greedy.to(torch.int32)
    temps = args.temperatures.unsqueeze(1)  # the bug: no clamp, 0 divides
    probs = top_k_top_p_filter(logits.float() / temps, args.top_k, args.top_p).softmax(dim=-1)
    drawn = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
    return torch.where(args.temperatures == 0, greedy, drawn).to(torch.int32)
