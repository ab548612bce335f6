"""Incremental detokenisation: turn a stream of token ids into a stream of text pieces.

Decoding each token on its own goes wrong in two ways. A byte-level BPE token may hold part of a
UTF-8 character (an emoji is four bytes, often two or more tokens): decoded alone it gives U+FFFD,
the replacement character. And some decoders change a token's text by its neighbours (a
SentencePiece-style decoder drops the space that starts the first token). So each step decodes a
short window of recent tokens twice, with and without the new ones, and sends the difference; it
sends nothing while the text ends in an incomplete character. The pieces, joined, equal decoding all
the tokens at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

REPLACEMENT = "\ufffd"  # what a decoder puts where bytes are not (yet) a whole UTF-8 character


@dataclass
class DecodeState:
    """One request's progress. The text of `ids[:read_offset]` has been sent; `ids[prefix_offset:
    read_offset]` are the tokens decoded again as context for the new ones."""

    ids: List[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0


def next_text(tokenizer, state: DecodeState, new_ids: List[int], finished: bool) -> str:
    """The text that `new_ids` add to a request's output, never half a character.

    Receives: `tokenizer`, a `tokenizers.Tokenizer` (its `decode(ids)` drops special tokens such as
        EOS); `state`, the request's DecodeState; `new_ids`, its next token ids (usually one);
        `finished`, True with the request's last tokens.
    Returns: a str: the new text; "" while nothing new can be sent (a character still misses
        bytes); never ending in U+FFFD unless `finished` (then whatever is left, as decoding
        everything would give it).
    Leaves: `new_ids` appended to `state.ids`; when text is returned, `prefix_offset` moved to the
        old `read_offset` and `read_offset` to the end; while waiting, both offsets unchanged.
    Uses: `tokenizer.decode`.
    Checked: the pieces joined equal `tokenizer.decode` of all the ids, for any split of the ids
        into steps, on a byte-level BPE tokenizer with multi-byte characters; no piece holds half a
        character; a window, not the whole output, is decoded at each step.
    """
    state.ids.extend(new_ids)
    before = tokenizer.decode(state.ids[state.prefix_offset : state.read_offset])
    after = tokenizer.decode(state.ids[state.prefix_offset :])
    if not finished and (len(after) <= len(before) or after.endswith(REPLACEMENT)):
        return ""  # nothing new yet, or the last character is still missing bytes
    state.prefix_offset, state.read_offset = state.read_offset, len(state.ids)
    return after[len(before) :]
