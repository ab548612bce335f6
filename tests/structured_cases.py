"""JSON schemas and regular expressions the structured-output tests run the bundled model under:
nested objects, arrays with bounds, enums, numbers with ranges, strings with patterns and lengths.
Strings and integers are bounded (maxLength, pattern, enum, a range) so that a 5.8 M-parameter
model reaches the end of each within a few dozen tokens. Fractions are the exception: a "number"
may take digits after its point without end (greedily, "1.000000..."), so only the number array
below, which the model leaves empty, has them."""

from __future__ import annotations

# the four chapter 22 shows are the ones its page and try-outs use: one copy, in the shipped
# package
from classroom.grammar_runs import NAME
from classroom.grammar_runs import SCHEMAS as CHAPTER_SCHEMAS

SCHEMAS = {
    "flat_person": CHAPTER_SCHEMAS["person"],
    "enum_only": {"enum": ["Romeo", "Juliet", "Mercutio"]},
    "const_field": {
        "type": "object",
        "properties": {
            "kind": {"const": "play"},
            "acts": {"type": "integer", "minimum": 1, "maximum": 5},
        },
        "required": ["kind", "acts"],
        "additionalProperties": False,
    },
    "integer_range": {"type": "integer", "minimum": -5, "maximum": 5},
    "score_range": {
        "type": "object",
        "properties": {"score": {"type": "integer", "minimum": -300, "maximum": 300}},
        "required": ["score"],
        "additionalProperties": False,
    },
    "boolean_flags": {
        "type": "object",
        "properties": {"alive": {"type": "boolean"}, "noble": {"type": "boolean"}},
        "required": ["alive", "noble"],
        "additionalProperties": False,
    },
    "pattern_id": CHAPTER_SCHEMAS["id"],
    "array_bounds": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 2,
        "maxItems": 4,
    },
    "array_of_enums": {
        "type": "array",
        "items": {"enum": ["ay", "nay"]},
        "minItems": 1,
        "maxItems": 3,
    },
    "nested_object": CHAPTER_SCHEMAS["speaker"],
    "array_of_objects": CHAPTER_SCHEMAS["words"],
    "nullable": {
        "type": "object",
        "properties": {"title": {"type": ["string", "null"], "maxLength": 6}},
        "required": ["title"],
        "additionalProperties": False,
    },
    "any_of": {
        "anyOf": [
            {"type": "integer", "minimum": 0, "maximum": 99},
            {"type": "string", "pattern": "^[a-z]{1,5}$"},
        ]
    },
    "ref_defs": {
        "$defs": {"who": {"type": "string", "enum": ["Lear", "Cordelia"]}},
        "type": "object",
        "properties": {"from": {"$ref": "#/$defs/who"}, "to": {"$ref": "#/$defs/who"}},
        "required": ["from", "to"],
        "additionalProperties": False,
    },
    "string_lengths": {"type": "string", "minLength": 3, "maxLength": 7},
    "exclusive_bounds": {
        "type": "object",
        "properties": {"x": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 4}},
        "required": ["x"],
        "additionalProperties": False,
    },
    "optional_fields": {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": NAME},
        "required": ["a"],
        "additionalProperties": False,
    },
    "deep_nesting": {
        "type": "object",
        "properties": {
            "act": {
                "type": "object",
                "properties": {
                    "scene": {
                        "type": "object",
                        "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
                        "required": ["n"],
                        "additionalProperties": False,
                    }
                },
                "required": ["scene"],
                "additionalProperties": False,
            }
        },
        "required": ["act"],
        "additionalProperties": False,
    },
    "tuple_prefix_items": {
        "type": "array",
        "prefixItems": [{"enum": ["to", "not"]}, {"type": "integer", "minimum": 0, "maximum": 9}],
        "items": False,
        "minItems": 2,
    },
    "pydantic_like": {
        "title": "Verdict",
        "type": "object",
        "properties": {
            "guilty": {"title": "Guilty", "type": "boolean"},
            "reason": {"title": "Reason", "type": "string", "maxLength": 10},
            "years": {"title": "Years", "type": "integer", "minimum": 0, "maximum": 30},
        },
        "required": ["guilty", "reason", "years"],
        "additionalProperties": False,
    },
    "date_pattern": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
    "number_array_unique_len": {
        "type": "object",
        "properties": {
            "xs": {
                "type": "array",
                "items": {"type": "number", "minimum": -1, "maximum": 1},
                "maxItems": 3,
            },
            "tag": {"enum": ["a", "b"]},
        },
        "required": ["xs", "tag"],
        "additionalProperties": False,
    },
}

REGEXES = {
    "yes_or_no": r"(yes|no)",
    "phone": r"[0-9]{3}-[0-9]{4}",
    "word_then_bang": r"[A-Z][a-z]{1,6}!",
    "hex_color": r"#[0-9a-f]{6}",
}

CHOICES = ["Montague", "Capulet", "neither"]
