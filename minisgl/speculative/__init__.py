"""Speculative decoding: a cheap drafter proposes a few tokens, the target model scores them all
in one forward over the paged cache, and an acceptance rule keeps the ones the target would have
produced itself (minisgl/scheduler/speculative.py runs the step).

`lookup.propose_lookup` drafts by prompt lookup (no model; `drafter.LookupDrafter` wraps it);
`accept.verify_greedy` and `accept.verify_sampled` are the acceptance rules (chapter 24 has them
as exercises).
"""

from minisgl.speculative.accept import check_verify_inputs, verify_greedy, verify_sampled
from minisgl.speculative.drafter import Drafter, LookupDrafter
from minisgl.speculative.lookup import propose_lookup

__all__ = [
    "Drafter",
    "LookupDrafter",
    "check_verify_inputs",
    "propose_lookup",
    "verify_greedy",
    "verify_sampled",
]
