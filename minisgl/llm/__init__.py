from minisgl.models.tokenizer import load_tokenizer

from .llm import LLM, RequestResult
from .parallel import TensorParallelLLM

LLM.tensor_parallel_class = TensorParallelLLM  # LLM(model, tp_size=N > 1) builds one

__all__ = ["LLM", "RequestResult", "TensorParallelLLM", "load_tokenizer"]
