"""Peak memory of each tensor-parallel rank against TP=1, on a checkpoint of Qwen3-0.6B's shape.

    python benchmarks/tp_memory.py [--tp 1,2,4] [--model DIR] [--out FILE]

Each rank should read only its own slices of the safetensors files (upstream mini-sglang #93 was
every rank loading the whole checkpoint first), so a rank's weights are about 1/N of TP=1's, plus
what every rank holds whole: the norms, and the KV heads it replicates. Without --model this writes
random bf16 weights of Qwen3-0.6B's shape (1.2 GB, benchmarks/overlap_ablation.py's config) to a
temporary folder. Each TP size runs in a fresh process on the CPU, so one size's peak is not
another's; a rank's figure is its peak resident memory (Linux's VmHWM) once the engine is built,
and "engine" is that minus rank 0's peak before the engine was built (torch and minisgl imported,
which every rank pays alike). A peak is above the rank's weights: pages of the safetensors files
it read stay mapped, and a weight passes through a buffer as it is loaded. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def peak_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def one(model: Path, tp: int) -> dict:
    """Build the engine at `tp` ranks in this process (rank 0) and report every rank's peak."""
    from minisgl import LLM, SamplingParams

    before = peak_mib()
    llm = LLM(model, tp_size=tp, dtype="bfloat16", num_page_override=64, max_running_req=4)
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True))  # every rank ran
    peaks = [peak_mib()] + [peak_mib(p) for p in getattr(llm, "rank_pids", [])]
    weights = sum(t.numel() * t.element_size() for t in llm.engine.model.state_dict().values())
    llm.shutdown()
    return {"tp": tp, "before": before, "peaks": peaks, "rank0_weights_mib": weights / 2**20}


def write_checkpoint(path: Path) -> None:
    import torch
    from overlap_ablation import QWEN3_06B
    from transformers import AutoConfig, AutoModelForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(QWEN3_06B, indent=1))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.bfloat16)
    model.save_pretrained(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", default="1,2,4", help="TP sizes, comma-separated")
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child's own run
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    if a.one is not None:
        print(json.dumps(one(a.model, a.one)))
        return
    with tempfile.TemporaryDirectory(prefix="qwen3-0.6b-dummy-") as tmp:
        model = a.model or Path(tmp)
        if a.model is None:
            write_checkpoint(model)
        rows = []
        for tp in (int(n) for n in a.tp.split(",")):
            run = subprocess.run(
                [sys.executable, __file__, "--one", str(tp), "--model", str(model)],
                capture_output=True,
                text=True,
                cwd=HERE,
            )
            if run.returncode != 0:
                raise SystemExit(f"TP={tp} failed:\n{run.stderr[-2000:]}")
            rows.append(json.loads(run.stdout.strip().splitlines()[-1]))
    base = rows[0]
    lines = [
        "peak resident memory per rank, Qwen3-0.6B's shape (bf16, 1.2 GB of weights), CPU, gloo",
        "tp  rank  peak MiB  engine MiB  engine vs TP=1",
    ]
    for r in rows:
        for rank, peak in enumerate(r["peaks"]):
            engine = peak - r["before"]
            ratio = engine / (base["peaks"][0] - base["before"])
            lines.append(f"{r['tp']:<3} {rank:4d}  {peak:8.0f}  {engine:10.0f}  {ratio:13.2f}x")
    lines.append(
        "rank 0's parameters: "
        + ", ".join(f"TP={r['tp']} {r['rank0_weights_mib']:.0f} MiB" for r in rows)
    )
    text = "\n".join(lines)
    print(text)
    if a.out is not None:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
