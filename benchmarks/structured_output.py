"""Structured output's cost per decode step: batch 1 and 64, with 0 %, 50 % and 100 % of the
requests under a real JSON schema (a scene: a title and at least 20 lines, each a speaker from an
enum and a text of up to 60 characters, so that no request ends before max_tokens).

    python benchmarks/structured_output.py                  # the bundled model on the CPU
    python benchmarks/structured_output.py --device cuda    # Qwen3-0.6B's shape, dummy bf16 weights

For each case: the wall time per decode step at the full batch (from one step's launch to the
next, overlap scheduling on) and the CPU's bitmask fill per step (the `grammar_mask` events: every
constrained request's matcher, between the forward's launch and the sampling's). On CUDA the
model is benchmarks/overlap_ablation.py's Qwen3-0.6B shape with random weights, and its tokenizer a
stand-in of the same vocabulary size (151,936 entries: the 256 byte tokens, then pairs of the
bundled model's tokens: a byte-level BPE vocabulary's shape, since no real Qwen3 tokenizer can be
fetched here; `--tokenizer DIR` takes a real one's tokenizer.json instead).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402

ASSET = Path(__file__).resolve().parents[1] / "minisgl" / "assets" / "shakespeare-qwen3"

SCENE = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "lines": {
            "type": "array",
            "minItems": 20,
            "items": {
                "type": "object",
                "properties": {
                    "speaker": {"enum": ["ROMEO", "JULIET", "NURSE", "MERCUTIO", "TYBALT"]},
                    "text": {"type": "string", "maxLength": 60},
                },
                "required": ["speaker", "text"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["title", "lines"],
    "additionalProperties": False,
}


def stand_in_tokenizer(path: Path, vocab: int, eos: int) -> None:
    """A byte-level BPE tokenizer.json of `vocab` entries (see the module's docstring)."""
    bundled = json.loads((ASSET / "tokenizer.json").read_text())
    base = [t for t in bundled["model"]["vocab"] if not t.startswith("<|")]
    tokens: Dict[str, int] = {}
    for t in base:
        tokens.setdefault(t, len(tokens))
    i = 0
    while len(tokens) < vocab - 1:
        a, b = base[i % len(base)], base[(i // len(base)) % len(base)]
        tokens.setdefault(a + b, len(tokens))
        i += 1
    spec = dict(bundled)
    spec["model"] = dict(bundled["model"], vocab=tokens, merges=[])
    spec["added_tokens"] = [
        {
            "id": eos,
            "content": "<|im_end|>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    ]
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(json.dumps(spec))


def cuda_model_dir(tmp: Path, tokenizer: str | None) -> Path:
    from overlap_ablation import QWEN3_06B, make_dummy_model

    model_dir = tmp / "qwen3-0.6b-dummy"
    make_dummy_model(model_dir)
    torch.cuda.empty_cache()
    if tokenizer is not None:
        (model_dir / "tokenizer.json").write_bytes(
            (Path(tokenizer) / "tokenizer.json").read_bytes()
        )
    else:
        stand_in_tokenizer(model_dir, QWEN3_06B["vocab_size"], QWEN3_06B["eos_token_id"])
    return model_dir


def run_case(llm: LLM, batch: int, constrained: float, max_tokens: int) -> Dict[str, float]:
    n_constrained = round(batch * constrained)
    prompts = [[(7 * i + j) % 3000 + 10 for j in range(16)] for i in range(batch)]
    params: List[SamplingParams] = []
    for i in range(batch):
        if i < n_constrained:
            params.append(SamplingParams(max_tokens=max_tokens, constraint={"json_schema": SCENE}))
        else:
            params.append(SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    log = llm.events.record()
    outs = llm.generate(prompts, params, progress=False)
    if llm.device.type == "cuda":
        torch.cuda.synchronize()
    assert all(len(o["token_ids"]) == max_tokens for o in outs), [
        (o["finish_reason"], len(o["token_ids"])) for o in outs
    ]
    launches = [e for e in log if e.kind == "launch"]
    step_ms = [
        (b.time - a.time) * 1e3
        for a, b in zip(launches, launches[1:])
        if a["phase"] == "decode" and len(a["uids"]) == batch
    ]
    fills = [e["seconds"] * 1e3 for e in log if e.kind == "grammar_mask"]
    log.clear()
    return dict(
        step_ms=statistics.median(step_ms),
        steps=len(step_ms),
        fill_ms=statistics.median(fills) if fills else 0.0,
        fill_p90_ms=sorted(fills)[int(0.9 * len(fills))] if fills else 0.0,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokenizer", default=None, help="a real tokenizer's directory (CUDA run)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--batches", default="1,64")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        if args.device == "cpu":
            model_dir, dtype = ASSET, torch.float32
        else:
            model_dir, dtype = cuda_model_dir(Path(tmp), args.tokenizer), torch.bfloat16
        llm = LLM(
            model_dir,
            dtype=dtype,
            device=args.device,
            max_running_req=max(batches),
            cache_type="naive",
            max_seq_len_override=16 + args.max_tokens + 8,
            num_page_override=max(batches) * (16 + args.max_tokens + 8),
            overlap_scheduling=True,
        )
        run_case(llm, 1, 0.0, 8)  # warm-up: kernels, the grammar's tokenizer
        run_case(llm, 1, 1.0, 8)
        print(f"device {llm.device}, model {model_dir.name}, max_tokens {args.max_tokens}")
        print("batch  constrained  step ms (median, full batch)  mask fill ms (median, p90)")
        # (batch 1 at 50 %: none of its one request is constrained, a second 0 % run)
        for batch in batches:
            for share in (0.0, 0.5, 1.0):
                r = run_case(llm, batch, share, args.max_tokens)
                print(
                    f"{batch:5d}  {share:5.0%} ({round(batch * share):2d})"
                    f"  {r['step_ms']:9.2f} over {r['steps']:3d} steps"
                    f"          {r['fill_ms']:7.3f} ({r['fill_p90_ms']:.3f})"
                )
        llm.shutdown()


if __name__ == "__main__":
    main()
