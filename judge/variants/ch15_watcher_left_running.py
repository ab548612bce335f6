"""`collect` that never cancels its disconnect watcher.

The answer is right, but the watcher, a task waiting on the connection for the client to leave,
outlives the request it watched: one task a request, each holding the request's ASGI receive
channel, until the client closes its keep-alive connection, which may be never. A server that
answers many plain requests on kept-alive connections accumulates them.
"""

import asyncio

from fastapi.responses import JSONResponse

from minisgl.server import openai_api as api
from minisgl.server.openai_api import ErrorInfo


async def collect(
    frontend: Frontend, uid: int, first: UserReply, answer: Answer, request: Request
) -> JSONResponse:
    gone = asyncio.ensure_future(disconnected(request))  # noqa: F821 (the module's)
    texts, ids, reply, done = [], [], first, False
    try:
        while True:
            if reply.error is not None:
                done = True
                return error_response(ErrorInfo(reply.status, reply.error))  # noqa: F821
            texts.append(reply.text)
            ids.extend(reply.token_ids)
            if reply.finished:
                done = True
                break
            reply = await first_of(frontend.next_reply(uid), gone)  # noqa: F821
            if reply is None:
                return JSONResponse({}, status_code=499)
    finally:
        frontend.release(uid, abort=not done)  # the bug: the watcher is never cancelled
    choice = api.choice(
        answer.chat,
        False,
        "".join(texts),
        reply.finish_reason,
        ids if answer.return_token_ids else None,
    )
    body = api.envelope(answer.chat, False, answer.rid, answer.created, answer.model, [choice])
    body["usage"] = api.usage(first.prompt_tokens, len(ids))
    return JSONResponse(body)
