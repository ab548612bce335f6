"""The tokenizer worker's reply shaping (minisgl/server/reply_shaper.py) without a server: a stream
holds back what may start a stop string, cuts at it, and a stop the scheduler did not see ends the
request from the worker with an abort."""

from __future__ import annotations

from helpers import MODEL
from minisgl import SamplingParams
from minisgl.message import AbortBackendMsg, DetokenizeMsg, TokenizeMsg, UserMsg, UserReply
from minisgl.models.tokenizer import load_tokenizer
from minisgl.server.reply_shaper import ReplyShaper
from minisgl.server.tokenizer_worker import TokenizerWorker

TOKENIZER = load_tokenizer(MODEL)


def _reply(text, finished=False):
    return UserReply(uid=0, text=text, token_ids=[5], finished=finished, finish_reason=None)


def test_a_stream_holds_back_a_possible_stop_and_cuts_at_it():
    shaper = ReplyShaper(None, SamplingParams(stop=["abc"]), chat=False, prompt_ids=[1])
    sent = []
    for piece in ["xa", "b", "c d"]:
        reply = _reply(piece)
        early = shaper.shape(reply, DetokenizeMsg(uid=0, next_token=5, finished=False))
        sent.append(reply.text)
    assert sent == ["x", "", ""]
    assert early and reply.finished and reply.finish_reason == "stop"


def test_text_that_turns_out_not_to_be_a_stop_is_sent_later():
    shaper = ReplyShaper(None, SamplingParams(stop=["abc"]), chat=False, prompt_ids=[1])
    texts = []
    for piece, done in [("xa", False), ("bd", False), ("e", True)]:
        reply = _reply(piece, done)
        assert not shaper.shape(reply, DetokenizeMsg(uid=0, next_token=5, finished=done))
        texts.append(reply.text)
    assert texts == ["x", "abd", "e"]


def test_the_worker_aborts_a_request_whose_stop_only_it_saw():
    worker = TokenizerWorker(TOKENIZER, None, [], 256)
    ids = TOKENIZER.encode("ROMEO: hello").ids
    to_scheduler, _ = worker.handle(
        [TokenizeMsg(uid=3, sampling_params=SamplingParams(stop=["ROMEO"]), input_ids=ids)]
    )
    assert isinstance(to_scheduler[0], UserMsg)
    out = []
    for token, done in [(ids[0], False), (ids[1], False)]:  # "ROMEO", ":"
        sched, api = worker.handle([DetokenizeMsg(uid=3, next_token=token, finished=done)])
        out.append((sched, api))
    (sched, api) = out[0]
    assert sched == [AbortBackendMsg(uid=3)]
    assert api[0].finished and api[0].finish_reason == "stop" and api[0].text == ""
    assert out[1] == ([], [])  # nothing more for it
    assert 3 not in worker.shapers and 3 not in worker.requests
