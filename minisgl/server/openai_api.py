"""The OpenAI API's shapes: what requests may hold, and the JSON and server-sent events answering
them (https://platform.openai.com/docs/api-reference). Pure functions and pydantic models; the HTTP
side is in app.py.

Extensions, as other OpenAI-compatible servers have them: `top_k`, `ignore_eos` and
`stop_token_ids` (sampling), and `return_token_ids` (each choice, and each streamed chunk, also
carries the token ids it adds). `stop`, `seed`, `logprobs` (a completion's k, a chat's true with
`top_logprobs`) and a completion's `echo` are honoured (SamplingParams, minisgl/core.py).
`response_format` (chat and completions) and `tools` with `tool_choice` (chat) are structured
output: structured.py says what is honoured and what is refused.

Nothing a request says is silently ignored. A request is checked in four steps:

- JSON types are strict (pydantic's strict mode): `"max_tokens": "5"`, `"max_tokens": true`,
  `"stream": "yes"` and `"temperature": "0"` are 400s naming the field (an int is a float, as
  in JSON). `null` means the field's default wherever the OpenAI API allows null.
- A field this server does not know at all is a 400 "Unrecognized request argument supplied",
  as the OpenAI API answers it: a client that sends another server's option (`min_p`,
  `repetition_penalty`...) learns that it is not honoured instead of getting a different answer.
- A field of the OpenAI API that the server knows but cannot honour is a 400 naming it
  (`unsupported()`), unless it holds the value that changes nothing:
      presence_penalty and frequency_penalty (0 accepted), logit_bias ({} accepted), suffix
      (empty accepted), best_of (1 accepted); on chat, functions, function_call
      ("none" accepted), audio, prediction, reasoning_effort, web_search_options, modalities
      (["text"] accepted), store (false accepted).
  Accepted because they change no answer: `user` and `metadata` (only labels), `service_tier`
  ("auto" or "default"), `parallel_tool_calls` (a forced call is one call). A chat message may
  carry `refusal`, `tool_calls`, `function_call`, `audio` and `annotations` as null or empty (the
  openai client sends them back with a message it received); `name` and other values are refused.
- Values allowed alone that together, or here, would change nothing or not what was meant are a
  400 naming the field (`contradiction()`), as the OpenAI API or vLLM refuses them:
  `stream_options` without `stream: true`; an empty `stop` string; a chat's `max_tokens` and
  `max_completion_tokens` both given; a `seed` outside [0, 2**63 - 1] (it would repeat another's
  draws); `echo` with `max_tokens: 0` but no `logprobs` (it would score the prompt for nobody).
  `stream_options.continuous_usage_stats` (vLLM's) puts the usage so far in every chunk.
SGLang's extensions that its router adds to every request (`no_stop_trim`...) are accepted at the
values that change nothing here (sglang_fields.py).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Dict, List, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

from .errors import ErrorInfo
from .sglang_fields import SGLangChatFields, SGLangFields

# The engine mixes a seed into 63 bits (engine/request_sampling.py): a larger one repeats another
MAX_SEED = 2**63 - 1


def one_of(what: str) -> WrapValidator:
    """A union's type error as one sentence naming what the field may be (pydantic's own error
    lists one complaint per member of the union)."""

    def check(value, handler):
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("type_error", f"must be {what}") from None

    return WrapValidator(check)


PROMPT_KINDS = "a string, a list of strings, a list of token ids or a list of token-id lists"
_PROMPT_LISTS = {
    str: TypeAdapter(List[str]),
    int: TypeAdapter(List[int]),
    list: TypeAdapter(List[List[int]]),
}


def prompt_value(value: Any) -> str | List[str] | List[int] | List[List[int]]:
    """A prompt, validated as the one kind its first element says it is. (pydantic's union tries
    every kind: a million token ids failed as strings one by one first, 2 s in the event loop.)"""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        first = type(value[0]) if value else str
        adapter = _PROMPT_LISTS.get(first)
        if adapter is not None:
            try:
                return adapter.validate_python(value, strict=True)
            except ValidationError:
                pass
    raise PydanticCustomError("type_error", f"must be {PROMPT_KINDS}")


TOKEN_IDS_SCHEMA = {"type": "array", "items": {"type": "integer"}, "minItems": 1}
Prompt = Annotated[
    str | List[str] | List[int] | List[List[int]],
    PlainValidator(prompt_value),
    # what is refused beyond the types (app.py: an empty list, an empty list of ids), declared
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}, "minItems": 1},
                TOKEN_IDS_SCHEMA,
                {"type": "array", "items": TOKEN_IDS_SCHEMA, "minItems": 1},
            ]
        }
    ),
]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool | None = None
    # vLLM's: usage in every chunk, the tokens so far (running_usage.py)
    continuous_usage_stats: bool | None = None


class _Request(SGLangFields):
    # strict: no "5" for 5 or true for 1; forbid: a field we do not know is a 400, not ignored
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    temperature: float | None = None  # None: the OpenAI API's 1.0 (the offline LLM's is greedy)
    top_p: float | None = None  # None: 1.0
    top_k: int | None = None  # None: -1, every token
    n: int | None = None  # None: 1
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: str | List[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    ignore_eos: bool | None = None
    stop_token_ids: List[int] | None = None  # an extension, as vLLM and SGLang have it
    return_token_ids: bool | None = None
    logit_bias: Dict[str, Any] | None = None
    user: str | None = None  # a label for the caller's own records: changes nothing

    def unsupported(self) -> List[str]:
        """Settings this server cannot honour: refused, never silently ignored."""
        bad = []
        if self.presence_penalty:
            bad.append("presence_penalty")
        if self.frequency_penalty:
            bad.append("frequency_penalty")
        if self.logit_bias:
            bad.append("logit_bias")
        return bad + self.sglang_unsupported()

    def contradiction(self) -> ErrorInfo | None:
        """A 400 for values the API allows each alone but that would change nothing, or not
        what the client meant, as sent: the OpenAI API's and vLLM's refusals."""
        if self.stream_options is not None and not self.stream:
            return ErrorInfo(
                400, "stream_options is only allowed when stream is true", param="stream_options"
            )
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if "" in stops:
            return ErrorInfo(
                400,
                "stop: an empty string stops nothing; give non-empty strings (or null for none)",
                param="stop",
            )
        last = (self.seed or 0) + self.n_choices - 1  # sample j of n draws with seed + j
        if self.seed is not None and not (0 <= self.seed and last <= MAX_SEED):
            return ErrorInfo(
                400,
                f"seed must be in [0, {MAX_SEED}] (63 bits; with n, seed + n - 1 too), "
                f"got {self.seed}",
                param="seed",
            )
        return None

    @property
    def n_choices(self) -> int:
        return 1 if self.n is None else self.n

    @property
    def streams(self) -> bool:
        return bool(self.stream)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


class CompletionRequest(_Request):
    prompt: Prompt
    max_tokens: int | None = 16  # the OpenAI API's default for completions
    echo: bool | None = None
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None
    response_format: Dict[str, Any] | None = None  # structured output (structured.py)

    def unsupported(self) -> List[str]:
        bad = super().unsupported()
        bad += [name for name in ("suffix",) if getattr(self, name)]
        if self.best_of not in (None, 1):
            bad.append("best_of")
        return bad

    def prompts(self) -> List[str | List[int]]:
        """The prompts: one text or one list of ids each (a list of ints is one prompt)."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[
        str | List[ContentPart],
        one_of('a string or a list of {"type": "text", "text": ...} parts (only text is served)'),
    ]
    # what the openai client sends back with an assistant message it received: only as nothing
    name: str | None = None
    refusal: str | None = None
    tool_calls: List[Any] | None = None
    function_call: Dict[str, Any] | None = None
    audio: Dict[str, Any] | None = None
    annotations: List[Any] | None = None

    def unsupported(self) -> List[str]:
        fields = ("name", "refusal", "tool_calls", "function_call", "audio", "annotations")
        return [name for name in fields if getattr(self, name)]

    def as_dict(self) -> Dict[str, str]:
        text = (
            self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        )
        return {"role": self.role, "content": text}


