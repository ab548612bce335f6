"""minisgl: a compact LLM inference engine in the style of SGLang, built chapter by chapter.

from minisgl import LLM, SamplingParams
llm = LLM()  # the bundled Shakespeare model
print(llm.generate(["ROMEO:"], SamplingParams(max_tokens=30))[0]["text"])
"""

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    # Imported only when asked for: LLM pulls in the whole engine and SamplingParams torch, while
    # `import minisgl.env` must stay light (the judge reads its settings without torch).
    if name == "LLM":
        from .llm import LLM

        return LLM
    if name == "SamplingParams":
        from .core import SamplingParams

        return SamplingParams
    raise AttributeError(name)
