"""Which grammar library the engine's structured output uses: compile time, mask fill per decode
step and schema coverage of llguidance, outlines-core and xgrammar, on the bundled model's
tokenizer (or --tokenizer DIR).

Each library walks the tokens of a valid instance of each schema, one at a time, as a decoding
loop does: fill the next token's bitmask, then accept the token. The figure that matters is the
fill, which runs on the CPU once per constrained request per step.

    python benchmarks/grammar_libraries.py [--tokenizer DIR] [--repeat 3]

A library that is not installed is reported as such; a schema a library refuses is counted
against its coverage with the library's error.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

ASSET = Path(__file__).resolve().parents[1] / "minisgl" / "assets" / "shakespeare-qwen3"

# (name, schema, a valid instance): what real clients send (pydantic models, tool arguments)
CASES = [
    (
        "person",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 20},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
            },
            "required": ["name", "age"],
            "additionalProperties": False,
        },
        {"name": "Juliet Capulet", "age": 13},
    ),
    (
        "order",
        {
            "type": "object",
            "properties": {
                "id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                "status": {"enum": ["open", "paid", "shipped"]},
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 4,
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string"},
                            "qty": {"type": "integer", "minimum": 1},
                            "price": {"type": "number", "minimum": 0},
                        },
                        "required": ["sku", "qty", "price"],
                    },
                },
                "note": {"type": ["string", "null"]},
            },
            "required": ["id", "status", "items"],
        },
        {
            "id": "ABC-1234",
            "status": "paid",
            "items": [
                {"sku": "quill", "qty": 2, "price": 3.5},
                {"sku": "ink", "qty": 1, "price": 1},
            ],
            "note": None,
        },
    ),
    (
        "tool_call",
        {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city", "unit"],
        },
        {"city": "Verona", "unit": "celsius", "days": 3},
    ),
    (
        "tree ($ref recursion)",
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                    },
                    "required": ["name", "children"],
                }
            },
            "$ref": "#/$defs/node",
        },
        {"name": "a", "children": [{"name": "b", "children": [{"name": "c", "children": []}]}]},
    ),
    (
        "any_object",
        {"type": "object"},
        {"a": [1, 2, {"b": "c"}], "d": True, "e": None},
    ),
]


def tokens_of(tokenizer, value) -> list[int]:
    return tokenizer.encode(json.dumps(value, separators=(",", ":")), add_special_tokens=False)


def walk_llguidance(tokenizer, schema, ids):
    import llguidance
    import llguidance.hf
    import llguidance.torch as llt

    t0 = time.perf_counter()
    lt = walk_llguidance.cache.get(id(tokenizer)) or llguidance.hf.from_tokenizer(tokenizer)
    walk_llguidance.cache[id(tokenizer)] = lt
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        schema, defaults={"whitespace_flexible": False}
    )
    matcher = llguidance.LLMatcher(lt, grammar)
    if matcher.is_error():
        raise ValueError(matcher.get_error())
    compile_s = time.perf_counter() - t0
    mask = llt.allocate_token_bitmask(1, lt.vocab_size)
    fills = []
    for tok in ids:
        t = time.perf_counter()
        llt.fill_next_token_bitmask(matcher, mask, 0)
        fills.append(time.perf_counter() - t)
        if not matcher.consume_token(tok):
            raise ValueError(f"rejected token {tok}: {matcher.get_error()}")
    return compile_s, fills


walk_llguidance.cache = {}


def walk_xgrammar(tokenizer, schema, ids):
    import xgrammar as xg

    t0 = time.perf_counter()
    compiler = walk_xgrammar.cache.get(id(tokenizer))
    if compiler is None:
        info = xg.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
        compiler = xg.GrammarCompiler(info, cache_enabled=False)
        walk_xgrammar.cache[id(tokenizer)] = compiler
    compiled = compiler.compile_json_schema(
        json.dumps(schema), any_whitespace=False, separators=(",", ":")
    )
    matcher = xg.GrammarMatcher(compiled)
    compile_s = time.perf_counter() - t0
    mask = xg.allocate_token_bitmask(1, len(tokenizer))
    fills = []
    for tok in ids:
        t = time.perf_counter()
        matcher.fill_next_token_bitmask(mask, 0)
        fills.append(time.perf_counter() - t)
        if not matcher.accept_token(tok):
            raise ValueError(f"rejected token {tok}")
    return compile_s, fills


walk_xgrammar.cache = {}


def walk_outlines(tokenizer, schema, ids):
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    t0 = time.perf_counter()
    vocab = walk_outlines.cache.get(id(tokenizer))
    if vocab is None:  # token text as outlines' own adapter builds it: byte-level BPE decoded
        mapping: dict[str, list[int]] = {}
        for token, i in tokenizer.get_vocab().items():
            if i == tokenizer.eos_token_id:
                continue
            text = tokenizer.convert_tokens_to_string([token])
            mapping.setdefault(text, []).append(i)
        vocab = Vocabulary(tokenizer.eos_token_id, mapping)
        walk_outlines.cache[id(tokenizer)] = vocab
    regex = build_regex_from_schema(json.dumps(schema))
    guide = Guide(Index(regex, vocab))
    compile_s = time.perf_counter() - t0
    words = (len(tokenizer) + 31) // 32
    mask = torch.zeros(words, dtype=torch.int32)
    fills = []
    for tok in ids:
        t = time.perf_counter()
        guide.write_mask_into(mask.data_ptr(), mask.numel(), mask.element_size())
        fills.append(time.perf_counter() - t)
        guide.advance(tok)
    return compile_s, fills


walk_outlines.cache = {}

LIBRARIES = {
    "llguidance": walk_llguidance,
    "outlines-core": walk_outlines,
    "xgrammar": walk_xgrammar,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default=str(ASSET))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    print(
        f"tokenizer {args.tokenizer}: {len(tokenizer)} tokens; "
        f"torch threads {torch.get_num_threads()}"
    )
    for lib, walk in LIBRARIES.items():
        fills, compiles, failed = [], [], []
        for name, schema, value in CASES:
            ids = tokens_of(tokenizer, value)
            try:
                for _ in range(args.repeat):
                    c, f = walk(tokenizer, schema, ids)
                    compiles.append(c)
                    fills.extend(f)
            except ImportError as e:
                print(f"{lib:14s} not installed ({e})")
                break
            except Exception as e:  # noqa: BLE001 - a refusal is a coverage figure
                failed.append(f"{name}: {type(e).__name__}: {str(e)[:120]}")
        else:
            if fills or failed:
                fills = fills or [float("nan")]
                compiles = compiles or [float("nan")]
                us = sorted(x * 1e6 for x in fills)
                print(
                    f"{lib:14s} mask fill per step: median {statistics.median(us):7.1f} us, "
                    f"p90 {us[int(0.9 * len(us))]:7.1f} us over {len(us)} steps; compile median "
                    f"{statistics.median(compiles) * 1e3:7.1f} ms (first includes the tokenizer); "
                    f"schemas {len(CASES) - len(failed)}/{len(CASES)}"
                )
            for f in failed:
                print(f"{'':14s} refused {f}")


if __name__ == "__main__":
    main()
