"""Chapter 15: the OpenAI API layer (minisgl/server/openai_api.py, responses.py), in one process:
the shapes the official `openai` client parses, server-sent events, finish reasons, usage, errors,
and a client that leaves. A fake frontend hands out the replies the tokenizer worker would send;
the live server's tests (tests/test_server_api.py) run the same code behind real HTTP."""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Dict, List

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import ValidationError

from minisgl.message import UserReply
from minisgl.server import openai_api as api
from minisgl.server.responses import Answer, collect, stream_events


class FakeFrontend:
    """Replies for request 7, one per `next_reply`; records releases."""

    def __init__(self, replies: List[UserReply]):
        self.replies, self.released = list(replies), []

    async def next_reply(self, uid):
        assert uid == 7, f"asked for the replies of request {uid}, not 7"
        if not self.replies:
            await asyncio.sleep(3600)  # no more replies: as a request still running
        return self.replies.pop(0)

    def release(self, uid, abort):
        self.released.append((uid, abort))


class FakeRequest:
    """An HTTP request whose client leaves after `leave_after` calls to receive (never: None)."""

    def __init__(self, leave_after: int | None = None):
        self.leave_after, self.waiting, self.watching_after = leave_after, 0, None

    async def receive(self):
        self.waiting += 1
        try:
            await asyncio.sleep(3600 if self.leave_after is None else 0.05 * self.leave_after)
        finally:
            self.waiting -= 1
        return {"type": "http.disconnect"}


def replies(
    texts: List[str],
    reason: str = "length",
    prompt_tokens: int = 3,
    ids: List[List[int]] | None = None,
) -> List[UserReply]:
    """One reply per text, with the token ids `ids` (one list a reply; default: one id each,
    100, 101, ...); the last one finished with `reason`. Only the first reply carries the prompt's
    count (`prompt_tokens`): the answer is built from that reply, the one the app awaited, and a
    later reply's count is UserReply's default, 0, so usage taken from any other reply shows."""
    n = len(texts)
    ids = ids if ids is not None else [[100 + i] for i in range(n)]
    assert len(ids) == n, "one list of token ids per reply"
    return [
        UserReply(
            uid=7,
            text=t,
            token_ids=ids[i],
            finished=i == n - 1,
            finish_reason=reason if i == n - 1 else None,
            prompt_tokens=prompt_tokens if i == 0 else 0,
        )
        for i, t in enumerate(texts)
    ]


def answer(chat=False, ids=False, usage=False) -> Answer:
    return Answer(
        chat=chat,
        rid=("chatcmpl-7" if chat else "cmpl-7"),
        model="m",
        return_token_ids=ids,
        include_usage=usage,
        created=1,
    )


def run_stream(front: FakeFrontend, ans: Answer, take: int | None = None) -> List[str]:
    """The events of stream_events for request 7 (only the first `take`, then the client leaves)."""

    async def go():
        events = []
        gen = stream_events(front, 7, front.replies.pop(0), ans)
        if inspect.iscoroutine(gen):  # not a generator (a stub): running it raises what it raises
            await gen
        async for event in gen:
            events.append(event)
            if take is not None and len(events) >= take:
                break
        await gen.aclose()
        return events

    return asyncio.run(go())


def data(events: List[str]) -> List[Dict]:
    return [json.loads(e[len("data: ") :]) for e in events if e != api.SSE_DONE]


