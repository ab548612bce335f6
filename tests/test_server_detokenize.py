"""Incremental detokenisation (minisgl/server/detokenizer.py): the streamed pieces never hold half a
UTF-8 character, and joined they equal decoding all the output tokens at once, on the bundled
tokenizer and on two tiny ones trained here with the `tokenizers` library: a byte-level BPE (as
Qwen's and GPT-2's) and a SentencePiece-style one (Metaspace: its decoder drops the space that
starts the first token, so decoding token by token loses spaces)."""

from __future__ import annotations

import random
from typing import List

import pytest

from helpers import MODEL
from minisgl.server.detokenizer import REPLACEMENT, DecodeState, next_text

TEXTS = [
    "Fair Verona — où l'amour 🌹 fleurit, naïve 愛.",
    "🌹🌹 emoji at the start, 𝄞 a four-byte clef, and ünïcödé everywhere: 日本語のテキスト",
    "plain ASCII: But soft, what light through yonder window breaks?",
]
CORPUS = TEXTS * 3 + ["the quick brown fox jumps over the lazy dog " * 3, "こんにちは 世界 🌍🌎🌏 — café crème"]


def stream(tokenizer, ids: List[int], rng: random.Random | None = None) -> List[str]:
    """The pieces for `ids` fed in random steps of 1 to 3 tokens (one at a time without `rng`)."""
    state, pieces, i = DecodeState(), [], 0
    while i < len(ids):
        n = rng.randint(1, 3) if rng else 1
        step = ids[i : i + n]
        i += len(step)
        pieces.append(next_text(tokenizer, state, step, finished=i >= len(ids)))
    return pieces


def bundled():
    from minisgl.llm import load_tokenizer

    tok = load_tokenizer(MODEL)
    if tok is None:
        pytest.skip("the test model has no tokenizer.json")
    return tok


def byte_level_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def metaspace_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<eos>"]))
    return tok


TOKENIZERS = {"bundled": bundled, "byte-level BPE": byte_level_bpe, "SentencePiece-style": metaspace_bpe}


@pytest.fixture(scope="module", params=list(TOKENIZERS))
def tokenizer(request):
    return TOKENIZERS[request.param]()


@pytest.mark.parametrize("text", TEXTS, ids=["accents", "emoji", "ascii"])
def test_pieces_join_to_the_whole_decode_and_never_split_a_character(tokenizer, text):
    ids = tokenizer.encode(text).ids
    whole = tokenizer.decode(ids)
    for seed in (None, 0, 1, 2):
        pieces = stream(tokenizer, ids, random.Random(seed) if seed is not None else None)
        assert "".join(pieces) == whole, \
            f"the streamed pieces should join to {whole!r}, got {''.join(pieces)!r} (pieces {pieces[:8]}...)"
        broken = [p for p in pieces if REPLACEMENT in p]
        assert not broken, f"a piece holds half a character: {broken[0]!r} (the text has none: {whole!r})"


def test_random_ids_join_to_the_whole_decode(tokenizer):
    """Arbitrary output, invalid byte sequences included: joined pieces still equal the whole decode
    (U+FFFD where the whole decode has it too)."""
    rng = random.Random(0)
    vocab = tokenizer.get_vocab_size()
    for trial in range(30):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 25))]
        joined, whole = "".join(stream(tokenizer, ids, rng)), tokenizer.decode(ids)
        assert joined == whole, f"ids {ids}: the pieces should join to {whole!r}, got {joined!r}"


@pytest.mark.parametrize("make", [bundled, byte_level_bpe], ids=["bundled", "byte-level BPE"])
def test_output_ending_mid_character_is_flushed_at_the_end(make):
    tokenizer = make()
    ids = tokenizer.encode("a unicorn 🦄").ids  # not in the tiny tokenizers' corpus: byte tokens
    cut = next(n for n in range(len(ids), 0, -1) if tokenizer.decode(ids[:n]).endswith(REPLACEMENT))
    pieces = stream(tokenizer, ids[:cut])
    assert "".join(pieces) == tokenizer.decode(ids[:cut]), \
        f"the last piece should flush what is left ({tokenizer.decode(ids[:cut])!r}), got {''.join(pieces)!r}"


def test_special_tokens_are_not_shown():
    tok = bundled()
    eos = tok.token_to_id("<|endoftext|>")
    ids = tok.encode("Good night").ids + [eos]
    pieces = stream(tok, ids)
    assert "".join(pieces) == "Good night", f"EOS must not appear in the text, got {''.join(pieces)!r}"


def test_each_step_decodes_a_window_not_the_whole_output():
    """Streaming n tokens must not cost n decodes of the whole output (n^2 work on long answers)."""
    inner = bundled()
    longest = []

    class Counting:
        def decode(self, ids):
            longest.append(len(ids))
            return inner.decode(ids)

    ids = inner.encode("But soft, what light through yonder window breaks? " * 8).ids
    stream(Counting(), ids)
    assert max(longest) <= 8, f"{len(ids)} tokens streamed: each decode should see a few, one saw {max(longest)}"
