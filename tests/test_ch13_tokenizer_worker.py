"""Chapter 13: the tokenizer worker (minisgl/server/tokenizer_worker.py, detokenizer.py), without
processes or sockets.

Incremental detokenisation: the streamed pieces never hold half a UTF-8 character, and joined they
equal decoding all the output tokens at once, on the bundled tokenizer and on two tiny ones trained
here with the `tokenizers` library: a byte-level BPE (as Qwen's and GPT-2's) and a SentencePiece-
style one (Metaspace: its decoder drops the space that starts the first token, so decoding token by
token loses spaces). Then the worker around it: requests tokenized as the offline LLM does, chats
rendered as transformers renders them, finish reasons, aborts, refusals."""

from __future__ import annotations

import random
from typing import List

import pytest
import torch

from helpers import MODEL
from minisgl.core import SamplingParams
from minisgl.message import AbortBackendMsg, AbortMsg, DetokenizeMsg, TokenizeMsg, UserMsg
from minisgl.server.chat import load_chat_template
from minisgl.server.detokenizer import REPLACEMENT, DecodeState, next_text
from minisgl.server.tokenizer_worker import TokenizerWorker

TEXTS = [
    "Fair Verona — où l'amour 🌹 fleurit, naïve 愛.",
    "🌹🌹 emoji at the start, 𝄞 a four-byte clef, and ünïcödé everywhere: 日本語のテキスト",
    "plain ASCII: But soft, what light through yonder window breaks?",
]
CORPUS = TEXTS * 3 + [
    "the quick brown fox jumps over the lazy dog " * 3,
    "こんにちは 世界 🌍🌎🌏 — café crème",
]


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
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def metaspace_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<eos>"])
    )
    return tok


TOKENIZERS = {
    "bundled": bundled,
    "byte-level BPE": byte_level_bpe,
    "SentencePiece-style": metaspace_bpe,
}


@pytest.fixture(scope="module", params=list(TOKENIZERS))
def tokenizer(request):
    return TOKENIZERS[request.param]()


@pytest.mark.parametrize("text", TEXTS, ids=["accents", "emoji", "ascii"])
def test_pieces_join_to_the_whole_decode_and_never_split_a_character(tokenizer, text):
    ids = tokenizer.encode(text).ids
    whole = tokenizer.decode(ids)
    for seed in (None, 0, 1, 2):
        pieces = stream(tokenizer, ids, random.Random(seed) if seed is not None else None)
        assert "".join(pieces) == whole, (
            f"the streamed pieces should join to {whole!r}, got {''.join(pieces)!r} (pieces "
            f"{pieces[:8]}...)"
        )
        broken = [p for p in pieces if REPLACEMENT in p]
        assert not broken, (
            f"a piece holds half a character: {broken[0]!r} (the text has none: {whole!r})"
        )


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
    assert "".join(pieces) == tokenizer.decode(ids[:cut]), (
        f"the last piece should flush what is left ({tokenizer.decode(ids[:cut])!r}), got "
        f"{''.join(pieces)!r}"
    )


def test_special_tokens_are_not_shown():
    tok = bundled()
    eos = tok.token_to_id("<|endoftext|>")
    ids = tok.encode("Good night").ids + [eos]
    pieces = stream(tok, ids)
    assert "".join(pieces) == "Good night", (
        f"EOS must not appear in the text, got {''.join(pieces)!r}"
    )


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
    assert max(longest) <= 8, (
        f"{len(ids)} tokens streamed: each decode should see a few, one saw {max(longest)}"
    )


@pytest.fixture
def worker():
    from minisgl.llm import load_tokenizer

    tok = load_tokenizer(MODEL)
    return TokenizerWorker(
        tok,
        load_chat_template(MODEL),
        eos_token_ids={tok.token_to_id("<|endoftext|>")},
        context_len=64,
    )


def test_text_is_tokenized_as_the_offline_llm_does(worker):
    (msg,), to_api = worker.handle(
        [TokenizeMsg(uid=1, sampling_params=SamplingParams(), text="ROMEO:\n")]
    )
    assert not to_api and isinstance(msg, UserMsg), (
        f"a good request goes to the scheduler, got {msg}"
    )
    assert msg.input_ids.tolist() == worker.tokenizer.encode("ROMEO:\n").ids, (
        "the prompt's ids should be the tokenizer's"
    )


def test_chat_without_a_template_is_a_400(worker):
    worker.chat_template = None
    to_scheduler, (reply,) = worker.handle(
        [
            TokenizeMsg(
                uid=1,
                sampling_params=SamplingParams(),
                messages=[{"role": "user", "content": "hi"}],
            )
        ]
    )
    assert not to_scheduler, "a chat that cannot be rendered must not reach the scheduler"
    assert reply.status == 400 and "chat template" in reply.error and reply.finished, (
        f"expected a finished 400 reply naming the chat template, got {reply}"
    )


