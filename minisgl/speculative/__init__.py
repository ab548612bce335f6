"""Speculative decoding (chapter 24, issue 47): drafters propose tokens, the target verifies them
in one forward over the paged cache (minisgl/scheduler/speculative.py runs the step)."""

from .drafter import Drafter, LookupDrafter

__all__ = ["Drafter", "LookupDrafter"]
