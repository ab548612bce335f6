"""The HTTP front end: an OpenAI-compatible API on FastAPI.

    GET  /health                 200 {"status": "ok", "workers": {name: pid}} (HEAD too);
                                 503 once a worker died
    GET  /v1/models              the one model served; /v1/models/{id} it alone (404 for another)
    POST /v1/completions         a prompt: text, token ids, or a list of either (one choice each);
                                 streamed with "stream": true
    POST /v1/chat/completions    messages, rendered with the model's chat template
    POST /tokenize               {"prompt": text or ids} or {"messages": [...]} -> {"tokens",
                                 "count", "max_model_len"}, the ids a request's prompt would have
    POST /detokenize             {"tokens": [...]} -> {"prompt": text}
    GET  /tokenizer_info         the special tokens, chat template and context length (vLLM's)
    GET  /metrics                Prometheus metrics (metrics.py)
    GET  /debug/scheduler        the scheduler's slots and pages (tests check nothing leaks)

What a request may hold, and what is refused rather than ignored, is in openai_api.py. `n` and a
list of prompts give several choices, each a request of its own in the engine (choices.py).
Response ids are random (`cmpl-<uuid4 hex>`), unique across restarts; the engine's uids stay
inside. With `--api-key` (or MINISGL_API_KEY), /v1/*, /tokenize, /detokenize and the server and
model info routes need `Authorization: Bearer <key>` (else a 401 with code "invalid_api_key");
/health, /metrics and /debug stay open, for probes and scrapers.

Errors have the OpenAI API's body, {"error": {"message", "type", "param", "code"}}: 400 for a
request that is wrong (bad JSON too: the OpenAI API answers 400, and its clients expect it, where
FastAPI would say 422; a prompt too long for the context has code "context_length_exceeded"), 401
without the key (with WWW-Authenticate: Bearer), 404 for an unknown model or path, 413 for a body
over `serve --max-request-bytes`, refused before it is read (body_guard.py, which also refuses a
body that is not plain JSON, naming what it is), 500 when the server failed, 503 after, and 503
for an answer cut short because the server is stopping (a stream gets it as its last event, with
no [DONE]).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, Callable, Dict, List

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from minisgl.message import TokenizeMsg

from . import choices, request_sampling, schema, structured
from . import openai_api as api
from .abort_on_disconnect import AbortOnDisconnect
from .auth import RequireApiKey
from .body_guard import DEFAULT_MAX_BYTES, GuardBody
from .errors import ErrorInfo, unknown_model
from .frontend import Frontend
from .metrics import CountRequests, ServerMetrics
from .prompt_bounds import ids_refusal
from .responses import Answer, collect, disconnected, error_response, first_of, stream_events
from .running_usage import TokenCounter, with_running_usage
from .schema import BODY_ERRORS, METRICS_TEXT, STREAMED
from .token_routes import PromptTokenizer, detokenize, tokenize, tokenizer_info


def create_app(
    frontend: Frontend,
    model_name: str,
    on_startup: Callable[[], List[Any]] | None = None,
    workers: Dict[str, int] | None = None,
    *,
    api_key: str | None = None,
    tokenizer: PromptTokenizer | None = None,
    stopping: Callable[[], bool] | None = None,
    max_request_bytes: int = DEFAULT_MAX_BYTES,
) -> FastAPI:
    """The app; `on_startup()` returns the tasks to run beside it (the reply listener, a watchdog);
    `workers`, the worker processes' pids by name, is shown by /health; `api_key`: if set, the
    key every /v1/ request must bring; `tokenizer`: what /tokenize and /detokenize use (None: they
    answer 503); `stopping()`: True once the server has begun to stop (streams open then are ended
    with an error event); `max_request_bytes`: the largest body accepted (body_guard.py). The routes
    below read what they serve from `app.state`."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        tasks = [asyncio.create_task(c) for c in (on_startup() if on_startup else [])]
        if stopping is not None:
            tasks.append(asyncio.create_task(watch_stopping(stopping, app.state.stopping)))
        yield
        for t in tasks:
            t.cancel()

    app = FastAPI(title="minisgl", lifespan=lifespan)
    app.state.frontend, app.state.model_name = frontend, model_name
    app.state.workers, app.state.created = workers or {}, int(time.time())
    app.state.tokenizer, app.state.stopping = tokenizer, asyncio.Event()
    app.state.metrics = frontend.metrics = ServerMetrics()
    app.add_exception_handler(RequestValidationError, bad_request)
    app.add_exception_handler(HTTPException, http_error)
    for method in ("GET", "HEAD"):
        app.add_api_route(
            "/health",
            health,
            methods=[method],
            operation_id=f"health_{method.lower()}",
            responses=schema.errors(503),
        )
    app.add_api_route(
        "/metrics", metrics, methods=["GET"], response_class=Response, responses=METRICS_TEXT
    )
    app.add_api_route("/v1/models", models, methods=["GET"], responses=schema.errors(401))
    app.add_api_route(
        "/v1/models/{model_id:path}", model, methods=["GET"], responses=schema.errors(401, 404)
    )
    app.add_api_route(
        "/debug/scheduler", debug_scheduler, methods=["GET"], responses=schema.errors(503)
    )
    for path, route in [
        ("/v1/completions", completions),
        ("/v1/chat/completions", chat_completions),
    ]:
        app.add_api_route(path, route, methods=["POST"], responses={**STREAMED, **BODY_ERRORS})
    app.add_api_route("/tokenize", tokenize, methods=["POST"], responses=BODY_ERRORS)
    app.add_api_route("/detokenize", detokenize, methods=["POST"], responses=BODY_ERRORS)
    app.add_api_route(
        "/tokenizer_info", tokenizer_info, methods=["GET"], responses=schema.errors(401, 503)
    )
    schema.install(app, model_name)
    # inside the key's check: a client without the key has no body read
    app.add_middleware(GuardBody, max_bytes=max_request_bytes)
    if api_key:
        app.add_middleware(RequireApiKey, key=api_key)
    app.add_middleware(CountRequests, metrics=app.state.metrics)  # outermost: counts the 401s
    return app


