"""`apply_rope` that computes the rotation angles in x's dtype.

In float32 nothing shows. In bfloat16 (8 bits of precision) position 1001 becomes 1000 and an angle
of hundreds of radians is off by whole radians: the angles must be computed in float32 and only
cos and sin cast to x's dtype.
"""


def apply_rope(x, positions, theta):
    head_dim = x.shape[-1]
    half = head_dim // 2
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=x.device) / head_dim)
    )
    # the bug: x's dtype, not float32
    angles = positions.to(x.dtype).unsqueeze(1) * inv_freq.to(x.dtype)
    cos, sin = angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
