"""The drafter protocol: what the scheduler asks of whatever proposes draft tokens.

A drafter reads a request's host tokens (`req.input_ids`: the prompt and every accepted output
token, the newest included) and proposes up to k tokens to follow them. There is no commit or
rollback call: a drafter that keeps state per request (a draft model's KV) compares what it has
for `req.uid` with `req.input_ids` at each `propose` and drops what no longer matches. `release`
frees that state when the request ends, is aborted or is retracted.
"""

from __future__ import annotations

from typing import List, Protocol, runtime_checkable

from minisgl.core import Req

from .lookup import propose_lookup


@runtime_checkable
class Drafter(Protocol):
    def propose(self, reqs: List[Req], k: int) -> List[List[int]]:
        """Up to k draft tokens for each request, from its host tokens `req.input_ids`."""
        ...

    def release(self, req: Req) -> None:
        """The request finished, was aborted or retracted: free everything kept for it."""
        ...


class LookupDrafter:
    """Prompt lookup (`propose_lookup`) over each request's own tokens: stateless."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not (isinstance(min_ngram, int) and isinstance(max_ngram, int)) or not (
            1 <= min_ngram <= max_ngram
        ):
            raise ValueError(
                f"LookupDrafter needs integers 1 <= min_ngram <= max_ngram, got "
                f"min_ngram={min_ngram!r}, max_ngram={max_ngram!r}"
            )
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, reqs: List[Req], k: int) -> List[List[int]]:
        return [
            propose_lookup(r.input_ids.tolist(), k, self.max_ngram, self.min_ngram) for r in reqs
        ]

    def release(self, req: Req) -> None:
        pass  # nothing is kept per request
