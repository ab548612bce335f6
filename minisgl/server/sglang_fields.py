"""The request fields SGLang's router (`sglang-router`, the `[router]` extra) adds to every request
it passes on: SGLang's own extensions, written out at SGLang's defaults, whatever the client sent.

Seen by running it in front of a server that logs its bodies (sglang-router 0.3.2):
    completions  "no_stop_trim": false, "ignore_eos": false, "skip_special_tokens": true,
                 "return_hidden_states": false (and "echo": false, "stream": false)
    chat         the same, and "continue_final_message": false, "separate_reasoning": true,
                 "stream_reasoning": true
Without them declared, `extra="forbid"` made every routed request a 400 ("Unrecognized request
argument supplied: no_stop_trim"). They are declared here and held to the rule of the rest of the
API (openai_api.py): a value that asks for what this server does anyway is accepted, another is a
400 naming the field:
    no_stop_trim          false (a stop string is trimmed from the text, as here)
    skip_special_tokens   true (the detokenizer drops special tokens)
    return_hidden_states  false
    continue_final_message  false (a chat's template adds the assistant's turn)
    separate_reasoning, stream_reasoning   any: they act only where a reasoning parser splits a
                          reasoning model's thinking from its answer, and this server has none
                          (SGLang without --reasoning-parser ignores them the same way)
"""

from __future__ import annotations

from typing import List

from pydantic import BaseModel


class SGLangFields(BaseModel):
    no_stop_trim: bool | None = None
    skip_special_tokens: bool | None = None
    return_hidden_states: bool | None = None

    def sglang_unsupported(self) -> List[str]:
        bad = []
        if self.no_stop_trim:
            bad.append("no_stop_trim")
        if self.skip_special_tokens is False:
            bad.append("skip_special_tokens")
        if self.return_hidden_states:
            bad.append("return_hidden_states")
        return bad


class SGLangChatFields(SGLangFields):
    continue_final_message: bool | None = None
    separate_reasoning: bool | None = None  # no reasoning parser here: changes nothing
    stream_reasoning: bool | None = None  # the same

    def sglang_unsupported(self) -> List[str]:
        bad = super().sglang_unsupported()
        if self.continue_final_message:
            bad.append("continue_final_message")
        return bad
