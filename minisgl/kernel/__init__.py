from .ops import apply_rope_neox, fused_add_rms_norm, rms_norm, silu_and_mul

__all__ = ["apply_rope_neox", "fused_add_rms_norm", "rms_norm", "silu_and_mul"]