async def watch_stopping(stopping: Callable[[], bool], event: asyncio.Event) -> None:
    """Set `event` once `stopping()` (uvicorn's should_exit, set by its signal handler)."""
    while not stopping():
        await asyncio.sleep(0.1)
    event.set()


# ---------------------------------------------------------------------- errors


async def bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 for a body that does not parse, as the OpenAI API's 400."""
    err = exc.errors()[0]
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    if err.get("type") == "json_invalid":
        why = err.get("ctx", {}).get("error") or err.get("msg")
        at = f" at character {loc[0]}" if loc else ""
        return error_response(ErrorInfo(400, f"the request body is not valid JSON: {why}{at}"))
    where = ".".join(loc) or "body"
    if err.get("type") == "extra_forbidden":  # the OpenAI API's words for a field it does not know
        return error_response(
            ErrorInfo(400, f"Unrecognized request argument supplied: {where}", param=where)
        )
    return error_response(
        ErrorInfo(400, f"{where}: {err.get('msg')}", param=loc[0] if loc else None)
    )


async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
    return error_response(ErrorInfo(exc.status_code, unparsable_body(exc) or str(exc.detail)))


def unparsable_body(exc: HTTPException) -> str | None:
    """What FastAPI's bare "There was an error parsing the body" was, said: the JSON parser's own
    exception is the HTTPException's cause."""
    cause = exc.__cause__
    if isinstance(cause, UnicodeDecodeError):
        return (
            f"the request body is not valid UTF-8: byte 0x{cause.object[cause.start]:02x} at "
            f"offset {cause.start} ({cause.reason})"
        )
    if isinstance(cause, RecursionError):
        return (
            "the request body's JSON is nested too deeply for the parser (no request of this API "
            f"nests more than a few levels): {cause}"
        )
    return None


# ---------------------------------------------------------------------- routes


