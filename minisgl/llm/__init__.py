from minisgl.models.tokenizer import load_tokenizer

from .llm import LLM, RequestResult

__all__ = ["LLM", "RequestResult", "load_tokenizer"]
