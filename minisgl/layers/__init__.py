from .attention import AttentionLayer
from .base import BaseOP, OPList
from .embedding import LMHead, VocabEmbedding
from .gated_attention import GatedAttention
from .linear import Linear
from .norm import RMSNorm
from .rotary import RotaryEmbedding

__all__ = [
    "AttentionLayer",
    "BaseOP",
    "OPList",
    "GatedAttention",
    "LMHead",
    "VocabEmbedding",
    "Linear",
    "RMSNorm",
    "RotaryEmbedding",
]
