"""What prompt lookup would accept per verify step on the bundled model, for k = 1..8.

    python benchmarks/lookup_acceptance.py            # the two workloads, 256 tokens each
    python benchmarks/lookup_acceptance.py --tokens 64

The engine generates each prompt's greedy continuation once, without speculation. Because greedy
verification keeps exactly the target's own tokens, a run with prompt lookup would produce the
same continuation; only the number of target forwards changes. So the speculative run is replayed
offline: at each verify step the draft is `propose_lookup(tokens so far, k)`, its accepted part
is the prefix that agrees with the greedy continuation, and the step yields that plus one token.

Printed per workload and k: verify steps against plain decode steps, tokens per verify (accepted
+ 1, the figure that divides the number of target forwards), the share of steps with a non-empty
draft, and the acceptance rate a of drafted tokens (accepted / drafted) with what the i.i.d.
formula (1 - a^(k+1)) / (1 - a) would predict from it. The last column replays the other
choice of occurrence, the latest instead of the earliest, for comparison.
"""

from __future__ import annotations

import argparse
import datetime
import platform

import torch

from classroom.speculation import propose_latest, replay
from minisgl import LLM, SamplingParams

WORKLOADS = {
    "shakespeare": "ROMEO:\nBut soft, what light through yonder window breaks?\n",
    # a prompt that repeats a passage: the shape of quoting, editing or templated text
    "repetitive": (
        "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n"
        "Deny thy father and refuse thy name.\n"
        "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n"
        "Deny thy father and refuse thy name.\n"
        "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n"
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=256, help="greedy tokens per workload")
    parser.add_argument("--max-ngram", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    llm = LLM(
        device="cpu",
        dtype=torch.float32,
        num_page_override=512,
        max_seq_len_override=512,
        max_running_req=2,
    )
    greedy = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    print(
        f"# benchmarks/lookup_acceptance.py --tokens {args.tokens} --max-ngram {args.max_ngram}, "
        f"{datetime.date.today()}, {platform.processor() or platform.machine()}, torch "
        f"{torch.__version__}; the bundled model (shakespeare-qwen3), greedy, float32 on the CPU"
    )
    for name, text in WORKLOADS.items():
        prompt = llm.encode(text).tolist()
        output = llm.generate([text], greedy)[0]["token_ids"]
        print(f"\n## {name}: prompt {len(prompt)} tokens, {len(output)} generated")
        print(f"# continuation: {llm.tokenizer.decode(output)[:160]!r}")
        print(
            "k  verifies/decode steps  tokens/verify  drafts non-empty  accept rate a  iid formula"
            "  latest match"
        )
        for k in range(1, 9):
            r = replay(prompt, output, k, args.max_ngram)
            a = r.accepted / r.drafted if r.drafted else 0.0
            iid = (1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1
            latest = replay(prompt, output, k, args.max_ngram, propose_latest)
            print(
                f"{k}  {r.verifies:4d}/{r.decode_steps:<4d}            {r.tokens_per_verify:5.2f}"
                f"          {r.with_draft / r.verifies:6.1%}          {a:5.2f}          {iid:5.2f}"
                f"        {latest.tokens_per_verify:5.2f}"
            )
    llm.shutdown()


if __name__ == "__main__":
    main()
