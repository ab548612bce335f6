"""The streaming response of /v1/completions and /v1/chat/completions: it ends the request the
moment its client leaves or the server begins to stop (app.py's `serve` returns it)."""

from __future__ import annotations

import asyncio

import anyio
from fastapi.responses import StreamingResponse

from . import openai_api as api
from .openai_api import ErrorInfo


class AbortOnDisconnect(StreamingResponse):
    """A stream that notices its client leaving even while no token is coming, and then closes its
    body generator at once, whose `finally` aborts the request. (Starlette's own response, under
    ASGI 2.4, notices only when a send fails, and leaves the generator to the garbage collector.)

    When the server begins to stop (`stopping` set), the stream ends the same way, after one
    error event saying so (no [DONE]: the answer is cut short) and one line in the log, rather
    than being cancelled by uvicorn two seconds later with a traceback."""

    def __init__(self, content, stopping: asyncio.Event | None = None, rid: str = "", **kw):
        super().__init__(content, **kw)
        self.stopping, self.rid = stopping, rid

    async def __call__(self, scope, receive, send) -> None:
        started, ended, cut = False, False, False

        async def sending(message) -> None:
            nonlocal started, ended
            started = started or message["type"] == "http.response.start"
            ended = ended or (
                message["type"] == "http.response.body" and not message.get("more_body", False)
            )
            await send(message)

        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    try:
                        await self.stream_response(sending)
                    except OSError:
                        pass  # the client is gone
                    group.cancel_scope.cancel()

                async def shutdown() -> None:
                    nonlocal cut
                    await self.stopping.wait()
                    cut = True
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                if self.stopping is not None:
                    group.start_soon(shutdown)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()
        if cut and not ended:  # (a stream that ended as the server began to stop is whole)
            await self.end_cut(sending, started)

    async def end_cut(self, send, started: bool) -> None:
        error = ErrorInfo(503, "the server is shutting down: this answer was cut short")
        print(f"minisgl: stream {self.rid} cut by the server's shutdown", flush=True)
        try:
            if not started:
                await send(
                    {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
                )
            body = api.sse_event(error.body()).encode()
            await send({"type": "http.response.body", "body": body, "more_body": False})
        except OSError:
            pass  # the client is gone too
