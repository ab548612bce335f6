"""The model's side of structured output: its tokenizer as llguidance sees it, the compile check a
request meets at the door, one matcher per constrained request, and the step's bitmask.

llguidance is a default dependency (3 MB, no dependencies of its own; chosen by measurement:
benchmarks/results/2026-12-06-grammar-libraries.txt). It is imported only when a constraint is
asked for, and a model directory without tokenizer.json cannot take one.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from .constraint import grammar_text


class GrammarBook:
    """Compiles constraints for one model. `tokenizer` is its tokenizers.Tokenizer (or None),
    `vocab_size` the width of its logits, `end_ids` its end-of-sequence ids: the tokens a matcher
    allows where the grammar may end."""

    def __init__(self, tokenizer, vocab_size: int, end_ids: Iterable[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.end_ids = sorted(end_ids)
        self._ll_tokenizer = None
        self._executor = None

    @property
    def ll_tokenizer(self):
        if self._ll_tokenizer is None:
            import llguidance

            self._ll_tokenizer = llguidance.LLTokenizer(
                self.tokenizer.to_str(), n_vocab=self.vocab_size, eos_token=self.end_ids
            )
            # llguidance builds its tables of the vocabulary at the first mask (4 s for 151,936
            # tokens, once per tokenizer; then ~0.2 ms a mask): here, at the first constrained
            # request's admission, rather than inside a step with other requests waiting
            self.bitmask([self.matcher({"regex": "a"})])
        return self._ll_tokenizer

    def refusal(self, constraint: dict | None) -> str | None:
        """Why `constraint` cannot be honoured for this model (the library's compile error), or
        None."""
        if constraint is None:
            return None
        if self.tokenizer is None:
            return "a constraint needs the model's tokenizer (this model directory has none)"
        if not self.end_ids:
            return "a constraint needs an end-of-sequence token, and this model has none"
        try:
            import llguidance
        except ImportError:
            return "a constraint needs the llguidance package: pip install llguidance"
        try:
            grammar = grammar_text(constraint)
        except ValueError as e:
            return f"the constraint does not compile: {e}"
        try:  # the library's set-up for this tokenizer, at the first constraint
            tokenizer = self.ll_tokenizer
        except Exception as e:  # any library's failure refuses the request, never the scheduler
            version = getattr(llguidance, "__version__", "?")
            return f"llguidance {version} cannot serve this tokenizer: {type(e).__name__}: {e}"
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        return f"the constraint does not compile: {error.strip()}" if error else None

    def matcher(self, constraint: dict):
        """A fresh matcher at the grammar's start (the constraint passed `refusal`)."""
        import llguidance

        matcher = llguidance.LLMatcher(self.ll_tokenizer, grammar_text(constraint))
        if matcher.is_error():
            raise ValueError(f"the constraint does not compile: {matcher.get_error()}")
        return matcher

    def bitmask(self, matchers: Sequence) -> torch.Tensor:
        """[len(matchers), ceil(vocab/32)] int32 on the host: bit j of word w of row i set when
        token 32 w + j may come next for matchers[i]."""
        import llguidance.torch as llt

        mask = llt.allocate_token_bitmask(len(matchers), self.ll_tokenizer.vocab_size)
        if len(matchers) == 1:
            llt.fill_next_token_bitmask(matchers[0], mask, 0)
        elif matchers:  # rows filled in parallel on llguidance's own threads (outside the GIL)
            llt.fill_next_token_bitmask_par(
                self.executor, list(zip(matchers, range(len(mask)))), mask
            )
        return mask

    @property
    def executor(self):
        if self._executor is None:
            import llguidance

            self._executor = llguidance.LLExecutor()
        return self._executor
