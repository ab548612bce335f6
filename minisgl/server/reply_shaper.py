"""What the tokenizer worker does to a request's replies beyond detokenizing them, for the requests
that ask: stop strings (the text ends before the first one, and a stream holds back what could be
the start of one), stop token ids (not shown, finish_reason "stop"), `echo` (the prompt's text
first), `max_tokens: 0` (no generated token) and logprobs in the OpenAI response's shape.

The scheduler has already ended a request that hit a stop (minisgl/scheduler/stops.py): its slot
and pages are back. The scheduler looks at a decoded tail of the output, this looks at the whole
text; should this find a stop the scheduler missed, the request is ended from here (an abort).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

from minisgl.core import SamplingParams
from minisgl.llm.stops import first_stop, held_back
from minisgl.message import DetokenizeMsg, UserReply


def needs_shaping(params: SamplingParams, echo: bool) -> bool:
    return bool(
        params.stop
        or params.stop_token_ids
        or params.max_tokens == 0
        or params.logprobs is not None
        or echo
    )


@dataclass
class ReplyShaper:
    tokenizer: Any  # None: ids only
    params: SamplingParams
    chat: bool
    prompt_ids: List[int]
    echo: bool = False
    prompt_text: str | None = None  # the prompt as the client sent it (None: decode the ids)
    text: str = ""  # the generated text received so far (the joined pieces of next_text)
    sent: int = 0  # how much of it has been sent
    offset: int = 0  # text_offset of the next token (characters of the answer before it)
    ids: List[int] = field(default_factory=list)
    first: bool = True

    def shape(self, reply: UserReply, msg: DetokenizeMsg) -> bool:
        """Rewrite `reply` in place; True when this reply ends the request early (a stop string
        the scheduler did not see: the caller aborts it there)."""
        p = self.params
        early = False
        if p.max_tokens == 0:  # the prompt was scored; the token sampled after it is not returned
            new_ids, reply.text, reply.token_ids = [], "", []
        else:
            new_ids = [msg.next_token]
            self.ids.append(msg.next_token)
            self.text += reply.text
            if reply.finished and msg.next_token in p.stop_token_ids:
                self.text = self._decode(self.ids[:-1])  # a stop token id is not shown
                reply.finish_reason = "stop"
            cut = first_stop(self.text, p.stop)
            if cut is not None:
                end = max(cut, self.sent)
                early = not reply.finished
                reply.finished, reply.finish_reason = True, "stop"
            elif reply.finished:
                end = len(self.text)
            else:
                end = len(self.text) - held_back(self.text, p.stop)
            reply.text = self.text[self.sent : max(end, self.sent)]
            self.sent = max(end, self.sent)
        prefix = ""
        if self.first and self.echo:
            prefix = self.prompt_text
            if prefix is None:
                prefix = self._decode(self.prompt_ids)
            reply.text = prefix + reply.text
        if p.logprobs is not None or p.prompt_logprobs:
            reply.logprobs = self._logprobs(msg, new_ids)
        self.first = False
        return early

    def _decode(self, ids: List[int]) -> str:
        return self.tokenizer.decode(ids) if self.tokenizer is not None else ""

    def _token(self, token_id: int) -> str:
        if self.tokenizer is None:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id])

    def _logprobs(self, msg: DetokenizeMsg, new_ids: List[int]) -> Dict[str, Any]:
        """This reply's tokens with their logprobs: the prompt's first (echo), then the new one."""
        got = msg.logprobs or {}
        rows: List[tuple] = []  # (token id, logprob or None, [[id, logprob], ...] or None)
        if self.first and self.echo and "prompt" in got:
            rows.append((self.prompt_ids[0], None, None))
            rows += [(t, e[0], e[1]) for t, e in zip(self.prompt_ids[1:], got["prompt"])]
        if new_ids and "token" in got:
            rows.append((new_ids[0], got["token"][0], got["token"][1]))
        if self.chat:
            return {"content": [self._chat_entry(t, lp, top) for t, lp, top in rows]}
        out: Dict[str, List] = {"tokens": [], "token_logprobs": [], "top_logprobs": []}
        out["text_offset"] = []
        for t, lp, top in rows:
            text = self._token(t)
            out["tokens"].append(text)
            out["token_logprobs"].append(lp)
            out["top_logprobs"].append(None if top is None else self._top_dict(top))
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out

    def _top_dict(self, top: List[List]) -> Dict[str, float]:
        """{token text: logprob}; two ids with one text keep the likelier (the first, sorted)."""
        out: Dict[str, float] = {}
        for token_id, lp in top:
            out.setdefault(self._token(token_id), lp)
        return out

    def _chat_entry(self, token_id: int, lp, top) -> Dict[str, Any]:
        def one(t: int, v: float) -> Dict[str, Any]:
            text = self._token(t)
            return {"token": text, "logprob": v, "bytes": list(text.encode())}

        entry = one(token_id, lp)
        entry["top_logprobs"] = [one(t, v) for t, v in (top or [])]
        return entry
