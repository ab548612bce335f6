"""minisgl: a compact LLM inference engine in the style of SGLang, built chapter by chapter.

    from minisgl import LLM, SamplingParams
    llm = LLM()  # the bundled Shakespeare model
    print(llm.generate(["ROMEO:"], SamplingParams(max_tokens=30))[0]["text"])
"""

from .core import SamplingParams

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    # LLM pulls in the whole engine; import it only when asked for, so `import minisgl.core` stays light.
    if name == "LLM":
        from .llm import LLM

        return LLM
    raise AttributeError(name)
