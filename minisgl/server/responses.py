"""Answering one request from its replies: a JSON body, or a stream of server-sent events.

Both start from the request's first reply, which app.py waits for before answering (so that a
refusal gets its status code), and both release the request when they end: with an abort if it has
not finished, which is what happens when its client goes away.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from minisgl.message import UserReply

from . import openai_api as api
from .frontend import Frontend
from .openai_api import ErrorInfo


@dataclass
class Answer:
    """What the answer to one request looks like, whatever its replies say."""

    chat: bool
    rid: str  # the response id, "cmpl-7" or "chatcmpl-7"
    model: str
    return_token_ids: bool = False
    include_usage: bool = False  # streams only: a last chunk with the usage
    continuous_usage: bool = False  # streams only: the usage so far in every chunk too
    created: int = field(default_factory=lambda: int(time.time()))


def error_response(e: ErrorInfo) -> JSONResponse:
    """The answer to a request that failed: the OpenAI error body of `e`, with its status."""
    return JSONResponse(e.body(), status_code=e.status)


async def stream_events(
    frontend: Frontend, uid: int, first: UserReply, answer: Answer
) -> AsyncIterator[str]:
    """The server-sent events answering request `uid`, from its first reply to `data: [DONE]`.

    Receives: `frontend`, whose `next_reply(uid)` awaits the request's next UserReply; `first`, its
        first reply (no error: a refusal was answered before streaming began); `answer`, the shape
        of the chunks.
    Returns: an async generator of str, each one event (`api.sse_event`): one chunk per reply that
        has text, or token ids to return, or logprobs, or finishes, and none for a reply with
        nothing of these (a chat's first chunk sent names the role; a reply's `logprobs`, not None
        exactly when the request asked for them, is its chunk's choice's); after the finishing
        chunk, a usage chunk if asked for (the prompt's tokens and the answer's token ids over
        every reply, which may carry several or none), then `api.SSE_DONE`. A reply with an error
        (the server failed) gives one error event (`ErrorInfo.body()`) and ends the stream, no
        [DONE].
    Leaves: the request released (`frontend.release`) when the generator ends, however it ends:
        with `abort=True` unless it finished (its finishing reply seen, even if the client leaves
        at that reply's own chunk) or failed, so a client that leaves mid-answer aborts it.
    Uses: `frontend.next_reply(uid)`, `frontend.release(uid, abort)`; `api.sse_event(data)`,
        `api.choice(chat, stream, text, finish_reason, token_ids, first=False)`,
        `api.envelope(chat, stream, rid, created, model, choices)`,
        `api.usage(prompt_tokens, completion_tokens)` (the usage dict), `api.SSE_DONE`.
    Checked: events are `data: ` lines ended by a blank line, [DONE] last; only the last chunk has a
        finish_reason; the role in a chat's first chunk only, even when the first reply sent
        nothing; a chunk for a reply with only ids asked for or only logprobs; the text and token
        ids joined equal the offline engine's; usage counts the prompt's tokens and the answer's
        token ids, not its replies; a client that leaves mid-stream aborts its request and every
        slot and page comes back, one that leaves at the finishing chunk does not abort; a
        scheduler crash mid-stream gives an error event, not a hang.
    """
    done, reply, n_tokens, is_first = False, first, 0, True
    try:
        while True:
            if reply.error is not None:
                done = True
                yield api.sse_event(ErrorInfo(reply.status, reply.error).body())
                return
            n_tokens += len(reply.token_ids)
            # Finished once its last reply is seen, before that reply's chunk is sent: a client
            # that leaves at that chunk has nothing left running to abort.
            done = reply.finished
            if reply.text or reply.finished or answer.return_token_ids or reply.logprobs:
                choice = api.choice(
                    answer.chat,
                    True,
                    reply.text,
                    reply.finish_reason,
                    reply.token_ids if answer.return_token_ids else None,
                    first=is_first,
                )
                if reply.logprobs is not None:  # the request asked (reply_shaper.py)
                    choice["logprobs"] = reply.logprobs
                yield api.sse_event(
                    api.envelope(
                        answer.chat, True, answer.rid, answer.created, answer.model, [choice]
                    )
                )
                is_first = False
            if done:
                break
            reply = await frontend.next_reply(uid)
        if answer.include_usage:
            tail = api.envelope(answer.chat, True, answer.rid, answer.created, answer.model, [])
            tail["usage"] = api.usage(first.prompt_tokens, n_tokens)
            yield api.sse_event(tail)
        yield api.SSE_DONE
    finally:
        frontend.release(uid, abort=not done)


async def collect(
    frontend: Frontend, uid: int, first: UserReply, answer: Answer, request: Request
) -> JSONResponse:
    """The JSON answer to a request that is not streamed, or its error.

    Receives: `frontend` (`next_reply(uid)` awaits the request's next UserReply; `release`),
        `first`, its first reply (no error), `answer`, the shape; `request`, the HTTP request,
        whose `receive()` returns {"type": "http.disconnect"} once its client has left.
    Returns: a JSONResponse: the envelope (`api.envelope`) with one choice (`api.choice`) holding
        every reply's text joined, the last reply's finish_reason and, if asked, every token id
        and the replies' logprobs joined (a reply's `logprobs` is not None exactly when the request
        asked), and "usage" (the prompt's tokens and the answer's token ids over every reply,
        which may carry several or none); or, for a reply with an error, the error body
        (`ErrorInfo(reply.status, reply.error).body()`) with that status; or, if the client left
        first, an empty 499.
    Leaves: the request released (`frontend.release`): with `abort=True` if its client left
        before it finished, else `abort=False`; the disconnect watcher cancelled.
    Uses: `disconnected(request)`, `first_of(awaitable, gone)` (None when `gone` finished first),
        `frontend.next_reply(uid)`, `frontend.release(uid, abort)`, `api.choice`, `api.envelope`,
        `api.usage(prompt_tokens, completion_tokens)` (the usage dict),
        `api.joined_logprobs(pieces)` (the replies' logprobs dicts, in order: one dict, each list
        joined), `error_response(e: ErrorInfo)` (a JSONResponse of `e.body()` with `e.status`).
    Checked: text, ids, finish reason and usage of the whole answer (token ids counted, not
        replies); a failed request answers with
        its error and status; a client that leaves aborts its request; the live server's plain
        completions equal the offline engine's.
    """
    gone = asyncio.ensure_future(disconnected(request))
    texts, ids, reply, done = [], [], first, False
    logprobs = []  # each reply's piece, for a request that asked
    try:
        while True:
            if reply.error is not None:
                done = True
                return error_response(ErrorInfo(reply.status, reply.error))
            texts.append(reply.text)
            ids.extend(reply.token_ids)
            if reply.logprobs is not None:
                logprobs.append(reply.logprobs)
            if reply.finished:
                done = True
                break
            reply = await first_of(frontend.next_reply(uid), gone)
            if reply is None:
                return JSONResponse({}, status_code=499)
    finally:
        gone.cancel()
        frontend.release(uid, abort=not done)
    choice = api.choice(
        answer.chat,
        False,
        "".join(texts),
        reply.finish_reason,
        ids if answer.return_token_ids else None,
    )
    if logprobs:
        choice["logprobs"] = api.joined_logprobs(logprobs)
    body = api.envelope(answer.chat, False, answer.rid, answer.created, answer.model, [choice])
    body["usage"] = api.usage(first.prompt_tokens, len(ids))
    return JSONResponse(body)


async def first_of(reply, gone: asyncio.Future):
    """The awaited reply, or None if `gone` (the client's disconnect) comes first."""
    task = asyncio.ensure_future(reply)
    await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        return task.result()
    task.cancel()
    return None


async def disconnected(request: Request) -> None:
    """Returns once the client has disconnected (its body has been read, so nothing else comes)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
