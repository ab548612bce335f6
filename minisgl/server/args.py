"""The server's settings: `python -m minisgl serve --help` lists them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict

from minisgl.models import BUNDLED_MODEL

# The largest body a real request needs is a long prompt as token ids: 128k ids of 6 digits and a
# comma each are under 1 MiB; a list of prompts for a batch a few times that (body_guard.py).
DEFAULT_MAX_BYTES = 4 * 1024 * 1024


@dataclass
class ServerArgs:
    model: Path = BUNDLED_MODEL
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (the ready line names it)
    served_model_name: str | None = (
        None  # the `model` clients ask for; default: the directory's name
    )
    api_key: str | None = None  # if set, every /v1/ request must send it as a Bearer token
    max_request_bytes: int = DEFAULT_MAX_BYTES  # a larger body is refused (413) unread
    # SchedulerConfig options (max_running_req, ...)
    engine: Dict[str, Any] = field(default_factory=dict)
    ipc_dir: str = ""  # where the processes' sockets live; the launcher makes a temporary one

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model.name

    @property
    def scheduler_addr(self) -> str:
        return f"ipc://{self.ipc_dir}/scheduler"

    @property
    def tokenizer_addr(self) -> str:
        return f"ipc://{self.ipc_dir}/tokenizer"

    @property
    def api_addr(self) -> str:
        return f"ipc://{self.ipc_dir}/api"
