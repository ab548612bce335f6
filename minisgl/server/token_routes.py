"""POST /tokenize and POST /detokenize, as SGLang and vLLM name them: a prompt's token ids
(a text, or a chat rendered with the model's chat template, exactly as a request's prompt is
tokenized), and the text of token ids.

They run in the API server's process, with a tokenizer of its own loaded on the first call (in a
thread: a large tokenizer.json takes a moment to read), rather than as messages through the
tokenizer worker: they need nothing of the engine, and a tokenizer costs the process a few MB.
The ids are the tokenizer worker's because the same code makes them (TokenizerWorker._prompt_ids).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import List

from fastapi import Request
from pydantic import BaseModel, ConfigDict

from minisgl.core import SamplingParams
from minisgl.message import TokenizeMsg

from .chat import ChatTemplateError
from .openai_api import ChatMessage, ErrorInfo, unknown_model
from .responses import error_response


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    prompt: str | List[int] | None = None
    messages: List[ChatMessage] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    tokens: List[int]


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
        bad = [
            f"messages[{i}].{n}" for i, m in enumerate(req.messages or []) for n in m.unsupported()
        ]
        if bad:
            raise ErrorInfo(400, f"{bad[0]}: not supported by this server", param=bad[0])
        prompt = req.prompt
        msg = TokenizeMsg(
            uid=-1,
            sampling_params=SamplingParams(),
            text=prompt if isinstance(prompt, str) else None,
            input_ids=prompt if isinstance(prompt, list) else None,
            messages=None if req.messages is None else [m.as_dict() for m in req.messages],
        )
        worker = await self.worker()
        try:
            return worker._prompt_ids(msg).tolist()
        except (ChatTemplateError, TypeError, ValueError) as e:
            raise ErrorInfo(400, str(e), param="messages" if req.messages else "prompt") from None

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


def prompt_tokenizer(request: Request, model_name: str | None) -> PromptTokenizer:
    state = request.app.state
    if model_name is not None and model_name != state.model_name:
        raise unknown_model(model_name, state.model_name)
    if state.tokenizer is None:
        raise ErrorInfo(503, "this server was started without a tokenizer for /tokenize")
    return state.tokenizer
