"""Host time of a speculative cycle against a plain decode step, measured on a CPU (issue 47).

On a GPU the bundled 6-layer model's step is host-bound: what a token costs is the Python and the
operator dispatches around the device's work, not the work itself. A CPU shows the same when the
model is tiny: this builds a 1-layer Qwen3 of hidden size 32 with random weights (the bundled
model's tokenizer, so any prompt works) and runs it at batch 1, greedy, with CUDA graphs emulated
(`use_cuda_graph=True` on a CPU: graph_emulation.py), so the replay path a GPU takes is what runs.

The draft model IS the target (the same directory): every draft token is accepted (up to the
model's own argmax ties), so a cycle yields k + 1 tokens and its cost is the host work of the
draft's steps, the verify step, the acceptance, the handling and the rollback. Printed per setup:
host ms per plain step (normal and overlap loop), ms per verify cycle, the cycle's cost in plain
steps, tokens per cycle, and the tokens/s of speculation over the plain engine's.

    python benchmarks/spec_host_time.py [--ks 1,4,8] [--tokens 192] [--repeat 3]

The issue's 1.5x at the bundled pair's 2.1 tokens per cycle needs a cycle of <= 1.4 plain steps.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

from minisgl import LLM, SamplingParams
from minisgl.engine.graph_emulation import EmulatedGraph
from minisgl.models import BUNDLED_MODEL

TINY = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "intermediate_size": 64,
    "tie_word_embeddings": True,
    "max_position_embeddings": 1024,
    "rope_theta": 10000.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "dtype": "float32",
    "torch_dtype": "float32",
    "use_cache": True,
}
PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks?"


def make_tiny_model(path: Path) -> Path:
    """A random 1-layer Qwen3 of the bundled model's vocabulary, with its tokenizer files."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    bundled = Path(BUNDLED_MODEL)
    vocab = json.loads((bundled / "config.json").read_text())["vocab_size"]
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(bundled / name, path / name)
    (path / "config.json").write_text(json.dumps({**TINY, "vocab_size": vocab}, indent=1))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    model.save_pretrained(path)
    return path


class ReplayClock:
    """Time spent inside emulated graph replays, and how many ran. On a CPU a replay re-runs
    every captured operator from Python (graph_emulation.py); on a GPU it is one launch, whatever
    the graph holds. So the host time a GPU would see is the wall time less the replays', and the
    replays are counted: each costs a GPU about one launch plus its kernels."""

    def __init__(self) -> None:
        self.seconds, self.count = 0.0, 0
        replay = EmulatedGraph.replay

        def timed_replay(graph):
            start = time.perf_counter()
            try:
                return replay(graph)
            finally:
                self.seconds += time.perf_counter() - start
                self.count += 1

        EmulatedGraph.replay = timed_replay


CLOCK = ReplayClock()


def run_once(llm: LLM, prompt, tokens: int) -> tuple:
    """(host seconds outside replays, replays, verify cycles) of one greedy batch-1 request of
    `tokens` new tokens."""
    CLOCK.seconds, CLOCK.count = 0.0, 0
    verifies = llm.spec_stats.verifies if llm.drafter is not None else 0
    start = time.perf_counter()
    llm.generate([prompt], SamplingParams(max_tokens=tokens, ignore_eos=True))
    host = time.perf_counter() - start - CLOCK.seconds
    if llm.drafter is not None:
        verifies = llm.spec_stats.verifies - verifies
    return host, CLOCK.count, verifies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ks", default="1,4,8")
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"spec_host_time {now}, torch {torch.__version__}, batch 1, {args.tokens} tokens, cpu")
    with tempfile.TemporaryDirectory(prefix="spec-host-time-") as tmp:
        model = str(make_tiny_model(Path(tmp) / "tiny"))
        common = dict(device="cpu", use_cuda_graph=True, max_running_req=4)
        ks = [int(x) for x in args.ks.split(",")]
        setups = {
            "normal": dict(overlap_scheduling=False),
            "overlap": dict(overlap_scheduling=True),
        }
        for k in ks:
            setups[k] = dict(speculative="draft", draft_model=model, num_speculative_tokens=k)
        llms = {name: LLM(model, **common, **options) for name, options in setups.items()}
        prompt = llms["normal"].encode(PROMPT).tolist()
        for llm in llms.values():  # warm up
            llm.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True))
        # every setup once per round, the best round of each: the machine's load drifts
        best = {name: (float("inf"), 0, 0) for name in llms}
        for _ in range(args.repeat):
            for name, llm in llms.items():
                best[name] = min(best[name], run_once(llm, prompt, args.tokens))
        for llm in llms.values():
            llm.shutdown()
        plain = {name: best[name][0] / args.tokens for name in ("normal", "overlap")}
        step = min(plain.values())
        print(
            f"plain step, host ms outside replays: {plain['normal'] * 1e3:.3f} (normal loop), "
            f"{plain['overlap'] * 1e3:.3f} (overlap loop); 1 replay per step"
        )
        print(
            f"{'k':>2} {'cycle ms':>9} {'plain steps':>12} {'replays':>8} {'tokens/cycle':>13} "
            f"{'spec/plain':>11}"
        )
        for k in ks:
            host, replays, cycles = best[k]
            cycle = host / cycles
            print(
                f"{k:2d} {cycle * 1e3:9.3f} {cycle / step:12.2f} {replays / cycles:8.1f} "
                f"{args.tokens / cycles:13.2f} {step * args.tokens / host:11.2f}"
            )


if __name__ == "__main__":
    main()
