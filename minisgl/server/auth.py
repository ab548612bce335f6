"""An optional API key (`serve --api-key KEY`, or MINISGL_API_KEY): the OpenAI API's own scheme,
`Authorization: Bearer KEY`, so that the official clients' `api_key=` sends it."""

from __future__ import annotations

import hmac

from .openai_api import ErrorInfo
from .responses import error_response

# ("/tokenize" covers /tokenizer_info too). The server and model info SGLang's router reads
# (sglang_routes.py) show the model's directory on disk: they need the key as SGLang's own server
# asks it there (the routers send their --api-key). /health, /metrics and /debug stay open.
PROTECTED = (
    "/v1/",
    "/tokenize",
    "/detokenize",
    "/server_info",
    "/model_info",
    "/get_server_info",
    "/get_model_info",
)


class RequireApiKey:
    """ASGI middleware: a request to a protected path without `Authorization: Bearer <key>` gets the
    OpenAI API's 401 (the key compared in constant time: its letters do not leak through timing)."""

    def __init__(self, app, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED):
            headers = dict(scope["headers"])
            scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
            given = given.strip() if scheme.lower() == b"bearer" else b""
            if not hmac.compare_digest(given, self.key):
                said = "no API key was given" if not given else "the API key is not this server's"
                error = ErrorInfo(
                    401,
                    f"{said}: send the header Authorization: Bearer <key> "
                    "(the key given to `serve --api-key` or MINISGL_API_KEY)",
                    code="invalid_api_key",
                )
                response = error_response(error)
                response.headers["www-authenticate"] = "Bearer"  # the scheme to use (RFC 6750)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
