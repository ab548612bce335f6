"""`stream_events` that marks the request finished only after its finishing chunk was taken.

A client that leaves at the finishing chunk (it has the whole text and does not wait for the usage
or [DONE]) closes the generator at that chunk's `yield`, before `done` is set: the request, which
has finished, is released with an abort. The abort crosses to the tokenizer worker for a request it
has already forgotten, and the release says the answer was cut short when it was whole.
"""

from minisgl.server import openai_api as api
from minisgl.server.openai_api import ErrorInfo


async def stream_events(
    frontend: Frontend, uid: int, first: UserReply, answer: Answer
) -> AsyncIterator[str]:
    done, reply, n_tokens, is_first = False, first, 0, True
    try:
        while True:
            if reply.error is not None:
                done = True
                yield api.sse_event(ErrorInfo(reply.status, reply.error).body())
                return
            n_tokens += len(reply.token_ids)
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
            if reply.finished:
                done = True  # the bug: only once the finishing chunk has been taken
                break
            reply = await frontend.next_reply(uid)
        if answer.include_usage:
            tail = api.envelope(answer.chat, True, answer.rid, answer.created, answer.model, [])
            tail["usage"] = api.usage(first.prompt_tokens, n_tokens)
            yield api.sse_event(tail)
        yield api.SSE_DONE
    finally:
        frontend.release(uid, abort=not done)
