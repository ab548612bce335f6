"""What a request body must be before any route sees it: JSON, uncompressed, and no larger than
`serve --max-request-bytes` (DEFAULT_MAX_BYTES unless set).

A body over the limit is answered 413 as soon as that is known: at once if its Content-Length says
so, else when the bytes received so far pass the limit; the app never reads the rest (uvicorn
skips past it), so a client sending megabytes in a loop costs the server their transfer, not the
parsing and validation of its JSON in the event loop that every other client shares (and /health
with them). A body that is
not JSON (another Content-Type, none, a Content-Encoding such as gzip, which nothing here would
undo) is a 400 that names what was sent, rather than pydantic's "Input should be a valid
dictionary" about a body it never parsed.
"""

from __future__ import annotations

from starlette.datastructures import Headers

from .args import DEFAULT_MAX_BYTES
from .openai_api import ErrorInfo
from .responses import error_response

WITH_BODY = ("POST", "PUT", "PATCH")
# A refused body up to this many times the limit is skipped, so that its client reads the answer;
# a larger one closes the connection (its client may then see the reset rather than the 413)
SKIP_AT_MOST = 2


def too_large(limit: int, size: int | None = None) -> ErrorInfo:
    """The 413 for a body over `limit` bytes; `size`: what its Content-Length said, if it did."""
    how = f"its Content-Length says {size}" if size is not None else "the rest was not read"
    return ErrorInfo(
        413,
        f"the request body is larger than this server accepts ({limit} bytes, set by "
        f"`serve --max-request-bytes`): {how}",
        code="request_too_large",
    )


def header_refusal(headers: Headers, limit: int) -> ErrorInfo | None:
    """The refusal a request's headers alone call for, if any."""
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            return ErrorInfo(400, f"the Content-Length header is not a number: {length!r}")
        if int(length) > limit:
            return too_large(limit, int(length))
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        return ErrorInfo(
            400,
            f"Content-Encoding {encoding!r} is not accepted: send the JSON body uncompressed "
            "(Content-Encoding identity, or none)",
        )
    content_type = headers.get("content-type")
    media, _, options = (content_type or "").partition(";")
    if media.strip().lower() != "application/json":
        got = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
        return ErrorInfo(
            400, f"the request body must be JSON, sent with Content-Type: application/json ({got})"
        )
    charset = next(
        (v.strip().strip('"').lower() for k, _, v in (o.partition("=") for o in options.split(";"))
         if k.strip().lower() == "charset"),
        "utf-8",
    )  # fmt: skip
    if charset not in ("utf-8", "utf8"):
        return ErrorInfo(400, f"the request body must be UTF-8 JSON (Content-Type says {charset})")
    return None


class GuardBody:
    """ASGI middleware: a body-carrying request (POST, PUT, PATCH) reaches the app only when its
    headers say JSON within the limit and its bytes, counted as they come, stay within it; the app
    then gets the body whole, and afterwards the real `receive` (which tells of a disconnect)."""

    def __init__(self, app, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] not in WITH_BODY:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = header_refusal(headers, self.max_bytes)
        if refusal is not None:
            length = headers.get("content-length", "")
            far_over = length.isdigit() and int(length) > SKIP_AT_MOST * self.max_bytes
            await self.refuse(refusal, scope, receive, send, close=far_over)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before its body was whole: nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:  # a chunked body, of no stated length
                await self.refuse(too_large(self.max_bytes), scope, receive, send, close=True)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        given = False

        async def replay():
            nonlocal given
            if not given:
                given = True
                return whole
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def refuse(error: ErrorInfo, scope, receive, send, close: bool) -> None:
        """Answer `error` without reading the body. Unless `close`, the rest of the body is left
        to uvicorn, which reads past it (h11's parsing, no JSON, no app) and keeps the connection:
        closing it with bytes unread resets it, and a client still sending may lose the answer
        (2 of 200 10 MB bodies did, on loopback). `close` for a body far over the limit, whose
        bytes are not worth taking in, and for a chunked one, which may never end."""
        response = error_response(error)
        if close:
            response.headers["connection"] = "close"
        await response(scope, receive, send)
