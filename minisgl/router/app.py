"""The router's HTTP front: the OpenAI API of its workers, each request passed to one of them.

    POST /v1/completions, /v1/chat/completions   routed by the policy (workers.py, keys.py) and
                          passed through: the worker's status, headers and body; a stream chunk by
                          chunk as the worker sends it
    GET  /health          200 while some worker is in, else 503; lists each worker's state
    GET  /router/workers  each worker's URL, health, load and tree size
    anything else         passed to a worker in turn (/v1/models, /tokenize, /metrics...)

A worker that cannot be reached (connection refused: it never saw the request) is taken out and
the request goes to another. One that fails after it took the request (it died, or cut the
connection) is taken out and the client told: 502 with an OpenAI error body naming the worker, or,
mid-stream, one error event in that shape and no [DONE] (as a server stopping mid-stream ends it).
The request is not sent again: it may have run, and a client retrying knows what it asked.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from minisgl.server.body_guard import DEFAULT_MAX_BYTES, GuardBody
from minisgl.server.errors import ErrorInfo
from minisgl.server.openai_api import sse_event

from .keys import routing_key
from .workers import NoWorker, Worker, WorkerPool

# not passed on: they describe one connection, not the request (RFC 9110 7.6.1), or the body's
# length, which httpx and uvicorn set for the body they send
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "accept-encoding",  # a worker that compressed would need the router to decode for a 502
}
ROUTED = ("/v1/completions", "/v1/chat/completions")


def create_router_app(
    pool: WorkerPool,
    health_interval: float = 1.0,
    request_timeout: float = 600.0,
    max_request_bytes: int = DEFAULT_MAX_BYTES,
) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        timeout = httpx.Timeout(request_timeout, connect=5.0)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            app.state.client = client
            watcher = asyncio.create_task(pool.watch(client, health_interval))
            yield
            watcher.cancel()

    app = FastAPI(title="minisgl router", lifespan=lifespan)
    app.state.pool = pool

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        workers = {w.url: w.out or "ok" for w in pool.workers}
        if pool.live():
            return JSONResponse({"status": "ok", "workers": workers})
        return JSONResponse({"status": "unhealthy", "workers": workers}, status_code=503)

    @app.get("/router/workers")
    async def workers():
        return [w.describe() for w in pool.workers]

    @app.api_route("/{path:path}", methods=["GET", "POST", "HEAD", "DELETE", "PUT"])
    async def forward(path: str, request: Request):
        return await proxy(app.state.client, pool, request)

    # the workers' own guard, before the router buffers a body: the same 413 and 400s they give
    app.add_middleware(GuardBody, max_bytes=max_request_bytes)
    return app


def error(status: int, message: str) -> JSONResponse:
    e = ErrorInfo(status, message)
    return JSONResponse(e.body(), status_code=status)


async def proxy(client: httpx.AsyncClient, pool: WorkerPool, request: Request) -> Response:
    path = request.url.path
    body = await request.body()
    key = routing_key(path, body) if request.method == "POST" and path in ROUTED else None
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
    tried = []
    while True:
        try:
            worker = pool.pick(key, exclude=tried)
        except NoWorker as e:
            return error(503, str(e))
        worker.load += 1
        upstream = client.build_request(
            request.method,
            worker.url + path,
            params=request.query_params,
            headers=headers,
            content=body,
        )
        try:
            reply = await client.send(upstream, stream=True)
        except httpx.ConnectError as e:  # it never got the request: another may take it
            worker.load -= 1
            pool.take_out(worker, f"connection failed: {e}")
            tried.append(worker)
            continue
        except httpx.HTTPError as e:
            worker.load -= 1
            return failed(pool, worker, e)
        break
    out_headers = {k: v for k, v in reply.headers.items() if k.lower() not in HOP_BY_HOP}
    if reply.headers.get("content-type", "").startswith("text/event-stream"):
        return StreamingResponse(
            relay(pool, worker, reply), status_code=reply.status_code, headers=out_headers
        )
    try:
        content = await reply.aread()
    except httpx.HTTPError as e:
        return failed(pool, worker, e)
    finally:
        worker.load -= 1
        await reply.aclose()
    return Response(content, status_code=reply.status_code, headers=out_headers)


def failed(pool: WorkerPool, worker: Worker, e: Exception) -> JSONResponse:
    reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    pool.take_out(worker, f"failed while answering: {reason}")
    return error(502, f"worker {worker.url} failed while answering this request ({reason})")


async def relay(pool: WorkerPool, worker: Worker, reply: httpx.Response):
    """The worker's stream, chunk for chunk; if it breaks, an error event ends it."""
    try:
        async for chunk in reply.aiter_raw():
            yield chunk
    except httpx.HTTPError as e:
        reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        pool.take_out(worker, f"failed while streaming: {reason}")
        message = f"worker {worker.url} failed while streaming this answer ({reason})"
        yield sse_event(ErrorInfo(502, message).body()).encode()
    finally:
        worker.load -= 1
        await reply.aclose()
