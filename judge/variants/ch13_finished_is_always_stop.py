"""`detokenize` that says every request finished with "stop".

OpenAI's clients (and people) read finish_reason to tell an answer the model ended ("stop") from one
that ran out of max_tokens ("length") and may have been cut mid-sentence. Always "stop" hides every
truncation.
"""

from minisgl.message import UserReply


def detokenize(self, msg):
    info = self.requests.get(msg.uid)
    if info is None:
        return None
    if msg.error is not None:
        del self.requests[msg.uid]
        return UserReply(
            uid=msg.uid,
            finished=True,
            error=msg.error,
            status=400,
            prompt_tokens=info.prompt_tokens,
        )
    # noqa: F821
    text = (
        next_text(self.tokenizer, info.decode, [msg.next_token], msg.finished)
        if self.tokenizer
        else ""
    )
    reason = None
    if msg.finished:
        del self.requests[msg.uid]
        reason = "stop"  # the bug
    return UserReply(
        uid=msg.uid,
        text=text,
        token_ids=[msg.next_token],
        finished=msg.finished,
        finish_reason=reason,
        prompt_tokens=info.prompt_tokens,
    )
