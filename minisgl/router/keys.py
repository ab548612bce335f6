"""What the router routes a request by: the prompt a worker's prefix cache would hold.

    /v1/completions       the prompt: a text as it is, token ids as a tuple; of a list of
                          prompts, the first (the others most often share its head)
    /v1/chat/completions  the messages as JSON, in order: the system prompt comes first, so
                          two chats of one tenant share the head of their keys
Any other request, or a body that is not a JSON object with those fields, has no key (None): it is
routed without the trees, and the worker answers it as it would without a router (a bad body gets
the worker's own 400, word for word).
"""

from __future__ import annotations

import json

from .tree import Key


def routing_key(path: str, body: bytes) -> Key | None:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    if path == "/v1/chat/completions":
        messages = data.get("messages")
        return json.dumps(messages, ensure_ascii=False) if isinstance(messages, list) else None
    if path == "/v1/completions":
        prompt = data.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a list of prompts
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return tuple(prompt)
    return None
