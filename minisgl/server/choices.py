"""One response with several choices: a list of prompts, or `n` samples of each, or both.

Each choice is a request of its own in the engine (its own uid; once one of them has been
prefilled, the radix cache can share the prompt with those that come later), answered by the same
`collect` and `stream_events` as a one-choice response; this module joins their answers into one.
Choice `index` is `prompt * n + sample`, as the OpenAI API numbers them. Usage counts each
prompt's tokens once (not once per sample) and every choice's generated tokens.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import AsyncIterator, Dict, List

from fastapi.responses import JSONResponse

from minisgl.message import UserReply

from . import openai_api as api
from . import responses
from .frontend import Frontend
from .responses import Answer
from .running_usage import TokenCounter, with_running_usage


def usage_of(n: int, prompt_tokens: List[int], completion_tokens: List[int]) -> Dict[str, int]:
    """Choice i samples prompt i // n: a prompt's tokens count once, every choice's output."""
    return api.usage(sum(prompt_tokens[::n]), sum(completion_tokens))


async def collect_choices(
    frontend: Frontend, uids: List[int], firsts: List[UserReply], answer: Answer, request, n: int
) -> JSONResponse:
    """The JSON answer with one choice per request `uids[i]` (index i), or the first error (or 499)
    any of them met; a client that leaves aborts every request still running (each `collect`
    watches the connection: uvicorn answers every `receive()` after a disconnect with one)."""
    tasks = [
        asyncio.ensure_future(responses.collect(frontend, uid, first, answer, request))
        for uid, first in zip(uids, firsts)
    ]
    try:
        answers = await asyncio.gather(*tasks)
    finally:  # cancelled (the server stops) or one raised: the others end, aborting their requests
        for t in tasks:
            t.cancel()
    failed = next((a for a in answers if a.status_code != 200), None)
    if failed is not None:
        return failed
    bodies = [json.loads(a.body) for a in answers]
    body = {**bodies[0], "choices": [{**b["choices"][0], "index": i} for i, b in enumerate(bodies)]}
    body["usage"] = usage_of(
        n,
        [b["usage"]["prompt_tokens"] for b in bodies],
        [b["usage"]["completion_tokens"] for b in bodies],
    )
    return JSONResponse(body)


async def stream_choices(
    frontend: Frontend, uids: List[int], firsts: List[UserReply], answer: Answer, n: int
) -> AsyncIterator[str]:
    """The server-sent events of several requests in one stream, each chunk's choice with its
    index, in the order the tokens come; one usage chunk (if asked) and one [DONE] at the end. An
    error event (the server failed) ends the stream, as it ends a one-choice stream; the stream
    ending early (its client left) aborts every request still running."""
    each = replace(answer, include_usage=True)  # their usage chunks are summed into one
    streams = []
    for uid, first in zip(uids, firsts):
        if answer.continuous_usage:  # each chunk's usage so far, summed below over the choices
            counter = TokenCounter(frontend, first)
            stream = responses.stream_events(counter, uid, first, each)
            streams.append(with_running_usage(stream, counter, first.prompt_tokens))
        else:
            streams.append(responses.stream_events(frontend, uid, first, each))
    prompt_tokens = [f.prompt_tokens for f in firsts]
    events: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream) -> None:
        try:
            async for event in stream:
                events.put_nowait((i, event))
        except Exception as e:  # raised in the stream below: raised again in this one
            events.put_nowait((i, e))
        finally:
            await stream.aclose()  # its own `finally` releases (aborts) its request
            events.put_nowait((i, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running, completion = len(tasks), [0] * len(tasks)
        while running:
            i, event = await events.get()
            if event is None:
                running -= 1
                continue
            if isinstance(event, Exception):
                raise event
            if event == api.SSE_DONE:
                continue
            chunk = json.loads(event.removeprefix("data: "))
            if "error" in chunk:
                yield event
                return
            if "usage" in chunk and not chunk["choices"]:
                completion[i] = chunk["usage"]["completion_tokens"]
                continue
            for choice in chunk["choices"]:
                choice["index"] = i
            if "usage" in chunk:  # this choice's tokens so far: the response's, every choice's
                completion[i] = chunk["usage"]["completion_tokens"]
                chunk["usage"] = usage_of(n, prompt_tokens, completion)
            yield api.sse_event(chunk)
        if answer.include_usage:
            tail = api.envelope(answer.chat, True, answer.rid, answer.created, answer.model, [])
            tail["usage"] = usage_of(n, prompt_tokens, completion)
            yield api.sse_event(tail)
        yield api.SSE_DONE
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