def client_reads(model, body):
    """`body` as the openai client parses it, or a failure that says which field it refused (a
    raw pydantic ValidationError names neither the rule nor the shape)."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        pytest.fail(
            f"the openai client cannot read this {model.__name__}: at {where!r} it found "
            f"{first.get('input')!r} ({first['msg']}); the body was {json.dumps(body)[:300]}",
            pytrace=False,
        )


# ------------------------------------------------------------------------------------- choice


def test_a_completion_is_what_the_openai_client_parses():
    body = api.envelope(
        False, False, "cmpl-7", 1, "m", [api.choice(False, False, "Why, then", "length", None)]
    )
    body["usage"] = api.usage(3, 2)
    parsed = client_reads(Completion, body)
    assert parsed.choices[0].text == "Why, then" and parsed.choices[0].finish_reason == "length", (
        f"the openai client read {parsed.choices[0]}"
    )
    assert "token_ids" not in body["choices"][0], "token ids only when the client asked for them"


def test_a_chat_completion_is_what_the_openai_client_parses():
    body = api.envelope(
        True, False, "chatcmpl-7", 1, "m", [api.choice(True, False, "Good morrow", "stop", [1, 2])]
    )
    body["usage"] = api.usage(3, 2)
    parsed = client_reads(ChatCompletion, body)
    message = parsed.choices[0].message
    assert (message.role, message.content) == ("assistant", "Good morrow"), (
        f"the openai client read {message}"
    )
    assert body["choices"][0].get("token_ids") == [1, 2], (
        f"asked for, the token ids are in the choice: {body['choices'][0]}"
    )


def test_a_chat_stream_names_the_role_in_its_first_chunk_only():
    first = client_reads(
        ChatCompletionChunk,
        api.envelope(
            True,
            True,
            "chatcmpl-7",
            1,
            "m",
            [api.choice(True, True, "Good", None, None, first=True)],
        ),
    )
    later = client_reads(
        ChatCompletionChunk,
        api.envelope(
            True, True, "chatcmpl-7", 1, "m", [api.choice(True, True, " morrow", None, None)]
        ),
    )
    assert (first.choices[0].delta.role, first.choices[0].delta.content) == ("assistant", "Good"), (
        f"the first chunk's delta should be the role and the text, got {first.choices[0].delta}"
    )
    assert later.choices[0].delta.role is None and later.choices[0].delta.content == " morrow", (
        f"a later chunk's delta is the text alone, got {later.choices[0].delta}"
    )


def test_a_text_completion_chunk_has_its_text():
    """(The openai client reads completion chunks without validating them: OpenAI's own chunks
    have a null finish_reason, which its Completion type does not allow.)"""
    chunk = api.envelope(
        False, True, "cmpl-7", 1, "m", [api.choice(False, True, " then", None, None)]
    )
    assert chunk["object"] == "text_completion" and chunk["choices"] == [
        {"index": 0, "text": " then", "logprobs": None, "finish_reason": None}
    ], f"got {chunk}"


@pytest.mark.parametrize(
    "chat,stream,first,want",
    [
        (
            False,
            False,
            False,
            {"index": 0, "text": "hi", "logprobs": None, "finish_reason": "stop"},
        ),
        (False, True, False, {"index": 0, "text": "hi", "logprobs": None, "finish_reason": "stop"}),
        (
            True,
            False,
            False,
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "logprobs": None,
                "finish_reason": "stop",
            },
        ),
        (
            True,
            True,
            True,
            {
                "index": 0,
                "delta": {"role": "assistant", "content": "hi"},
                "logprobs": None,
                "finish_reason": "stop",
            },
        ),
        (
            True,
            True,
            False,
            {"index": 0, "delta": {"content": "hi"}, "logprobs": None, "finish_reason": "stop"},
        ),
    ],
    ids=["completion", "completion chunk", "chat", "first chat chunk", "chat chunk"],
)
def test_each_shape_key_for_key(chat, stream, first, want):
    got = api.choice(chat, stream, "hi", "stop", None, first=first)
    assert got == want, f"expected {want}, got {got}"


# -------------------------------------------------------------------------------- stream_events


def test_events_are_data_lines_and_done_comes_last():
    front = FakeFrontend(replies(["Why", ",", " then"]))
    events = run_stream(front, answer())
    bad = [
        e
        for e in events
        if not (e.startswith("data: ") and e.endswith("\n\n") and "\n" not in e[:-2])
    ]
    assert not bad, f"every event should be one 'data: ' line and a blank line, got {bad[0]!r}"
    assert events[-1] == "data: [DONE]\n\n", f"the last event should be [DONE], got {events[-1]!r}"


def test_the_stream_carries_the_text_and_only_the_last_chunk_a_finish_reason():
    front = FakeFrontend(replies(["Why", ",", " then"], reason="stop"))
    chunks = data(run_stream(front, answer()))
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Why, then", f"joined text: {chunks}"
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert reasons[-1] == "stop" and not any(reasons[:-1]), (
        f"only the last chunk finishes, got {reasons}"
    )


def with_logprobs(rs: List[UserReply]) -> List[UserReply]:
    """The replies of a request that asked for logprobs: each carries its tokens' piece (in a
    completion's shape, as the tokenizer worker builds it); the second has no text."""
    for i, r in enumerate(rs):
        r.logprobs = {"tokens": [f"t{i}"], "token_logprobs": [-0.5 - i], "top_logprobs": [None]}
    return rs


