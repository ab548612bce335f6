"""Chat templates: turn a chat's messages into the prompt text the model was trained on.

A model directory names its template as Hugging Face does: a `chat_template.jinja` file, or the
`chat_template` field of `tokenizer_config.json` (a string, or a list of named templates of which
"default" is used). It is a Jinja template rendered, as transformers renders it, in a sandbox with
`messages`, `add_generation_prompt`, `bos_token` and `eos_token`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List


class ChatTemplateError(ValueError):
    """A chat cannot be rendered: no template, or the template refused the messages."""


class ChatTemplate:
    def __init__(self, source: str, bos_token: str | None, eos_token: str | None) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self._template = env.from_string(source)
        self.source = source  # served by /tokenizer_info, for clients that render it themselves
        self._tokens = {"bos_token": bos_token or "", "eos_token": eos_token or ""}

    def render(self, messages: List[Dict[str, str]]) -> str:
        import jinja2

        try:
            return self._template.render(
                messages=messages, add_generation_prompt=True, **self._tokens
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(
                f"the model's chat template failed on these messages: {e}"
            ) from None


def load_chat_template(model_dir: Path) -> ChatTemplate | None:
    """The model directory's chat template, or None if it has none."""
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    jinja_path = model_dir / "chat_template.jinja"
    source = jinja_path.read_text() if jinja_path.is_file() else config.get("chat_template")
    if isinstance(source, list):  # [{"name": ..., "template": ...}, ...]
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    if not source:
        return None
    return ChatTemplate(
        source, _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
    )


def _token_text(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _raise(message: str):
    raise ChatTemplateError(message)
