"""RoPE with interleaved pairs (GPT-J layout) instead of NeoX halves.

Rotating dimensions (0, 1), (2, 3), ... together keeps every norm and leaves position 0 alone, so
shape and identity checks pass; the model's outputs no longer match Hugging Face.
"""


def apply_rope_neox(x, cos, sin):
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # the bug: even/odd pairs
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x2 * cos + x1 * sin
    return out
