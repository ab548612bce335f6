"""The text side of stops, shared by `LLM.generate` and the server's tokenizer worker: where a
request's text ends, why it finished, and how much of a stream's text may be sent yet.

The scheduler decides *that* a request stopped (minisgl/scheduler/stops.py); the text returned
ends before the first stop string (OpenAI's rule: the stop string itself is not returned), and a
stop token id, like EOS, is not shown.
"""

from __future__ import annotations

from typing import Iterable, List, Sequence

from minisgl.core import SamplingParams


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the first stop string in `text` begins, or None."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of `text` could be the start of a stop string: a stream
    must not send them until the next tokens say whether they are."""
    longest = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest


def finish_reason(
    token_ids: Sequence[int], params: SamplingParams, eos_ids: Iterable[int], stopped_by_text: bool
) -> str:
    """ "stop" when the model ended the request (EOS, a stop token id, a stop string), else
    "length" (max_tokens reached)."""
    last = token_ids[-1] if token_ids else None
    if stopped_by_text or last in params.stop_token_ids:
        return "stop"
    if last is not None and last in set(eos_ids) and not params.ignore_eos:
        return "stop"
    return "length"


def visible_ids(token_ids: List[int], params: SamplingParams) -> List[int]:
    """The ids whose text is shown: without a last stop token id, and none for max_tokens 0."""
    if params.max_tokens == 0:
        return []
    if token_ids and token_ids[-1] in params.stop_token_ids:
        return token_ids[:-1]
    return token_ids
