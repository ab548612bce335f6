"""`python -m minisgl router --workers URL ...`: wait for the workers, then route on HTTP.

At start every worker must answer /health with 200 within `startup_timeout` (a worker still loading
its model is waited for); one that does not is named and the router does not start. The model name
clients see is the first worker's (/v1/models); workers serving another model are refused, since a
client could not tell which answered. The ready line is the server's own (`minisgl: serving MODEL
on http://HOST:PORT`), so what starts a server starts a router the same way.
"""

from __future__ import annotations

import sys
import time
from typing import List

import httpx

from minisgl.server.body_guard import DEFAULT_MAX_BYTES
from minisgl.server.launcher import bind

from .app import create_router_app
from .workers import WorkerPool


def wait_ready(urls: List[str], timeout: float, api_key: str | None = None) -> str:
    """The model the workers serve, once each answers /health 200; RuntimeError naming a worker
    that did not in `timeout` seconds or serves another model. `api_key`: the workers' key, for
    their /v1/models (clients bring their own through the router)."""
    deadline, last = time.monotonic() + timeout, {}
    pending = list(urls)
    while pending:
        for url in list(pending):
            try:
                r = httpx.get(url + "/health", timeout=5.0)
                if r.status_code == 200:
                    pending.remove(url)
                    continue
                last[url] = f"/health answered {r.status_code}"
            except httpx.HTTPError as e:
                last[url] = f"{type(e).__name__}: {e}"
        if pending and time.monotonic() > deadline:
            why = "; ".join(f"{u} ({last.get(u)})" for u in pending)
            raise RuntimeError(f"these workers did not answer /health in {timeout:g} s: {why}")
        if pending:
            time.sleep(0.5)
    models = {}
    for url in urls:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        r = httpx.get(url + "/v1/models", headers=headers, timeout=10.0)
        if r.status_code != 200:
            raise RuntimeError(f"{url}/v1/models answered {r.status_code}: {r.text[:200]}")
        models[url] = r.json()["data"][0]["id"]
    if len(set(models.values())) > 1:
        raise RuntimeError(f"the workers serve different models: {models}")
    return models[urls[0]]


def serve_router(
    pool: WorkerPool,
    host: str,
    port: int,
    health_interval: float,
    startup_timeout: float,
    log_level: str = "warning",
    api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_BYTES,
) -> int:
    import uvicorn

    urls = [w.url for w in pool.workers]
    try:
        sock = bind(host, port)
    except OSError as e:
        print(f"minisgl router: cannot listen on {host}:{port}: {e.strerror or e}", file=sys.stderr)
        return 1
    try:
        model = wait_ready(urls, startup_timeout, api_key)
    except RuntimeError as e:
        print(f"minisgl router: {e}", file=sys.stderr, flush=True)
        sock.close()
        return 1
    app = create_router_app(
        pool, health_interval=health_interval, max_request_bytes=max_request_bytes
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=2))
    host, port = sock.getsockname()[:2]
    print(
        f"minisgl router: {pool.policy} over {len(urls)} workers: {' '.join(urls)}",
        flush=True,
    )
    print(f"minisgl: serving {model} on http://{host}:{port}", flush=True)
    server.run(sockets=[sock])
    sock.close()
    return 0
