"""RoPE with interleaved pairs (GPT-J layout) instead of NeoX halves.

Dimensions (0, 1), (2, 3), ... are rotated together, as in the original RoPE paper, but Qwen3 and
Llama checkpoints pair dimension i with dimension i + head_dim/2. Norms are kept and position 0 is
still the identity, so only a comparison with Hugging Face shows it.
"""


def apply_rope(x, positions, theta):
    head_dim = x.shape[-1]
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=x.device) / head_dim)
    )
    angles = positions.to(torch.float32).unsqueeze(1) * inv_freq
    cos = angles.cos().to(x.dtype).unsqueeze(1)
    sin = angles.sin().to(x.dtype).unsqueeze(1)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # the bug: even/odd pairs
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x2 * cos + x1 * sin
    return out