def test_chat_with_no_max_tokens_fills_the_context(worker):
    msg = TokenizeMsg(
        uid=1,
        sampling_params=SamplingParams(),
        messages=[{"role": "user", "content": "hi"}],
        fill_context=True,
    )
    (out,), _ = worker.handle([msg])
    assert out.sampling_params.max_tokens == 64 - len(out.input_ids), (
        f"a {len(out.input_ids)}-token prompt in a 64-token context: max_tokens should be "
        f"{64 - len(out.input_ids)}, "
        f"got {out.sampling_params.max_tokens}"
    )


def test_a_prompt_that_fills_the_context_still_asks_for_one_token(worker):
    """The scheduler then refuses it, naming the context length; max_tokens 0 would be refused as a
    bad setting instead, and more than 1 would overstate what is left."""
    worker.context_len = 4
    msg = TokenizeMsg(
        uid=1,
        sampling_params=SamplingParams(),
        messages=[{"role": "user", "content": "hi"}],
        fill_context=True,
    )
    (out,), _ = worker.handle([msg])
    assert len(out.input_ids) >= 4 and out.sampling_params.max_tokens == 1, (
        f"a {len(out.input_ids)}-token prompt in a 4-token context: max_tokens should be 1, "
        f"got {out.sampling_params.max_tokens}"
    )


def test_any_end_id_of_the_model_is_a_stop(worker):
    # Instruct checkpoints list several end ids (Llama-3: end of text, of message, of turn).
    from minisgl.server.tokenizer_worker import TokenizerWorker

    several = TokenizerWorker(worker.tokenizer, None, eos_token_ids={7, 9, 11}, context_len=64)
    for uid, end in enumerate((7, 9, 11), start=1):
        several.handle([TokenizeMsg(uid=uid, sampling_params=SamplingParams(), text="a")])
        _, (last,) = several.handle([DetokenizeMsg(uid, end, True)])
        assert last.finish_reason == "stop", (
            f"end ids {{7, 9, 11}}, last token {end}: expected finish_reason 'stop', got "
            f"{last.finish_reason!r}"
        )


@pytest.mark.parametrize("ignore_eos,reason", [(False, "stop"), (True, "length")])
def test_finish_reason(worker, ignore_eos, reason):
    worker.handle(
        [TokenizeMsg(uid=1, sampling_params=SamplingParams(ignore_eos=ignore_eos), text="a")]
    )
    _, (first, last) = worker.handle(
        [DetokenizeMsg(1, 41, False), DetokenizeMsg(1, next(iter(worker.eos_token_ids)), True)]
    )
    assert first.finish_reason is None and last.finished, "only the last reply finishes"
    assert last.finish_reason == reason, (
        f"EOS last with ignore_eos={ignore_eos}: expected {reason!r}, got {last.finish_reason!r}"
    )
    assert last.prompt_tokens == 1 and not last.text, (
        f"EOS adds no text and the prompt had 1 token, got {last}"
    )
    worker.handle([TokenizeMsg(uid=2, sampling_params=SamplingParams(), text="a")])
    _, (end,) = worker.handle([DetokenizeMsg(2, 41, True)])
    assert end.finish_reason == "length", (
        f"max_tokens reached: expected 'length', got {end.finish_reason!r}"
    )
    assert not worker.requests, "a request must be forgotten after its last reply"


def test_abort_reaches_the_scheduler_and_drops_late_tokens(worker):
    worker.handle([TokenizeMsg(uid=1, sampling_params=SamplingParams(), text="a")])
    to_scheduler, _ = worker.handle([AbortMsg(uid=1)])
    assert to_scheduler == [AbortBackendMsg(uid=1)], (
        f"an abort should go on to the scheduler, got {to_scheduler}"
    )
    _, to_api = worker.handle([DetokenizeMsg(1, 41, False)])
    assert not to_api, f"tokens of an aborted request must not reach the API server, got {to_api}"
    _, to_api = worker.handle([DetokenizeMsg(1, -1, True, error="refused")])
    assert not to_api, f"nor may the scheduler's refusal of it, got {to_api}"
    assert not worker.requests, "an aborted request's state should be dropped"


def test_interleaved_requests_keep_their_own_text(worker):
    """Replies of many requests arrive interleaved; each request's multi-byte characters must come
    out whole, whatever the others do."""
    texts = {1: "🌹 a rose", 2: "愛 and naïve", 3: "plain"}
    ids = {uid: worker.tokenizer.encode(t).ids for uid, t in texts.items()}
    for uid in texts:
        worker.handle(
            [TokenizeMsg(uid=uid, sampling_params=SamplingParams(ignore_eos=True), text="a")]
        )
    got = {uid: "" for uid in texts}
    for step in range(max(map(len, ids.values()))):
        msgs = [
            DetokenizeMsg(uid, ids[uid][step], step == len(ids[uid]) - 1)
            for uid in texts
            if step < len(ids[uid])
        ]
        for reply in worker.handle(msgs)[1]:
            got[reply.uid] += reply.text
    assert got == texts, f"each request should read its own text {texts}, got {got}"


