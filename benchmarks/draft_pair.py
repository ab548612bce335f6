"""A draft/target pair for speculative decoding, measured offline on the CPU: the models' sizes,
the cost of one batch-1 decode step of each (the cost ratio c), and greedy acceptance for
k = 1..8 with the expected speed-up.

    python benchmarks/draft_pair.py                                     # bundled target + draft
    python benchmarks/draft_pair.py --draft ce=/tmp/ce --draft kl=/tmp/kl --out results.txt

Step costs: both models run through `DraftModelDrafter` (minisgl/speculative/draft_model.py),
the same code for each, float32, batch 1, a 64-token context. A decode step is
(propose(k=9) - propose(k=1)) / 8: the 8 extra greedy decode steps of the longer call; a
verify-sized forward of n tokens is propose(k=1) after rolling the cache back by n tokens (one
extend of n tokens and an argmax). The fastest of --reps calls: on a CPU shared with other
work, the slower calls measure the other work (medians moved by 2x between runs at load 1-10).

Acceptance: the target's greedy continuation (`minisgl.LLM`, float32, ignore_eos) of each
prompt, --new tokens long. At every position i (prefix = prompt + continuation[:i]) the draft
proposes 8 tokens greedily from the true prefix; for each k the accepted count is the length of
the prefix of its first k tokens that equals continuation[i:i+k] (positions with i + 8 <= --new,
so every k sees the same positions). a = accepted / k; tokens per verify = accepted + 1 (the
target's own token after the accepted ones); expected speed-up = tokens per verify /
(v + k * c), with v the verify forward's cost in target decode steps: 1 (the common
approximation) and the measured forward of k + 1 tokens.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minisgl import LLM, SamplingParams  # noqa: E402
from minisgl.core import Req  # noqa: E402
from minisgl.engine import EngineConfig  # noqa: E402
from minisgl.models import BUNDLED_MODEL  # noqa: E402
from minisgl.models.tokenizer import load_tokenizer  # noqa: E402
from minisgl.speculative.draft_model import DraftModelDrafter  # noqa: E402
from minisgl.utils.threads import apply_thread_policy  # noqa: E402

BUNDLED_DRAFT = Path(BUNDLED_MODEL).parent / "shakespeare-qwen3-draft"
K_MAX = 8
# Speaker headings and openings in the data's format; Macbeth, Twelfth Night and Coriolanus are
# the held-out plays (tools/train_model/README.md), the rest were seen in training.
PROMPTS = [
    "ROMEO:\n",
    "To be, or not to be",
    "MACBETH:\nIs this a dagger which I see before me,",
    "VIOLA:\nIf music be the food of love",
    "CORIOLANUS:\nYou common cry of curs!",
    "KING HENRY:\nOnce more unto the breach, dear friends,",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?",
    "HAMLET:\nAlas, poor Yorick!",
]


def num_params(path: Path) -> int:
    """Parameters stored in the checkpoint (a tied output head is stored once)."""
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())


def config(model: Path) -> EngineConfig:
    return EngineConfig(
        model,
        dtype=torch.float32,
        device="cpu",
        max_running_req=len(PROMPTS),
        num_page_override=4096,
        max_seq_len_override=512,
    )


def req(ids, uid: int) -> Req:
    return Req(torch.tensor(ids, dtype=torch.int32), 0, 0, K_MAX + 1, uid, SamplingParams())


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def step_costs(model: Path, context: list, reps: int, verify_sizes) -> dict:
    """Seconds (the fastest of `reps`) of one batch-1 decode step and of one forward of n tokens
    (n in verify_sizes) at `context`'s length, both through the drafter's engine."""
    drafter = DraftModelDrafter(model, config(model))
    r = req(context, 0)
    for _ in range(3):  # warm-up
        drafter.propose([r], 9)
    long = [timed(lambda: drafter.propose([r], 9)) for _ in range(reps)]
    short = [timed(lambda: drafter.propose([r], 1)) for _ in range(reps)]
    out = {"decode": (min(long) - min(short)) / 8}
    for n in verify_sizes:
        times = []
        for _ in range(reps):
            drafter.propose([req(context[: len(context) - n], 0)], 1)  # cache: all but n
            times.append(timed(lambda: drafter.propose([r], 1)))
        out[n] = min(times)
    return out


def acceptance(draft: Path, prompts: list, conts: list) -> dict:
    """k -> (mean accepted tokens, positions counted), over every prompt and position."""
    drafter = DraftModelDrafter(draft, config(draft))
    accepted = {k: [] for k in range(1, K_MAX + 1)}
    steps = len(conts[0]) - K_MAX + 1
    for i in range(steps):
        reqs = [req(p + c[:i], uid) for uid, (p, c) in enumerate(zip(prompts, conts))]
        proposals = drafter.propose(reqs, K_MAX)
        for prop, c in zip(proposals, conts):
            truth = c[i : i + K_MAX]
            agree = 0
            while agree < K_MAX and prop[agree] == truth[agree]:
                agree += 1
            for k in accepted:
                accepted[k].append(min(agree, k))
    return {k: (statistics.fmean(v), len(v)) for k, v in accepted.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=Path, default=Path(BUNDLED_MODEL))
    ap.add_argument(
        "--draft",
        action="append",
        default=[],
        help="NAME=PATH (repeatable); default: the bundled draft",
    )
    ap.add_argument("--new", type=int, default=64, help="target tokens generated per prompt")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    drafts = [d.split("=", 1) for d in args.draft] or [["bundled", str(BUNDLED_DRAFT)]]
    for d in drafts:
        if len(d) != 2:
            ap.error(f"--draft takes NAME=PATH, got {'='.join(d)!r}")
    threads = apply_thread_policy("cpu")

    lines = []

    def say(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    say(f"# {date.today()} draft/target pair on the CPU (benchmarks/draft_pair.py)")
    say(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}, {threads.intra_op} thread(s) ({threads.reason}); load average "
        f"at start {os.getloadavg()[0]:.1f}"
    )
    say(f"target {args.target}: {num_params(args.target):,} parameters")
    for name, path in drafts:
        size = (Path(path) / "model.safetensors").stat().st_size
        say(f"draft {name} {path}: {num_params(Path(path)):,} parameters, {size:,} bytes")

    tok = load_tokenizer(args.target)
    prompts = [tok.encode(p).ids for p in PROMPTS]
    llm = LLM(args.target, **{k: v for k, v in vars(config(args.target)).items() if k in _LLM})
    outs = llm.generate(prompts, SamplingParams(max_tokens=args.new, ignore_eos=True))
    conts = [list(o["token_ids"]) for o in outs]
    llm.shutdown()
    say(f"workload: {len(PROMPTS)} prompts, the target's greedy continuation of {args.new} tokens")

    context = (prompts[0] + conts[0])[:64]
    sizes = list(range(2, K_MAX + 2))
    say()
    say(f"batch-1 step cost, float32, 64-token context, fastest of {args.reps}")
    target_cost = step_costs(args.target, context, args.reps, sizes)
    say(f"  target decode step           {target_cost['decode'] * 1e3:7.2f} ms")
    say(
        "  target forward of k+1 tokens "
        + "  ".join(f"k={n - 1}: {target_cost[n] * 1e3:.2f}" for n in sizes)
        + " ms"
    )
    for name, path in drafts:
        cost = step_costs(Path(path), context, args.reps, [])["decode"]
        ratio = cost / target_cost["decode"]
        say(f"  draft {name} decode step {cost * 1e3:7.2f} ms   cost ratio c = {ratio:.3f}")
        table = acceptance(Path(path), prompts, conts)
        say()
        say(f"draft {name}: greedy acceptance ({table[1][1]} positions for every k)")
        say("   k  accept a  tokens/verify  speed-up (v=1)  speed-up (v measured)")
        for k, (mean, _) in table.items():
            per_verify = mean + 1
            v = target_cost[k + 1] / target_cost["decode"]
            simple, measured = per_verify / (1 + k * ratio), per_verify / (v + k * ratio)
            say(f"  {k:2d}  {mean / k:8.3f}  {per_verify:13.2f}  {simple:14.2f}  {measured:21.2f}")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


_LLM = ("dtype", "device", "max_running_req", "num_page_override", "max_seq_len_override")

if __name__ == "__main__":
    main()
