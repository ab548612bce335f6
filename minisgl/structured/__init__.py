"""Structured output: a request's constraint (JSON schema, any JSON object, regular expression,
choice among strings, Lark grammar), compiled by llguidance into a matcher that masks each step's
logits to the tokens the grammar allows.

constraint.py  the constraint's forms and their checks (plain Python: it travels in messages)
grammars.py    the model's llguidance tokenizer, the compile check at the door, matchers, bitmasks
bitmask.py     the bitmask applied to logits on the device (torch only)

The scheduler's side (matchers' life, the mask filled between forward and sampling) is
minisgl/scheduler/grammar_steps.py; the engine's split step is minisgl/engine/split_step.py.
"""

from .constraint import CONSTRAINT_KINDS, check_constraint

__all__ = ["CONSTRAINT_KINDS", "check_constraint"]