def test_each_chunk_carries_its_replys_logprobs():
    front = FakeFrontend(with_logprobs(replies(["Why", "", " then"], reason="stop")))
    chunks = data(run_stream(front, answer()))
    got = [c["choices"][0]["logprobs"] for c in chunks]
    want = [
        {"tokens": [f"t{i}"], "token_logprobs": [-0.5 - i], "top_logprobs": [None]}
        for i in (0, 1, 2)
    ]
    assert got == want, (
        "a reply's logprobs go in its own chunk's choice, a reply with logprobs but no text "
        f"still sends its chunk: got {got}"
    )


def test_the_last_reply_is_sent_even_with_no_text():
    chunks = data(run_stream(FakeFrontend(replies(["Why", ""], reason="stop")), answer()))
    assert chunks and chunks[-1]["choices"][0]["finish_reason"] == "stop", (
        "the last reply (EOS: no text) must still send its finish_reason, got "
        f"{[c['choices'] for c in chunks]}"
    )


def test_chunks_are_what_the_openai_client_reads():
    chat = data(
        run_stream(FakeFrontend(replies(["Good", " morrow"])), answer(chat=True, usage=True))
    )
    for chunk in chat:
        client_reads(ChatCompletionChunk, chunk)  # raises if the object or a field is wrong
    plain = data(run_stream(FakeFrontend(replies(["Why", ","])), answer(usage=True)))
    assert {c["object"] for c in plain} == {"text_completion"}, (
        "a completion's chunks are text_completion objects, got "
        f"{sorted({c['object'] for c in plain})}"
    )


def test_a_reply_with_nothing_to_say_sends_no_chunk_unless_ids_are_asked_for():
    texts = [
        "A",
        " rose",
        " ",
        "",
        "",
        "",
        "🌹",
    ]  # three byte tokens waiting for the rest of a character
    plain = data(run_stream(FakeFrontend(replies(texts)), answer()))
    assert [c["choices"][0]["text"] for c in plain] == ["A", " rose", " ", "🌹"], (
        f"replies with no text are not sent, got {[c['choices'][0]['text'] for c in plain]}"
    )
    with_ids = data(run_stream(FakeFrontend(replies(texts)), answer(ids=True)))
    assert [c["choices"][0]["token_ids"] for c in with_ids] == [[100 + i] for i in range(7)], (
        "with return_token_ids, every token's id is sent, in a chunk of its own"
    )


def test_a_chat_stream_starts_with_the_role():
    chunks = data(
        run_stream(FakeFrontend(replies(["", "Good", " morrow", ","])), answer(chat=True))
    )
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "Good"}, (
        "the first reply has nothing to say and sends nothing; the first chunk sent names the "
        f"role, got {chunks[0]}"
    )
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:]), (
        "only the first chunk names the role"
    )


def test_usage_comes_last_before_done_when_asked():
    events = run_stream(
        FakeFrontend(replies(["Why", ",", " then"], prompt_tokens=5)), answer(usage=True)
    )
    assert events[-1] == api.SSE_DONE, f"[DONE] still comes last, got {events[-1]!r}"
    chunks = data(events)
    last = chunks[-1]
    assert last["choices"] == [] and last.get("usage") == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
    }, (
        "the usage chunk should have no choices and count 5 + 3 tokens (the prompt's 5 from the "
        f"first reply: the later ones carry 0), got {last}"
    )
    assert all("usage" not in c for c in chunks[:-1]), "usage only in its own last chunk"


