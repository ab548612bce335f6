from .llm import LLM, RequestResult, load_tokenizer

__all__ = ["LLM", "RequestResult", "load_tokenizer"]
