"""`stream_events` that sends a chunk only for text, ids asked for or the end, not for logprobs.

A client that asked for logprobs misses those of every reply without text: the tokens and their
logprobs it joins are fewer than the tokens the answer has.
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
            # Finished once its last reply is seen, before that reply's chunk is sent: a client
            # that leaves at that chunk has nothing left running to abort.
            done = reply.finished
            # the bug: no chunk for logprobs alone
            if reply.text or reply.finished or answer.return_token_ids:
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