async def health(request: Request) -> JSONResponse:
    state = request.app.state
    if state.frontend.failure is not None:
        return JSONResponse(
            {"status": "unhealthy", "reason": state.frontend.failure, "workers": state.workers},
            status_code=503,
        )
    return JSONResponse({"status": "ok", "workers": state.workers})


def model_card(state) -> Dict[str, Any]:
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "minisgl",
    }


async def models(request: Request) -> Dict[str, Any]:
    return {"object": "list", "data": [model_card(request.app.state)]}


async def model(model_id: str, request: Request):
    state = request.app.state
    if model_id != state.model_name:
        return error_response(unknown_model(model_id, state.model_name))
    return model_card(state)


async def metrics(request: Request) -> Response:
    state = request.app.state
    if state.frontend.failure is None:
        try:
            state.metrics.scheduler_stats(await state.frontend.stats(timeout=5.0))
        except (asyncio.TimeoutError, RuntimeError):
            pass  # the scheduler did not answer: its gauges keep their last values
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def debug_scheduler(request: Request) -> JSONResponse:
    frontend = request.app.state.frontend
    if frontend.failure is not None:
        return error_response(ErrorInfo(503, f"the server cannot serve: {frontend.failure}"))
    return JSONResponse(await frontend.stats())


async def completions(req: api.CompletionRequest, request: Request):
    prompts = req.prompts()
    # (an empty text may still be a prompt: a tokenizer that adds BOS gives it one token)
    if not prompts or any(isinstance(p, list) and not p for p in prompts):
        return error_response(ErrorInfo(400, "prompt is empty", param="prompt"))

    def message(prompt):
        text, ids = (prompt, None) if isinstance(prompt, str) else (None, prompt)
        return lambda uid, p: TokenizeMsg(
            uid=uid, sampling_params=p, text=text, input_ids=ids, echo=bool(req.echo)
        )

    max_tokens = 16 if req.max_tokens is None else req.max_tokens  # null means the default
    context_len = getattr(request.app.state.tokenizer, "context_len", None)
    for p in prompts if context_len else ():  # ids too many for the context: refused unsent
        refusal = isinstance(p, list) and ids_refusal(len(p), max_tokens, context_len)
        if refusal:
            return error_response(refusal)
    return await unless_stopping(
        serve(req, request, chat=False, max_tokens=max_tokens, makes=[message(p) for p in prompts]),
        request,
    )


async def chat_completions(req: api.ChatRequest, request: Request):
    if not req.messages:
        return error_response(ErrorInfo(400, "messages is empty", param="messages"))
    messages = [m.as_dict() for m in req.messages]
    max_tokens = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    fill = max_tokens is None
    make = lambda uid, p: TokenizeMsg(  # noqa: E731
        uid=uid, sampling_params=p, messages=messages, fill_context=fill
    )
    return await unless_stopping(
        serve(req, request, chat=True, max_tokens=max_tokens, makes=[make]), request
    )


