"""The HTTP front end: an OpenAI-compatible API on FastAPI.

    GET  /health                 200 {"status": "ok", "workers": {name: pid}};
                                 503 once a worker died
    GET  /v1/models              the one model served
    POST /v1/completions         a prompt (text or token ids); streamed with "stream": true
    POST /v1/chat/completions    messages, rendered with the model's chat template
    GET  /debug/scheduler        the scheduler's slots and pages (tests check nothing leaks)

Errors have the OpenAI API's body, {"error": {"message", "type", "param", "code"}}: 400 for a
request that is wrong (bad JSON too: the OpenAI API answers 400, and its clients expect it, where
FastAPI would say 422), 404 for an unknown model or path, 500 when the server failed, 503 after.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from contextlib import asynccontextmanager
from typing import Any, Callable, Dict, List

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from minisgl.message import TokenizeMsg

from . import openai_api as api
from .frontend import Frontend
from .openai_api import ErrorInfo
from .responses import Answer, collect, disconnected, error_response, first_of, stream_events


class AbortOnDisconnect(StreamingResponse):
    """A stream that notices its client leaving even while no token is coming, and then closes its
    body generator at once, whose `finally` aborts the request. (Starlette's own response, under
    ASGI 2.4, notices only when a send fails, and leaves the generator to the garbage collector.)"""

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:
                        pass  # the client is gone
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()


def create_app(
    frontend: Frontend,
    model_name: str,
    on_startup: Callable[[], List[Any]] | None = None,
    workers: Dict[str, int] | None = None,
) -> FastAPI:
    """The app; `on_startup()` returns the tasks to run beside it (the reply listener, a watchdog);
    `workers`, the worker processes' pids by name, is shown by /health. The routes below read what
    they serve from `app.state`."""

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        tasks = [asyncio.create_task(c) for c in (on_startup() if on_startup else [])]
        yield
        for t in tasks:
            t.cancel()

    app = FastAPI(title="minisgl", lifespan=lifespan)
    app.state.frontend, app.state.model_name = frontend, model_name
    app.state.workers, app.state.created = workers or {}, int(time.time())
    app.add_exception_handler(RequestValidationError, bad_request)
    app.add_exception_handler(HTTPException, http_error)
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/v1/models", models, methods=["GET"])
    app.add_api_route("/debug/scheduler", debug_scheduler, methods=["GET"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    return app


# ---------------------------------------------------------------------- errors


async def bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 for a body that does not parse, as the OpenAI API's 400."""
    err = exc.errors()[0]
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    if err.get("type") == "json_invalid":
        return error_response(
            ErrorInfo(400, f"the request body is not valid JSON: {err.get('msg')}")
        )
    where = ".".join(loc) or "body"
    return error_response(
        ErrorInfo(400, f"{where}: {err.get('msg')}", param=loc[0] if loc else None)
    )


async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
    return error_response(ErrorInfo(exc.status_code, str(exc.detail)))


# ---------------------------------------------------------------------- routes


async def health(request: Request) -> JSONResponse:
    state = request.app.state
    if state.frontend.failure is not None:
        return JSONResponse(
            {"status": "unhealthy", "reason": state.frontend.failure, "workers": state.workers},
            status_code=503,
        )
    return JSONResponse({"status": "ok", "workers": state.workers})


async def models(request: Request) -> Dict[str, Any]:
    state = request.app.state
    return {
        "object": "list",
        "data": [
            {
                "id": state.model_name,
                "object": "model",
                "created": state.created,
                "owned_by": "minisgl",
            }
        ],
    }


async def debug_scheduler(request: Request) -> JSONResponse:
    frontend = request.app.state.frontend
    if frontend.failure is not None:
        return error_response(ErrorInfo(503, f"the server cannot serve: {frontend.failure}"))
    return JSONResponse(await frontend.stats())


async def completions(req: api.CompletionRequest, request: Request):
    if isinstance(req.prompt, list) and not req.prompt:
        return error_response(ErrorInfo(400, "prompt is empty", param="prompt"))
    text, ids = (req.prompt, None) if isinstance(req.prompt, str) else (None, req.prompt)
    max_tokens = 16 if req.max_tokens is None else req.max_tokens  # null means the default
    return await serve(
        req,
        request,
        chat=False,
        max_tokens=max_tokens,
        make=lambda uid, p: TokenizeMsg(
            uid=uid, sampling_params=p, text=text, input_ids=ids, echo=req.echo
        ),
    )


async def chat_completions(req: api.ChatRequest, request: Request):
    if not req.messages:
        return error_response(ErrorInfo(400, "messages is empty", param="messages"))
    messages = [m.as_dict() for m in req.messages]
    max_tokens = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    fill = max_tokens is None
    return await serve(
        req,
        request,
        chat=True,
        max_tokens=max_tokens,
        make=lambda uid, p: TokenizeMsg(
            uid=uid, sampling_params=p, messages=messages, fill_context=fill
        ),
    )


async def serve(req, request: Request, chat: bool, max_tokens: int | None, make):
    """Hand a request to the tokenizer worker and answer it: an error, a stream or one body."""
    frontend, model_name = request.app.state.frontend, request.app.state.model_name
    try:
        if req.model != model_name:
            raise ErrorInfo(
                404,
                f"The model `{req.model}` does not exist (this server serves `{model_name}`)",
                param="model",
                code="model_not_found",
            )
        bad = req.unsupported()
        if bad:
            raise ErrorInfo(400, f"{bad[0]}: not supported by this server", param=bad[0])
        params = api.sampling_params(req, 1 if max_tokens is None else max_tokens)
    except ErrorInfo as e:
        return error_response(e)
    uid = frontend.submit(lambda u: make(u, params))
    # Wait for the first token (or the refusal) before answering, so that an error gets its
    # status code; a client leaving meanwhile aborts the request.
    gone = asyncio.ensure_future(disconnected(request))
    first = await first_of(frontend.next_reply(uid), gone)
    gone.cancel()
    if first is None:
        frontend.release(uid, abort=True)
        return JSONResponse({}, status_code=499)  # nobody is listening
    if first.error is not None:
        frontend.release(uid, abort=False)
        return error_response(ErrorInfo(first.status, first.error))
    answer = Answer(
        chat,
        f"{'chatcmpl' if chat else 'cmpl'}-{uid}",
        model_name,
        req.return_token_ids,
        bool((req.stream_options or {}).get("include_usage")),
    )
    if req.stream:
        events = stream_events(frontend, uid, first, answer)
        if inspect.iscoroutine(events):  # an `async def` that never yields (a stub, a slip)
            try:  # its own error, raised here, says more than starlette's TypeError
                await events
                raise TypeError("stream_events must yield its events (an async generator)")
            finally:
                frontend.release(uid, abort=True)
        return AbortOnDisconnect(events, media_type="text/event-stream")
    return await collect(frontend, uid, first, answer, request)
