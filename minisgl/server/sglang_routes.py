"""GET /model_info and GET /server_info, as SGLang's server answers them: what SGLang's router
(`sglang-router`, the `[router]` extra) reads from a worker it adds.

Without them the router still routes, but registers every worker under the model "unknown", so its
/v1/models says "unknown" and it loads no tokenizer. It asks /server_info, then /model_info (and
their old names /get_server_info and /get_model_info on a 404); from the answers it takes the
model's id (`served_model_name`), the directory to load a tokenizer from (`model_path`,
`tokenizer_path`) and labels (`tp_size`, `dp_size`). Found by running it against a server that
logged each request (sglang-router 0.3.2). Open like /health: a router probes before any client.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

from fastapi import FastAPI


def install_sglang_routes(app: FastAPI, model_dir: Path, model_name: str, tp_size: int) -> None:
    model = {
        "model_path": str(model_dir),
        "tokenizer_path": str(model_dir),
        "served_model_name": model_name,
        "is_generation": True,
    }
    server = {**model, "tp_size": tp_size, "dp_size": 1}

    async def model_info() -> Dict[str, Any]:
        return model

    async def server_info() -> Dict[str, Any]:
        return server

    for path, route in [
        ("/model_info", model_info),
        ("/get_model_info", model_info),
        ("/server_info", server_info),
        ("/get_server_info", server_info),
    ]:
        app.add_api_route(path, route, methods=["GET"])
