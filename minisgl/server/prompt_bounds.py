"""A prompt too long for the context, refused before the costly part of reading it.

A prompt of token ids is measured by its length, before it is sent on. A text is measured by its
characters before it is tokenized: no token covers more characters than the tokenizer's longest
vocabulary entry (a byte-level entry's characters are its bytes, each at most one character of the
text; a SentencePiece entry's are its own), so a text of N characters has at least N / longest
tokens, and one whose bound already passes the context is refused without the seconds its
tokenization would hold the tokenizer worker (10 s for a million characters on one CPU core).
The bound assumes the tokenizer's normalizer deletes no characters (byte-level BPE and
SentencePiece tokenizers have none that do).
"""

from __future__ import annotations

from .openai_api import ErrorInfo

CONTEXT_CODE = "context_length_exceeded"


def longest_token_chars(tokenizer) -> int:
    """The most characters one token of `tokenizer` (a `tokenizers.Tokenizer`) can stand for."""
    return max((len(piece) for piece in tokenizer.get_vocab(with_added_tokens=True)), default=1)


def ids_refusal(n_ids: int, max_tokens: int | None, context_len: int) -> ErrorInfo | None:
    """The 400 for `n_ids` prompt ids and `max_tokens` (None: what the context leaves) that can
    never fit `context_len`, in the scheduler's words (intake.py), or None."""
    wanted = 1 if max_tokens is None else max(max_tokens, 1)  # one token at least is sampled
    if n_ids + wanted <= context_len:
        return None
    return ErrorInfo(
        400,
        f"prompt ({n_ids} tokens) + max_tokens ({wanted}) exceeds the context length {context_len}",
        param="prompt",
        code=CONTEXT_CODE,
    )


def text_refusal(n_chars: int, longest: int, context_len: int) -> str | None:
    """Why a text of `n_chars` characters cannot fit `context_len` tokens, when no token is longer
    than `longest` characters; None when it might."""
    at_least = -(-n_chars // max(longest, 1))
    if at_least < context_len:
        return None
    return (
        f"prompt ({n_chars} characters, so at least {at_least} tokens: no token of this "
        f"tokenizer is longer than {longest} characters) exceeds the context length {context_len}"
    )
