"""POST /tokenize, POST /detokenize and GET /tokenizer_info, as vLLM names and shapes them
(lm-eval's `local-completions` finds them and tokenizes through them, needing no tokenizer of its
own): a prompt's token ids (a text, or a chat rendered with the model's chat template, exactly as
a request's prompt is tokenized; `add_special_tokens` as vLLM's: by default true for a text, as a
completion's prompt, false for a chat, whose template writes them), the text of token ids, and
the tokenizer's special tokens, chat template and context length.

They run in the API server's process, with a tokenizer of its own loaded on the first call (in a
thread: a large tokenizer.json takes a moment to read), rather than as messages through the
tokenizer worker: they need nothing of the engine, and a tokenizer costs the process a few MB.
The ids are the tokenizer worker's because the same code makes them (TokenizerWorker._prompt_ids).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any, Dict, List

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from minisgl.core import SamplingParams
from minisgl.message import TokenizeMsg

from .chat import ChatTemplateError, _token_text
from .errors import ErrorInfo, unknown_model
from .openai_api import TOKEN_IDS_SCHEMA, ChatMessage
from .responses import error_response

PROMPT_SCHEMA = {"anyOf": [{"type": "string"}, TOKEN_IDS_SCHEMA]}


class TokenizeRequest(BaseModel):
    # exactly one of prompt and messages (PromptTokenizer.tokenize refuses the others): declared
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}]},
    )

    model: str | None = None
    # not null: absent is how one of the two is left out
    prompt: Annotated[str | List[int], WithJsonSchema(PROMPT_SCHEMA)] = None
    messages: Annotated[List[ChatMessage], Field(json_schema_extra={"minItems": 1})] = None
    add_special_tokens: bool | None = None  # None: true for a text prompt, false for messages


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    tokens: Annotated[
        List[int],
        WithJsonSchema({"type": "array", "items": {"type": "integer", "minimum": 0}}),
    ]


SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")


class PromptTokenizer:
    """The model directory's tokenizer and chat template, loaded once, when first needed."""

    def __init__(self, model_dir: Path, context_len: int) -> None:
        self.model_dir, self.context_len = model_dir, context_len
        self._worker = None
        self._lock = asyncio.Lock()

    async def worker(self):
        async with self._lock:
            if self._worker is None:
                self._worker = await asyncio.to_thread(self._load)
        return self._worker

    def _load(self):
        from minisgl.models.tokenizer import load_tokenizer

        from .chat import load_chat_template
        from .tokenizer_worker import TokenizerWorker

        return TokenizerWorker(
            load_tokenizer(self.model_dir), load_chat_template(self.model_dir), (), self.context_len
        )

    async def tokenize(self, req: TokenizeRequest) -> List[int]:
        """The prompt's ids, or an ErrorInfo (400) saying why there are none."""
        if (req.prompt is None) == (req.messages is None):
            raise ErrorInfo(400, "give exactly one of prompt and messages", param="prompt")
        if req.messages == []:  # as /v1/chat/completions refuses it
            raise ErrorInfo(400, "messages is empty", param="messages")
        bad = [
            f"messages[{i}].{n}" for i, m in enumerate(req.messages or []) for n in m.unsupported()
        ]
        if bad:
            raise ErrorInfo(400, f"{bad[0]}: not supported by this server", param=bad[0])
        if req.add_special_tokens is not None and isinstance(req.prompt, list):
            raise ErrorInfo(
                400,
                "add_special_tokens applies to a text prompt or messages, not to token ids",
                param="add_special_tokens",
            )
        prompt = req.prompt
        msg = TokenizeMsg(
            uid=-1,
            sampling_params=SamplingParams(),
            text=prompt if isinstance(prompt, str) else None,
            input_ids=prompt if isinstance(prompt, list) else None,
            messages=None if req.messages is None else [m.as_dict() for m in req.messages],
        )
        worker = await self.worker()
        default = req.messages is None  # a text gets them as a completion's prompt; a chat not
        special = default if req.add_special_tokens is None else req.add_special_tokens
        try:  # in a thread: a long text takes the tokenizer a while, the event loop none of it
            if special == default:
                return (await asyncio.to_thread(worker._prompt_ids, msg)).tolist()
            return await asyncio.to_thread(self._encode, worker, msg, special)
        except (ChatTemplateError, TypeError, ValueError) as e:
            raise ErrorInfo(400, str(e), param="messages" if req.messages else "prompt") from None

    @staticmethod
    def _encode(worker, msg: TokenizeMsg, special: bool) -> List[int]:
        """The ids of a text, or of a chat's rendered text, with or without special tokens."""
        if worker.tokenizer is None:
            raise ValueError("this model directory has no tokenizer.json: no text to tokenize")
        if msg.messages is not None:
            if worker.chat_template is None:
                raise ChatTemplateError("this model has no chat template")
            text = worker.chat_template.render(msg.messages)
        else:
            text = msg.text
        worker._check_length(text)
        return worker.tokenizer.encode(text, add_special_tokens=special).ids

    async def info(self) -> Dict[str, Any]:
        """vLLM's /tokenizer_info: tokenizer_config.json's special tokens and class, the chat
        template the server renders chats with, and the context length."""
        worker = await self.worker()
        path = self.model_dir / "tokenizer_config.json"
        config = json.loads(path.read_text()) if path.is_file() else {}
        info = {key: _token_text(config.get(key)) for key in SPECIAL_TOKENS}
        template = worker.chat_template
        return {
            "tokenizer_class": config.get("tokenizer_class"),
            **info,
            "chat_template": template.source if template is not None else None,
            "model_max_length": self.context_len,
        }

    async def detokenize(self, req: DetokenizeRequest) -> str:
        tokenizer = (await self.worker()).tokenizer
        if tokenizer is None:
            raise ErrorInfo(400, "this model directory has no tokenizer.json: no text to give")
        vocab = tokenizer.get_vocab_size()
        bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise ErrorInfo(
                400, f"token id {bad} is outside the vocabulary [0, {vocab})", param="tokens"
            )
        return tokenizer.decode(req.tokens, skip_special_tokens=False)


async def tokenize(req: TokenizeRequest, request: Request):
    try:
        tokens = await prompt_tokenizer(request, req.model).tokenize(req)
    except ErrorInfo as e:
        return error_response(e)
    tokenizer = request.app.state.tokenizer
    return {"tokens": tokens, "count": len(tokens), "max_model_len": tokenizer.context_len}


async def detokenize(req: DetokenizeRequest, request: Request):
    try:
        return {"prompt": await prompt_tokenizer(request, req.model).detokenize(req)}
    except ErrorInfo as e:
        return error_response(e)


async def tokenizer_info(request: Request):
    try:
        return await prompt_tokenizer(request, None).info()
    except ErrorInfo as e:
        return error_response(e)


def prompt_tokenizer(request: Request, model_name: str | None) -> PromptTokenizer:
    state = request.app.state
    if model_name is not None and model_name != state.model_name:
        raise unknown_model(model_name, state.model_name)
    if state.tokenizer is None:
        raise ErrorInfo(503, "this server was started without a tokenizer for /tokenize")
    return state.tokenizer