class ChatRequest(SGLangChatFields, _Request):
    # (an empty list is refused by chat_completions, saying so: declared here)
    messages: Annotated[List[ChatMessage], Field(json_schema_extra={"minItems": 1})]
    max_tokens: int | None = None  # None: as long as the context allows
    max_completion_tokens: int | None = None  # the newer name of max_tokens
    logprobs: bool | None = None
    top_logprobs: int | None = None  # alternatives per token; needs logprobs, as OpenAI says
    response_format: Dict[str, Any] | None = None
    tools: List[Any] | None = None
    tool_choice: str | Dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # a forced tool call is one call: changes nothing
    functions: List[Any] | None = None
    function_call: str | Dict[str, Any] | None = None
    audio: Dict[str, Any] | None = None
    prediction: Dict[str, Any] | None = None
    reasoning_effort: str | None = None
    web_search_options: Dict[str, Any] | None = None
    modalities: List[str] | None = None
    store: bool | None = None
    metadata: Dict[str, str] | None = None  # labels for stored completions: changes nothing
    service_tier: Literal["auto", "default"] | None = None  # one tier here: changes nothing

    def contradiction(self) -> ErrorInfo | None:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            return ErrorInfo(
                400,
                "give one of max_tokens and max_completion_tokens, not both (max_tokens is the "
                "older name of max_completion_tokens)",
                param="max_tokens",
            )
        return super().contradiction()

    def unsupported(self) -> List[str]:
        bad = super().unsupported()
        bad += [name for name in ("functions", "store") if getattr(self, name)]
        bad += [
            name
            for name in ("audio", "prediction", "reasoning_effort", "web_search_options")
            if getattr(self, name) is not None
        ]
        if self.function_call not in (None, "none"):
            bad.append("function_call")
        if self.modalities not in (None, ["text"]):
            bad.append("modalities")
        for i, m in enumerate(self.messages):
            bad += [f"messages[{i}].{name}" for name in m.unsupported()]
        return bad


