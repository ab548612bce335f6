"""Stop strings and stop token ids, checked where the request's slot and pages are: here, in the
scheduler, on each token as the CPU receives it (extras.py's RequestExtras).

Why here and not in the detokenizer: a request that hits its stop must stop *running* (no more
decode steps, its slot and KV back at once), and only the scheduler can decide that without a
round trip; a detokenizer that found the stop would have to send an abort back, and the request
would keep decoding (and holding memory) until it arrived. Upstream SGLang checks in the scheduler
too, on a decoded tail of the output. The front ends (LLM.generate, the server's tokenizer worker)
then cut the text before the stop string (minisgl/llm/stops.py): they own the text.

A stop string can only be complete once its last token has arrived, so each step decodes just the
output's last few tokens: a string of B bytes spans at most B tokens, plus one token of context
(that may begin in the middle of a character).
"""

from __future__ import annotations

from minisgl.core import Req


class StopChecker:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer  # None: the model directory has no tokenizer.json

    def refusal(self, params) -> str | None:
        """Why a request's stops cannot be honoured here, or None."""
        if params.stop and self.tokenizer is None:
            return "stop strings need the model's tokenizer (this model directory has none)"
        return None

    def hit(self, req: Req, next_token: int, prompt_len: int | None = None) -> bool:
        """Whether `next_token`, about to be appended to `req.input_ids`, ends the request by a
        stop token id or by completing a stop string. `prompt_len`: where the output starts in
        `req.input_ids`, when it is not where the request's own prompt ends (a request resumed
        after a retraction has its earlier output in its prompt)."""
        params = req.sampling_params
        if next_token in params.stop_token_ids:
            return True
        if not params.stop:
            return False
        if prompt_len is None:
            prompt_len = req.max_device_len - req.output_len
        window = max(len(s.encode()) for s in params.stop)  # tokens before the new one
        start = max(prompt_len, len(req.input_ids) - window)
        tail = self.tokenizer.decode(req.input_ids[start:].tolist() + [next_token])
        return any(s in tail for s in params.stop)
