"""The tokenizer worker's logic (minisgl/server/tokenize.py), without processes or sockets (the
messages on the wire are chapter 12's: tests/test_ch12_messages.py)."""

from __future__ import annotations

import pytest

from helpers import MODEL
from minisgl.core import SamplingParams
from minisgl.message import AbortBackendMsg, AbortMsg, DetokenizeMsg, TokenizeMsg, UserMsg
from minisgl.server.chat import load_chat_template
from minisgl.server.tokenize import TokenizerWorker

@pytest.fixture
def worker():
    from minisgl.llm import load_tokenizer

    tok = load_tokenizer(MODEL)
    return TokenizerWorker(tok, load_chat_template(MODEL), eos_token_id=tok.token_to_id("<|endoftext|>"), context_len=64)


def test_text_is_tokenized_as_the_offline_llm_does(worker):
    (msg,), to_api = worker.handle([TokenizeMsg(uid=1, sampling_params=SamplingParams(), text="ROMEO:\n")])
    assert not to_api and isinstance(msg, UserMsg), f"a good request goes to the scheduler, got {msg}"
    assert msg.input_ids.tolist() == worker.tokenizer.encode("ROMEO:\n").ids, "the prompt's ids should be the tokenizer's"


def test_chat_without_a_template_is_a_400(worker):
    worker.chat_template = None
    to_scheduler, (reply,) = worker.handle([TokenizeMsg(uid=1, sampling_params=SamplingParams(),
                                                        messages=[{"role": "user", "content": "hi"}])])
    assert not to_scheduler, "a chat that cannot be rendered must not reach the scheduler"
    assert reply.status == 400 and "chat template" in reply.error, f"expected a 400 naming the chat template, got {reply}"


def test_chat_with_no_max_tokens_fills_the_context(worker):
    msg = TokenizeMsg(uid=1, sampling_params=SamplingParams(), messages=[{"role": "user", "content": "hi"}],
                      fill_context=True)
    (out,), _ = worker.handle([msg])
    assert out.sampling_params.max_tokens == 64 - len(out.input_ids), \
        f"a {len(out.input_ids)}-token prompt in a 64-token context: max_tokens should be {64 - len(out.input_ids)}, " \
        f"got {out.sampling_params.max_tokens}"


@pytest.mark.parametrize("ignore_eos,reason", [(False, "stop"), (True, "length")])
def test_finish_reason(worker, ignore_eos, reason):
    worker.handle([TokenizeMsg(uid=1, sampling_params=SamplingParams(ignore_eos=ignore_eos), text="a")])
    _, (first, last) = worker.handle([DetokenizeMsg(1, 41, False), DetokenizeMsg(1, worker.eos_token_id, True)])
    assert first.finish_reason is None and last.finished, "only the last reply finishes"
    assert last.finish_reason == reason, f"EOS last with ignore_eos={ignore_eos}: expected {reason!r}, got {last.finish_reason!r}"
    assert last.prompt_tokens == 1 and not last.text, f"EOS adds no text and the prompt had 1 token, got {last}"
    worker.handle([TokenizeMsg(uid=2, sampling_params=SamplingParams(), text="a")])
    _, (end,) = worker.handle([DetokenizeMsg(2, 41, True)])
    assert end.finish_reason == "length", f"max_tokens reached: expected 'length', got {end.finish_reason!r}"


def test_abort_reaches_the_scheduler_and_drops_late_tokens(worker):
    worker.handle([TokenizeMsg(uid=1, sampling_params=SamplingParams(), text="a")])
    to_scheduler, _ = worker.handle([AbortMsg(uid=1)])
    assert to_scheduler == [AbortBackendMsg(uid=1)], f"an abort should go on to the scheduler, got {to_scheduler}"
    _, to_api = worker.handle([DetokenizeMsg(1, 41, False)])
    assert not to_api, f"tokens of an aborted request must not reach the API server, got {to_api}"
    assert not worker.requests, "an aborted request's state should be dropped"


def test_interleaved_requests_keep_their_own_text(worker):
    """Replies of many requests arrive interleaved; each request's multi-byte characters must come
    out whole, whatever the others do."""
    texts = {1: "🌹 a rose", 2: "愛 and naïve", 3: "plain"}
    ids = {uid: worker.tokenizer.encode(t).ids for uid, t in texts.items()}
    for uid in texts:
        worker.handle([TokenizeMsg(uid=uid, sampling_params=SamplingParams(ignore_eos=True), text="a")])
    got = {uid: "" for uid in texts}
    for step in range(max(map(len, ids.values()))):
        msgs = [DetokenizeMsg(uid, ids[uid][step], step == len(ids[uid]) - 1) for uid in texts if step < len(ids[uid])]
        for reply in worker.handle(msgs)[1]:
            got[reply.uid] += reply.text
    assert got == texts, f"each request should read its own text {texts}, got {got}"


def test_a_refusal_becomes_a_400(worker):
    worker.handle([TokenizeMsg(uid=1, sampling_params=SamplingParams(), text="a")])
    _, (reply,) = worker.handle([DetokenizeMsg(1, -1, True, error="too long")])
    assert reply.status == 400 and reply.error == "too long" and reply.finished, f"expected a 400 'too long', got {reply}"


def test_text_without_a_tokenizer_is_a_400():
    worker = TokenizerWorker(None, None, eos_token_id=None, context_len=64)
    _, (reply,) = worker.handle([TokenizeMsg(uid=1, sampling_params=SamplingParams(), text="hi")])
    assert reply.status == 400 and "token ids" in reply.error, f"expected a 400 asking for token ids, got {reply}"
    (msg,), _ = worker.handle([TokenizeMsg(uid=2, sampling_params=SamplingParams(), input_ids=[3, 4])])
    assert msg.input_ids.tolist() == [3, 4], "token ids need no tokenizer"
    _, (reply,) = worker.handle([DetokenizeMsg(2, 7, True)])
    assert reply.token_ids == [7] and reply.text == "", f"without a tokenizer: ids, no text; got {reply}"
