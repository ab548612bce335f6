"""The fixed prompt pool every torture workload draws from, and its Hugging Face references.

Workloads pick prompts by index, so the greedy references are computed once per checkpoint (and
cached on disk by `helpers.hf_greedy`), never per workload. The pool is built to stress the prefix
cache: prefixes of one another, prompts that share a prefix and then diverge, prompts of one token,
and prompts that continue another prompt with its own greedy output (so a finished request's cached
output tokens are matched by a later one).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import List

import torch

REF_TOKENS = 24  # every request's max_tokens stays within the reference

_TEXT = (
    "ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and Juliet is the "
    "sun. Arise, fair sun, and kill the envious moon, who is already sick and pale with grief.\n",
    "KING HENRY:\nOnce more unto the breach, dear friends, once more; or close the wall up "
    "with our "
    "English dead. In peace there's nothing so becomes a man as modest stillness and humility.\n",
    "HAMLET:\nTo be, or not to be, that is the question: whether 'tis nobler in the mind to suffer "
    "the slings and arrows of outrageous fortune, or to take arms against a sea of troubles.\n",
)


@dataclass(frozen=True)
class PromptPool:
    prompts: List[List[int]]
    references: List[List[int]]  # greedy continuation of each prompt, REF_TOKENS long (no EOS stop)


def _bases(model: Path, vocab_size: int) -> List[List[int]]:
    """Three unrelated token sequences of 40 tokens: Shakespeare if the checkpoint has a tokenizer,
    fixed pseudo-random ids otherwise."""
    path = model / "tokenizer.json"
    if path.is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path))
        return [tok.encode(t).ids[:40] for t in _TEXT]
    g = torch.Generator().manual_seed(1234)
    hi = min(vocab_size, 4096) - 10
    return [torch.randint(10, hi, (40,), generator=g).tolist() for _ in _TEXT]


@lru_cache(maxsize=4)
def load_pool(model: Path) -> PromptPool:
    from helpers import hf_greedy
    from minisgl.models import ModelConfig

    b0, b1, b2 = _bases(model, ModelConfig.from_dir(model).vocab_size)
    first = [
        b0[:1],
        b0[:2],
        b0[:5],
        b0[:8],
        b0[:13],
        b0[:21],
        b0[:34],
        b1[:4],
        b1[:9],
        b1[:17],
        b1[:30],
        b0[:8] + b1[:6],
        b0[:13] + b2[:10],
        b2[:3],
        b2[:16],
        b2[:40],
    ]
    first_refs = hf_greedy(first, REF_TOKENS, model)
    # A prompt that is another prompt plus the start of its own greedy output.
    second = [
        first[3] + first_refs[3][:6],
        first[9] + first_refs[9][:12],
        first[1] + first_refs[1][:3],
    ]
    second_refs = hf_greedy(second, REF_TOKENS, model)
    return PromptPool(first + second, first_refs + second_refs)
