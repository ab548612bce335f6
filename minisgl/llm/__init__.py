from .llm import LLM, RequestResult

__all__ = ["LLM", "RequestResult"]
