"""A model directory's tokenizer (tokenizer.json), for the offline LLM and the server's tokenizer
worker alike."""

from __future__ import annotations

from pathlib import Path


def load_tokenizer(model_dir: str | Path):
    """The tokenizer of `model_dir`, or None if it has no tokenizer.json (ids only)."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:
        raise ValueError(f"cannot read tokenizer {path}: {e}") from None