# Replies that carry several token ids, or none (a `max_tokens: 0` request's scoring reply has
# none): a count of replies is not a count of tokens.
UNEVEN_TEXTS = ["Why", "", ", then", " I'll"]
UNEVEN_IDS = [[100, 101], [], [102, 103, 104], [105]]


def test_usage_counts_token_ids_not_replies():
    front = FakeFrontend(replies(UNEVEN_TEXTS, prompt_tokens=5, ids=UNEVEN_IDS))
    last = data(run_stream(front, answer(usage=True)))[-1]
    assert last.get("usage") == {
        "prompt_tokens": 5,
        "completion_tokens": 6,
        "total_tokens": 11,
    }, (
        "the prompt's 5 tokens (the first reply's count) and 4 replies carrying 2, 0, 3 and 1 "
        "token ids: the answer has 6 tokens, got "
        f"{last.get('usage')}"
    )


def test_a_failure_mid_stream_is_an_error_event_and_no_done():
    failed = UserReply(
        uid=7, finished=True, error="the server cannot serve: minisgl-scheduler exited", status=500
    )
    front = FakeFrontend(replies(["Why", ","])[:1] + [failed])
    events = run_stream(front, answer())
    assert api.SSE_DONE not in events, (
        "a failed stream must not end with [DONE], which says all is well"
    )
    error = json.loads(events[-1][6:]).get("error", {})
    assert error.get("type") == "server_error" and "minisgl-scheduler" in error.get(
        "message", ""
    ), f"the last event should be the OpenAI error body, got {events[-1]!r}"
    assert front.released == [(7, False)], (
        f"a failed request is released without an abort, got {front.released}"
    )
    front = FakeFrontend(replies(["Why", ","])[:1] + [failed])
    run_stream(front, answer(), take=2)  # the client leaves at the error event itself
    assert front.released == [(7, False)], (
        "the request had failed when its error event was sent: a client leaving at that event "
        f"does not make it an abort, got {front.released}"
    )


def test_a_finished_stream_releases_without_abort():
    front = FakeFrontend(replies(["Why", ",", " then"]))
    run_stream(front, answer())
    assert front.released == [(7, False)], (
        f"a finished request is released once, with abort=False; got {front.released}"
    )


def test_a_client_leaving_at_the_finishing_chunk_does_not_abort():
    """The request ended when its finishing reply came; the client has its last chunk and may
    leave before the usage or [DONE]: nothing runs any more, so nothing is aborted."""
    front = FakeFrontend(replies(["Why", ",", " then"]))
    run_stream(front, answer(usage=True), take=3)  # the third chunk is the finishing one
    assert front.released == [(7, False)], (
        "the client left at the finishing chunk, after the request had finished: it is released "
        f"with abort=False, got {front.released}"
    )


def test_a_client_that_leaves_aborts_its_request():
    front = FakeFrontend(replies(["Why", ",", " then", " I'll", " tell"]))
    run_stream(front, answer(), take=2)
    assert front.released == [(7, True)], (
        "the client left after 2 events: the request must be released with abort=True, got "
        f"{front.released}"
    )


# ------------------------------------------------------------------------------------- collect


def run_collect(front: FakeFrontend, ans: Answer, request: FakeRequest):
    async def go():
        response = await collect(front, 7, front.replies.pop(0), ans, request)
        await asyncio.sleep(0)  # let a cancelled watcher see its cancellation
        request.watching_after = request.waiting
        return response

    return asyncio.run(go())


