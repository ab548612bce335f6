"""Setting up a draft model (minisgl/speculative/draft_model.py): it must mean by each token id
what the target means, and its Engine is built on this rank's device without changing what the
target's engine set for the process."""

from __future__ import annotations

from pathlib import Path

import torch

from minisgl.core import current_ctx, set_global_ctx
from minisgl.engine import Engine, EngineConfig
from minisgl.models import ModelConfig
from minisgl.models.tokenizer import load_tokenizer


def check_draft_matches_target(draft_path: str | Path, target_path: str | Path) -> None:
    """Refuse a draft whose token ids mean something else than the target's: the target verifies
    the draft's ids as its own, so a different vocabulary gives nonsense (or out-of-range ids).
    Both configs' vocab_size must be equal and both tokenizer.json files must map every token to
    the same id (Qwen3 0.6B..32B share one, for instance)."""
    draft, target = ModelConfig.from_dir(draft_path), ModelConfig.from_dir(target_path)
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"draft model {draft_path} has a vocabulary of {draft.vocab_size} tokens and the "
            f"target {target_path} one of {target.vocab_size}: a draft model must share the "
            "target's tokenizer"
        )
    draft_tok, target_tok = load_tokenizer(draft_path), load_tokenizer(target_path)
    if draft_tok is None or target_tok is None:
        missing = draft_path if draft_tok is None else target_path
        raise ValueError(
            f"{missing} has no tokenizer.json: a draft model's tokenizer must be compared with the "
            "target's before the target verifies its ids"
        )
    draft_vocab = draft_tok.get_vocab(with_added_tokens=True)
    target_vocab = target_tok.get_vocab(with_added_tokens=True)
    if draft_vocab != target_vocab:
        differing = sorted(set(draft_vocab.items()) ^ set(target_vocab.items()), key=str)[0]
        raise ValueError(
            f"draft model {draft_path} and target {target_path} have different tokenizers "
            f"({len(draft_vocab)} and {len(target_vocab)} entries; token {differing[0]!r} is id "
            f"{draft_vocab.get(differing[0])} in the draft, {target_vocab.get(differing[0])} in "
            "the target): a draft model must share the target's tokenizer"
        )


def this_rank_device(device: str) -> str:
    """Under tensor parallelism "cuda" means this rank's GPU (rank_device set it current)."""
    if device == "cuda" and torch.cuda.is_available() and torch.cuda.is_initialized():
        return f"cuda:{torch.cuda.current_device()}"
    return device


def build_quietly(config: EngineConfig) -> Engine:
    """The draft's Engine, leaving the process as the target's engine set it: building an engine
    makes its context the global one and applies its thread policy (1 thread for a small model on
    a CPU, which would slow a larger target that chose more)."""
    context, threads = current_ctx(), torch.get_num_threads()
    try:
        return Engine(config)
    finally:
        set_global_ctx(context)
        torch.set_num_threads(threads)
