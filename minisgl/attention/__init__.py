from .metadata import AttentionMetadata, prepare_metadata
from .torch_backend import TorchAttentionBackend

__all__ = ["AttentionMetadata", "prepare_metadata", "TorchAttentionBackend"]
