"""`stream_events` that names the role in the chunk of the first reply, not in the first chunk.

When the first reply has nothing to say (a chat whose first token is the start of a character, or
a stop string held back) it sends no chunk, and the chunk that is sent first has no role: a client
that assembles the deltas never learns that the message is the assistant's.
"""

from minisgl.server import openai_api as api
from minisgl.server.openai_api import ErrorInfo


async def stream_events(
    frontend: Frontend, uid: int, first: UserReply, answer: Answer
) -> AsyncIterator[str]:
    done, reply, n_tokens = False, first, 0
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
                    first=reply is first,  # the bug: the first reply, sent or not
                )
                if reply.logprobs is not None:  # the request asked (reply_shaper.py)
                    choice["logprobs"] = reply.logprobs
                yield api.sse_event(
                    api.envelope(
                        answer.chat, True, answer.rid, answer.created, answer.model, [choice]
                    )
                )
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
