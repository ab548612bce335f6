"""`collect` whose usage counts replies instead of token ids.

Right while every reply carries one token id; wrong as soon as one carries none (a `max_tokens: 0`
request's scoring reply) or several: `completion_tokens` is then the number of replies.
"""

import asyncio

from fastapi.responses import JSONResponse

from minisgl.server import openai_api as api
from minisgl.server.openai_api import ErrorInfo


async def collect(
    frontend: Frontend, uid: int, first: UserReply, answer: Answer, request: Request
) -> JSONResponse:
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
    body["usage"] = api.usage(first.prompt_tokens, len(texts))  # the bug: replies
    return JSONResponse(body)
