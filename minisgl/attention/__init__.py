from .metadata import AttentionMetadata, prepare_metadata
from .select import create_attention_backend, triton_available
from .torch_backend import TorchAttentionBackend

__all__ = [
    "AttentionMetadata",
    "prepare_metadata",
    "TorchAttentionBackend",
    "create_attention_backend",
    "triton_available",
]
