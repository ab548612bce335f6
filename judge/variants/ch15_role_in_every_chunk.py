"""`choice` that names the role in every chunk of a chat stream, and none in a whole chat's message.

Clients that assemble a stream's deltas expect the role once; a whole chat completion without its
message's role is not a ChatCompletion the openai client can parse.
"""


def choice(chat, stream, text, finish_reason, token_ids, first=False):
    out = {"index": 0}
    if chat and stream:
        out["delta"] = {"role": "assistant", "content": text}  # the bug: in every chunk
    elif chat:
        out["message"] = {"content": text}  # the bug: no role
    else:
        out["text"] = text
        out["logprobs"] = None
    if chat:
        out["logprobs"] = None
    out["finish_reason"] = finish_reason
    if token_ids is not None:
        out["token_ids"] = token_ids
    return out
