"""The tokenizer worker's logic, without sockets: client requests in, scheduler messages out, and
the scheduler's tokens back out as text.

It keeps one `RequestInfo` per request from its TokenizeMsg to its last reply (or its abort), so it
can say why a request finished and how long its prompt was; and, for a request that asks for
stops, echo or logprobs, a `ReplyShaper` (reply_shaper.py) that rewrites its replies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Tuple

import torch

from minisgl.llm import inputs
from minisgl.message import (
    AbortBackendMsg,
    AbortMsg,
    DetokenizeMsg,
    StatsQuery,
    StatsReply,
    TokenizeMsg,
    UserMsg,
    UserReply,
)

from .chat import ChatTemplate, ChatTemplateError
from .detokenizer import DecodeState, next_text
from .prompt_bounds import longest_token_chars, text_refusal
from .reply_shaper import ReplyShaper, needs_shaping


@dataclass
class RequestInfo:
    prompt_tokens: int
    ignore_eos: bool
    decode: DecodeState = field(default_factory=DecodeState)


class TokenizerWorker:
    def __init__(
        self,
        tokenizer,
        chat_template: ChatTemplate | None,
        eos_token_ids: Iterable[int],
        context_len: int,
    ) -> None:
        self.tokenizer = tokenizer  # None: the model directory has no tokenizer.json (ids only)
        self.chat_template = chat_template
        self.eos_token_ids = frozenset(eos_token_ids)  # any of them ends a request (empty: none)
        self.context_len = context_len
        # a text longer than the context's tokens can hold is refused before it is tokenized
        self.longest_token = longest_token_chars(tokenizer) if tokenizer is not None else 1
        self.requests: Dict[int, RequestInfo] = {}
        # uid -> what its replies need beyond text (stops, echo, logprobs: reply_shaper.py)
        self.shapers: Dict[int, ReplyShaper] = {}

    def handle(self, msgs: List[Any]) -> Tuple[List[Any], List[Any]]:
        """Messages for the scheduler and messages for the API server, in arrival order."""
        to_scheduler: List[Any] = []
        to_api: List[Any] = []
        for msg in msgs:
            if isinstance(msg, TokenizeMsg):
                out = self.tokenize(msg)
                (to_scheduler if isinstance(out, UserMsg) else to_api).append(out)
                if isinstance(out, UserMsg) and needs_shaping(out.sampling_params, msg.echo):
                    self.shapers[msg.uid] = ReplyShaper(
                        self.tokenizer,
                        out.sampling_params,
                        chat=msg.messages is not None,
                        prompt_ids=out.input_ids.tolist(),
                        echo=msg.echo,
                        prompt_text=msg.text,
                    )
            elif isinstance(msg, AbortMsg):
                self.shapers.pop(msg.uid, None)
                if self.requests.pop(msg.uid, None) is not None:
                    to_scheduler.append(AbortBackendMsg(uid=msg.uid))
            elif isinstance(msg, StatsQuery):
                to_scheduler.append(msg)
            elif isinstance(msg, DetokenizeMsg):
                reply = self.detokenize(msg)
                shaper = self.shapers.get(msg.uid)
                if reply is not None and shaper is not None and reply.error is None:
                    if shaper.shape(reply, msg):  # a stop the scheduler did not see: end it here
                        self.requests.pop(msg.uid, None)
                        to_scheduler.append(AbortBackendMsg(uid=msg.uid))
                if reply is None or reply.finished:
                    self.shapers.pop(msg.uid, None)
                if reply is not None:
                    to_api.append(reply)
            elif isinstance(msg, StatsReply):
                to_api.append(msg)
            else:
                raise TypeError(f"the tokenizer worker got an unexpected message {msg!r}")
        return to_scheduler, to_api

    def tokenize(self, msg: TokenizeMsg) -> UserMsg | UserReply:
        """The scheduler's UserMsg for a new request, or a 400 reply saying why it cannot have one.

        Receives: `msg`, a TokenizeMsg with exactly one of `text`, `input_ids` (a list of ints from
            the client) and `messages` (a chat); `self.tokenizer` (None: the model directory has
            none), `self.chat_template` (None: it has none), `self.context_len`.
        Returns: a UserMsg with the prompt's ids as a 1-D int32 tensor and the request's sampling
            params; or, for a prompt that cannot be tokenized (text or a chat without a tokenizer,
            a chat without a template, a chat the template refuses, ids that are not ints or do not
            fit int32), a finished UserReply with that error and status 400.
        Leaves: for a UserMsg, `self.requests[uid]` = RequestInfo(prompt_tokens, ignore_eos); with
            `fill_context`, `max_tokens` set to what the context leaves after the prompt (at least
            1); for a refusal, nothing.
        Uses: `self._prompt_ids` (text and ids as `minisgl/llm/inputs.py` and the offline LLM take
            them, a chat rendered by the template then encoded without special tokens).
        Checked: text becomes the offline LLM's ids and a chat transformers' apply_chat_template's;
            ids reach the scheduler as int32; bad ids, and chats without a template, are 400s that
            leave nothing behind; a chat with no max_tokens fills the context.
        """
        try:
            ids = self._prompt_ids(msg)
        except (ChatTemplateError, TypeError, ValueError) as e:
            return UserReply(uid=msg.uid, finished=True, error=str(e), status=400)
        params = msg.sampling_params
        if (
            msg.fill_context
        ):  # at least 1: a prompt that fills the context is refused by the scheduler
            params.max_tokens = max(1, self.context_len - len(ids))
        self.requests[msg.uid] = RequestInfo(prompt_tokens=len(ids), ignore_eos=params.ignore_eos)
        return UserMsg(uid=msg.uid, input_ids=ids, sampling_params=params)

    def _prompt_ids(self, msg: TokenizeMsg) -> torch.Tensor:
        if (
            msg.input_ids is not None
        ):  # checked as the offline LLM checks them (ids the scheduler checks)
            return inputs.token_ids(list(msg.input_ids), self.tokenizer)
        if self.tokenizer is None:
            raise ValueError(
                "this model directory has no tokenizer.json: send the prompt as token ids"
            )
        if msg.messages is not None:
            if self.chat_template is None:
                raise ChatTemplateError(
                    "this model has no chat template (chat_template.jinja or "
                    "tokenizer_config.json's "
                    "chat_template): use /v1/completions with a prompt"
                )
            # The template writes every special token itself.
            text = self.chat_template.render(msg.messages)
            self._check_length(text)
            return torch.tensor(
                self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=torch.int32
            )
        # as LLM.encode: outputs match LLM.generate
        self._check_length(msg.text or "")
        return inputs.token_ids(msg.text or "", self.tokenizer)

    def _check_length(self, text: str) -> None:
        """A ValueError for a text whose characters alone show it cannot fit the context."""
        why = text_refusal(len(text), self.longest_token, self.context_len)
        if why is not None:
            raise ValueError(why)

    def detokenize(self, msg: DetokenizeMsg) -> UserReply | None:
        """The API server's reply for one of the scheduler's tokens; None for an aborted request.

        Receives: `msg`, one DetokenizeMsg: a token of request `msg.uid` (`finished` on its last),
        or
            the scheduler's refusal (`error` set, `next_token` -1); `self.requests`, uid ->
            RequestInfo of the requests tokenized and not yet ended or aborted.
        Returns: a UserReply with the new text (`next_text`), the token id, `finished`, and on the
            last reply `finish_reason`: "stop" if the token is EOS and the request does not ignore
            EOS, else "length"; a refusal as a reply with `error` and status 400; None for a uid
            not in `self.requests` (aborted: its last tokens were already on their way).
        Leaves: the request's RequestInfo updated, and removed on its last reply or refusal.
            Every reply but a refusal carries the request's `prompt_tokens` (for usage).
        Uses: `next_text` (ch13), `self.tokenizer` (None: no text, ids only), `self.eos_token_ids`.
        Checked: streamed text and ids equal the offline engine's; finish reasons; interleaved
            requests keep their own text; tokens after an abort are dropped; a refusal is a 400.
        """
        info = self.requests.get(msg.uid)
        if info is None:
            return None  # aborted: its last tokens were already on their way
        if msg.error is not None:  # the scheduler refused it: it can never run here
            del self.requests[msg.uid]
            return UserReply(uid=msg.uid, finished=True, error=msg.error, status=400)
        text = (
            next_text(self.tokenizer, info.decode, [msg.next_token], msg.finished)
            if self.tokenizer
            else ""
        )
        reason = None
        if msg.finished:
            del self.requests[msg.uid]
            ended_by_model = msg.next_token in self.eos_token_ids and not info.ignore_eos
            reason = "stop" if ended_by_model else "length"
        return UserReply(
            uid=msg.uid,
            text=text,
            token_ids=[msg.next_token],
            finished=msg.finished,
            finish_reason=reason,
            prompt_tokens=info.prompt_tokens,
        )