async def unless_stopping(answering, request: Request):
    """The answer of coroutine `answering`, unless the server begins to stop first: then a 503 (and
    one line in the log), its requests aborted, rather than uvicorn cancelling it two seconds
    later with a traceback and a bare 500. (A stream, once answering, is AbortOnDisconnect's.)"""
    task = asyncio.ensure_future(answering)
    stop = asyncio.ensure_future(request.app.state.stopping.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if task.done():
        return task.result()
    task.cancel()  # its `finally`s release its requests, with an abort
    await asyncio.gather(task, return_exceptions=True)
    print(f"minisgl: a request to {request.url.path} cut by the server's shutdown", flush=True)
    return error_response(ErrorInfo(503, "the server is shutting down: this answer was cut short"))


MAX_N = 128  # the OpenAI API's limit on `n`
# every choice is an engine request: one body may not queue more than this many (prompts x n)
MAX_CHOICES = 2048


async def serve(req, request: Request, chat: bool, max_tokens: int | None, makes):
    """Hand a request to the tokenizer worker and answer it: an error, a stream or one body.
    `makes`: for each prompt, `make(uid, params)` gives its TokenizeMsg; each prompt is sampled
    `req.n` times, each sample a request of its own (choices.py joins them)."""
    frontend, model_name = request.app.state.frontend, request.app.state.model_name
    stopping = request.app.state.stopping
    try:
        if req.model != model_name:
            raise unknown_model(req.model, model_name)
        bad = req.unsupported()
        if bad:
            raise ErrorInfo(400, f"{bad[0]}: not supported by this server", param=bad[0])
        contradiction = req.contradiction()
        if contradiction is not None:
            raise contradiction
        n = req.n_choices
        if not 1 <= n <= MAX_N:
            raise ErrorInfo(400, f"n must be between 1 and {MAX_N}, got {n}", param="n")
        if len(makes) * n > MAX_CHOICES:
            raise ErrorInfo(
                400,
                f"one request may ask for at most {MAX_CHOICES} choices (prompts x n), "
                f"got {len(makes)} prompts x n={n}",
                param="prompt",
            )
        structure = structured.structure_of(req)  # response_format, tools (structured.py)
        structured.refuse_stream(req, structure)
        params = request_sampling.sampling_params(req, 1 if max_tokens is None else max_tokens)
        params = structured.constrained(params, structure)
    except ErrorInfo as e:
        return error_response(e)
    # A seeded request's samples differ from each other, and repeat: sample j draws with seed + j.
    samples = [
        params if params.seed is None else dataclasses.replace(params, seed=params.seed + j)
        for j in range(n)
    ]
    uids = [frontend.submit(lambda u, m=make, p=p: m(u, p)) for make in makes for p in samples]
    # Wait for the first tokens (or a refusal) before answering, so that an error gets its
    # status code; a client leaving meanwhile aborts the requests.
    gone = asyncio.ensure_future(disconnected(request))
    gathered = asyncio.gather(*(frontend.next_reply(u) for u in uids))
    # cancelled when the client leaves first, the gather holds a CancelledError that nobody awaits,
    # which asyncio would log as a traceback ("exception was never retrieved"): retrieved here
    gathered.add_done_callback(lambda f: f.cancelled() or f.exception())
    firsts = None
    try:
        firsts = await first_of(gathered, gone)
    finally:  # also when cancelled: the server stops (unless_stopping)
        gone.cancel()
        if firsts is None:
            for uid in uids:
                frontend.release(uid, abort=True)
    if firsts is None:
        return JSONResponse({}, status_code=499)  # nobody is listening
    refused = next((f for f in firsts if f.error is not None), None)
    if refused is not None:
        for uid, first in zip(uids, firsts):
            frontend.release(uid, abort=first.error is None)
        return error_response(
            ErrorInfo(
                refused.status, refused.error, code=request_sampling.error_code(refused.error)
            )
        )
    answer = Answer(
        chat,
        f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",  # unique across restarts too
        model_name,
        bool(req.return_token_ids),
        req.include_usage,
        req.continuous_usage,
    )
    if len(uids) > 1:
        if req.streams:
            events = choices.stream_choices(frontend, uids, firsts, answer, n)
            return AbortOnDisconnect(events, stopping, answer.rid, media_type="text/event-stream")
        answered = await choices.collect_choices(frontend, uids, firsts, answer, request, n)
        return structured.as_tool_calls(answered, structure)
    uid, first = uids[0], firsts[0]
    if req.streams:
        counter = TokenCounter(frontend, first) if answer.continuous_usage else frontend
        events = stream_events(counter, uid, first, answer)
        if inspect.iscoroutine(events):  # an `async def` that never yields (a stub, a slip)
            try:  # its own error, raised here, says more than starlette's TypeError
                await events
                raise TypeError("stream_events must yield its events (an async generator)")
            finally:
                frontend.release(uid, abort=True)
        if answer.continuous_usage:
            events = with_running_usage(events, counter, first.prompt_tokens)
        return AbortOnDisconnect(events, stopping, answer.rid, media_type="text/event-stream")
    return structured.as_tool_calls(await collect(frontend, uid, first, answer, request), structure)
