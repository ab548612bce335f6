from .config import EngineConfig
from .engine import Engine, ForwardInput, ForwardOutput
from .sampler import BatchSamplingArgs, Sampler, top_k_top_p_filter

__all__ = [
    "EngineConfig",
    "Engine",
    "ForwardInput",
    "ForwardOutput",
    "BatchSamplingArgs",
    "Sampler",
    "top_k_top_p_filter",
]