def sse_event(data: Dict[str, Any] | str) -> str:
    """One server-sent event: a `data:` line and the blank line that ends the event."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n"


SSE_DONE = sse_event("[DONE]")


def usage(prompt_tokens: int, completion_tokens: int) -> Dict[str, int]:
    """The OpenAI API's usage: the prompt's tokens, the answer's, and their total."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def choice(
    chat: bool,
    stream: bool,
    text: str,
    finish_reason: str | None,
    token_ids: List[int] | None,
    first: bool = False,
) -> Dict[str, Any]:
    """One choice of a response or of a streamed chunk, in the OpenAI API's shape.

    Receives: `chat` (a chat completion, else a text completion), `stream` (a chunk, else a whole
        response), `text`, `finish_reason` (None until the last), `token_ids` (None unless the
        client asked for them), `first` (the first chunk of a chat stream).
    Returns: a dict with "index" 0, "logprobs" None and "finish_reason", and: for a completion
        "text"; for a whole chat "message" {"role": "assistant", "content": text}; for a
        chat chunk "delta" {"content": text}, with "role": "assistant" too in the first one.
        "token_ids" only when `token_ids` is not None.
    Leaves: nothing changed.
    Uses: plain dicts; `envelope` wraps the result (ch15).
    Checked: each of the four shapes, key for key, and what the official openai client parses
        (Completion, ChatCompletion, ChatCompletionChunk); the role only in a chat stream's first
        chunk; token ids only when asked.
    """
    out: Dict[str, Any] = {"index": 0}
    if not chat:
        out["text"] = text
    elif stream:
        out["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
    else:
        out["message"] = {"role": "assistant", "content": text}
    out["logprobs"] = None
    out["finish_reason"] = finish_reason
    if token_ids is not None:
        out["token_ids"] = token_ids
    return out


def joined_logprobs(pieces: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One answer's logprobs from its replies' pieces (each in the response's shape, whose values
    are all lists: a completion's four, a chat's "content"), each list joined in order."""
    return {key: [v for piece in pieces for v in piece[key]] for key in pieces[0]}


def envelope(
    chat: bool, stream: bool, rid: str, created: int, model: str, choices: List[Dict[str, Any]]
) -> Dict[str, Any]:
    if chat:
        obj = "chat.completion.chunk" if stream else "chat.completion"
    else:
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}