def test_a_refusal_becomes_a_400(worker):
    worker.handle([TokenizeMsg(uid=1, sampling_params=SamplingParams(), text="a")])
    _, (reply,) = worker.handle([DetokenizeMsg(1, -1, True, error="too long")])
    assert reply.status == 400 and reply.error == "too long" and reply.finished, (
        f"expected a 400 'too long', got {reply}"
    )
    assert not worker.requests, "a refused request must be forgotten"


def test_text_without_a_tokenizer_is_a_400():
    worker = TokenizerWorker(None, None, eos_token_ids=(), context_len=64)
    _, (reply,) = worker.handle([TokenizeMsg(uid=1, sampling_params=SamplingParams(), text="hi")])
    assert reply.status == 400 and "token ids" in reply.error, (
        f"expected a 400 asking for token ids, got {reply}"
    )
    (msg,), _ = worker.handle(
        [TokenizeMsg(uid=2, sampling_params=SamplingParams(), input_ids=[3, 4])]
    )
    assert msg.input_ids.tolist() == [3, 4], "token ids need no tokenizer"
    _, (reply,) = worker.handle([DetokenizeMsg(2, 7, True)])
    assert reply.token_ids == [7] and reply.text == "", (
        f"without a tokenizer: ids, no text; got {reply}"
    )


def test_a_chat_is_rendered_as_transformers_renders_it(worker):
    from transformers import AutoTokenizer

    messages = [
        {"role": "system", "content": "A street in Verona."},
        {"role": "user", "content": "Good morrow."},
    ]
    ids = AutoTokenizer.from_pretrained(MODEL).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True
    )
    want = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    (msg,), _ = worker.handle(
        [TokenizeMsg(uid=1, sampling_params=SamplingParams(), messages=messages)]
    )
    assert msg.input_ids.tolist() == want, (
        f"the chat's prompt should be transformers' apply_chat_template's {want[:8]}..., got "
        f"{msg.input_ids.tolist()[:8]}..."
    )


@pytest.mark.parametrize(
    "ids,words",
    [
        ([5, 2**40], "vocabulary"),
        ([5, True], "integer"),
        ([5, "6"], "integer"),
        ([5, 1.5], "integer"),
        ([5, None], "integer"),
    ],
    ids=["past int32", "a bool", "a string", "a float", "a null"],
)
def test_bad_token_ids_are_a_400(worker, ids, words):
    try:
        to_scheduler, replies = worker.handle(
            [TokenizeMsg(uid=1, sampling_params=SamplingParams(), input_ids=ids)]
        )
    except (TypeError, ValueError) as e:
        pytest.fail(
            f"token ids {ids} from a client: the worker raised {type(e).__name__}: {e}; a client's "
            "bad prompt is a finished 400 reply naming the problem, not an error that ends the "
            "worker (catch the TypeError and ValueError the ids' check raises)"
        )
    assert not to_scheduler and len(replies) == 1, (
        f"token ids {ids}: expected one finished 400 reply and nothing for the scheduler, got "
        f"{to_scheduler} for the scheduler and the replies {replies}"
    )
    (reply,) = replies
    assert not to_scheduler and reply.status == 400 and words in reply.error and reply.finished, (
        f"token ids {ids}: expected a finished 400 reply naming the problem ({words!r}), got "
        f"{reply}"
    )
    assert not worker.requests, "a refused request must leave nothing behind in the worker"


def test_token_ids_go_to_the_scheduler_as_int32(worker):
    (msg,), _ = worker.handle(
        [TokenizeMsg(uid=1, sampling_params=SamplingParams(max_tokens=5), input_ids=[7, 8, 9])]
    )
    assert msg.input_ids.dtype == torch.int32 and msg.input_ids.tolist() == [7, 8, 9], (
        f"expected an int32 tensor [7, 8, 9], got {msg.input_ids!r}"
    )
    assert msg.sampling_params.max_tokens == 5 and worker.requests[1].prompt_tokens == 3, (
        "the request's sampling params go on as they are, and its 3 prompt tokens are remembered"
    )


def test_the_live_server_answers_with_this_code():
    """The real three-process server (`python -m minisgl serve`), with this chapter's code in
    every process, answers the official openai client as the offline engine does
    (live_server.py)."""
    from live_server import check_live_server

    check_live_server("chapter 13")
