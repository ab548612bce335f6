"""A request's constraint as plain JSON (it travels in messages): a dict with exactly one key.

    {"json_schema": {...}}    a JSON value valid under this JSON schema (draft 2020-12 subset
                              llguidance covers: objects, arrays with bounds, enums, numbers with
                              ranges, strings with patterns and lengths, $ref, anyOf...)
    {"json_object": True}     any JSON object
    {"regex": "..."}          text matching this regular expression (whole output)
    {"choice": ["a", "b"]}    exactly one of these strings
    {"lark": "..."}           text of this Lark (EBNF) grammar, llguidance's dialect

JSON is generated compactly (no whitespace between tokens): a small model given freedom to add
spaces may add them forever.
"""

from __future__ import annotations

import json
from typing import Any

CONSTRAINT_KINDS = ("json_schema", "json_object", "regex", "choice", "lark")


def check_constraint(constraint: Any) -> None:
    """Raise TypeError or ValueError naming what is wrong with `constraint` (None is no
    constraint). Only the form is checked here; whether the grammar compiles is the scheduler's
    intake's question (it has the tokenizer)."""
    if constraint is None:
        return
    if not isinstance(constraint, dict) or len(constraint) != 1:
        raise TypeError(
            f"constraint must be a dict with one key of {list(CONSTRAINT_KINDS)}, "
            f"got {constraint!r}"
        )
    ((kind, value),) = constraint.items()
    if kind not in CONSTRAINT_KINDS:
        raise ValueError(f"constraint kind must be one of {list(CONSTRAINT_KINDS)}, got {kind!r}")
    if kind == "json_schema" and not isinstance(value, (dict, bool)):
        raise TypeError(f"constraint json_schema must be a JSON schema (a dict), got {value!r}")
    if kind == "json_object" and value is not True:
        raise ValueError(f"constraint json_object must be True, got {value!r}")
    if kind in ("regex", "lark") and (not isinstance(value, str) or not value):
        raise TypeError(f"constraint {kind} must be a non-empty string, got {value!r}")
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(s, str) for s in value):
            raise TypeError(f"constraint choice must be a non-empty list of strings, got {value!r}")
        if any(s == "" for s in value):
            raise ValueError("constraint choice must not hold an empty string")


def grammar_text(constraint: dict) -> str:
    """The constraint as an llguidance grammar (its JSON form), for LLMatcher."""
    import llguidance

    ((kind, value),) = constraint.items()
    compact = {"whitespace_flexible": False}
    if kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(value, defaults=compact)
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=compact)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(value)
    if kind == "choice":  # JSON string escapes are Lark's string literal escapes
        return llguidance.LLMatcher.grammar_from_lark(
            "start: " + " | ".join(json.dumps(s) for s in value)
        )
    return llguidance.LLMatcher.grammar_from_lark(value)
