"""`stream_options.continuous_usage_stats`, as vLLM honours it (and guidellm asks for it by
default): every chunk of a stream carries the usage so far, the prompt's tokens and the tokens
generated up to and including that chunk's.

`stream_events` (responses.py) builds the chunks and knows nothing of this: it gets the request's
replies through a `TokenCounter`, which counts the token ids of each reply it hands on, and its
events pass through `with_running_usage`, which writes the count into each chunk. A chunk is
yielded after its reply was taken and before the next one is asked for, so the count it gets is
exactly the tokens of the replies it stands for.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from minisgl.message import UserReply

from . import openai_api as api


class TokenCounter:
    """A Frontend as `stream_events` uses it, counting the token ids of the replies it hands on
    (from `first`, which the caller already took)."""

    def __init__(self, frontend, first: UserReply) -> None:
        self.frontend, self.tokens = frontend, len(first.token_ids)

    async def next_reply(self, uid: int) -> Any:
        reply = await self.frontend.next_reply(uid)
        self.tokens += len(getattr(reply, "token_ids", None) or ())
        return reply

    def release(self, uid: int, abort: bool) -> None:
        self.frontend.release(uid, abort)


async def with_running_usage(
    events: AsyncIterator[str], counter: TokenCounter, prompt_tokens: int
) -> AsyncIterator[str]:
    """`events`, each chunk with choices given "usage": `prompt_tokens` and `counter.tokens`."""
    try:
        async for event in events:
            data = event.removeprefix("data: ").strip()
            if data.startswith("{"):
                chunk = json.loads(data)
                if chunk.get("choices"):
                    chunk["usage"] = api.usage(prompt_tokens, counter.tokens)
                    event = api.sse_event(chunk)
            yield event
    finally:
        await events.aclose()  # its own `finally` releases (or aborts) the request