def test_a_plain_answer_joins_the_text_and_counts_the_tokens():
    front, request = (
        FakeFrontend(replies(["Why", ",", " then"], reason="stop", prompt_tokens=4)),
        FakeRequest(),
    )
    response = run_collect(front, answer(ids=True), request)
    body = json.loads(response.body)
    parsed = client_reads(Completion, body)
    assert (
        response.status_code == 200
        and parsed.choices[0].text == "Why, then"
        and parsed.choices[0].finish_reason == "stop"
    ), f"expected 'Why, then', finish_reason 'stop'; the openai client read {parsed.choices[0]}"
    assert body["choices"][0].get("token_ids") == [100, 101, 102], (
        f"asked for, every token id: {body['choices'][0]}"
    )
    assert body.get("usage") == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}, (
        "usage should count the prompt's 4 tokens (from the first reply: the later ones carry 0) "
        f"and the 3 token ids, got {body.get('usage')}"
    )
    assert front.released == [(7, False)], (
        f"a finished request is released with abort=False, got {front.released}"
    )
    assert request.watching_after == 0, (
        "once answered, nothing may go on waiting for the client's disconnect"
    )


def test_a_plain_answer_joins_its_replies_logprobs():
    front = FakeFrontend(with_logprobs(replies(["Why", ",", " then"], reason="stop")))
    body = json.loads(run_collect(front, answer(), FakeRequest()).body)
    assert body["choices"][0]["logprobs"] == {
        "tokens": ["t0", "t1", "t2"],
        "token_logprobs": [-0.5, -1.5, -2.5],
        "top_logprobs": [None, None, None],
    }, f"each list of the replies' pieces joined in order: {body['choices'][0]['logprobs']}"
    plain = json.loads(run_collect(FakeFrontend(replies(["Why"])), answer(), FakeRequest()).body)
    assert plain["choices"][0]["logprobs"] is None, "no logprobs asked: the field stays null"


def test_a_plain_answers_usage_counts_token_ids_not_replies():
    front = FakeFrontend(replies(UNEVEN_TEXTS, prompt_tokens=5, ids=UNEVEN_IDS))
    body = json.loads(run_collect(front, answer(ids=True), FakeRequest()).body)
    assert body["choices"][0].get("token_ids") == [100, 101, 102, 103, 104, 105], (
        f"every reply's token ids, in order: {body['choices'][0].get('token_ids')}"
    )
    assert body.get("usage") == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}, (
        "the prompt's 5 tokens (the first reply's count) and 4 replies carrying 2, 0, 3 and 1 "
        f"token ids: 6 tokens, got {body.get('usage')}"
    )


def test_a_plain_chat_answer_is_a_chat_completion():
    response = run_collect(
        FakeFrontend(replies(["Good", " morrow"])), answer(chat=True), FakeRequest()
    )
    parsed = client_reads(ChatCompletion, json.loads(response.body))
    assert parsed.choices[0].message.content == "Good morrow", (
        f"the openai client read {parsed.choices[0]}"
    )


def test_a_failure_is_answered_with_its_status_and_error_body():
    failed = UserReply(
        uid=7, finished=True, error="the server cannot serve: minisgl-scheduler exited", status=500
    )
    front = FakeFrontend(replies(["Why", ","])[:1] + [failed])
    response = run_collect(front, answer(), FakeRequest())
    error = json.loads(response.body).get("error", {})
    assert response.status_code == 500 and "minisgl-scheduler" in error.get("message", ""), (
        f"expected a 500 with the error body, got {response.status_code} {response.body[:120]!r}"
    )
    assert front.released == [(7, False)], (
        f"a failed request is released without an abort, got {front.released}"
    )


def test_a_client_leaving_a_plain_request_aborts_it():
    front = FakeFrontend(replies(["Why", ","])[:1])  # then no more replies: the request runs on
    response = run_collect(front, answer(), FakeRequest(leave_after=1))
    assert response.status_code == 499, (
        f"nobody is listening: expected 499, got {response.status_code}"
    )
    assert front.released == [(7, True)], (
        f"the client left: the request must be aborted, got {front.released}"
    )


def test_the_live_server_answers_with_this_code():
    """The real three-process server (`python -m minisgl serve`), with this chapter's code in
    every process, answers the official openai client as the offline engine does
    (live_server.py)."""
    from live_server import check_live_server

    check_live_server("chapter 15")
