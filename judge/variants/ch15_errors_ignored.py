"""`stream_events` that never looks at a reply's error.

A reply with an error is finished and has no text: this stream sends it as the last chunk (no
finish reason), then `data: [DONE]`. The client reads a cut answer that says it is whole, and
nobody learns that the server failed (chapter 14's watchdog fails every request in flight so that
its client is told). The error must end the stream as the OpenAI error body, without [DONE].
"""

from minisgl.server import openai_api as api


async def stream_events(
    frontend: Frontend, uid: int, first: UserReply, answer: Answer
) -> AsyncIterator[str]:
    done, reply, n_tokens, is_first = False, first, 0, True
    try:
        while True:
            # the bug: no look at reply.error
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
