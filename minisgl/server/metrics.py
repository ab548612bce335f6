"""The server's Prometheus metrics, served at GET /metrics (prometheus_client's text format).

    minisgl_requests_total{endpoint, status}   HTTP requests answered (endpoint: the route's path)
    minisgl_prompt_tokens_total                 prompt tokens of the requests the engine took
    minisgl_generation_tokens_total             tokens generated
    minisgl_time_to_first_token_seconds         from a request's submission to its first token
    minisgl_inter_token_latency_seconds         between two replies of a request that carry tokens
    minisgl_requests_running                    requests decoding in the scheduler
    minisgl_requests_waiting                    requests queued for a slot
    minisgl_kv_pages_used, minisgl_kv_pages_total   KV pool pages held (by requests or the cache)

Token counts and latencies are measured where the API server receives the replies
(`Frontend.listen`): what a client sees, sockets and detokenizing included. The scheduler's
gauges are read from it (the stats /debug/scheduler shows) at each scrape. Each app has a registry
of its own, so two apps in one process do not share counts.
"""

from __future__ import annotations

import time
from typing import Any, Dict

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.routing import Match

# Latency buckets in seconds: from a fast GPU's decode step to a CPU's long prefill.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "minisgl_requests", "HTTP requests answered", ["endpoint", "status"], registry=r
        )
        self.prompt_tokens = Counter(
            "minisgl_prompt_tokens", "Prompt tokens of the requests taken", registry=r
        )
        self.generation_tokens = Counter(
            "minisgl_generation_tokens", "Tokens generated", registry=r
        )
        self.ttft = Histogram(
            "minisgl_time_to_first_token_seconds",
            "Time from a request's submission to its first token",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "minisgl_inter_token_latency_seconds",
            "Time between two replies of a request that carry tokens",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.running = Gauge("minisgl_requests_running", "Requests decoding", registry=r)
        self.waiting = Gauge("minisgl_requests_waiting", "Requests queued for a slot", registry=r)
        self.pages_used = Gauge("minisgl_kv_pages_used", "KV pool pages held", registry=r)
        self.pages_total = Gauge("minisgl_kv_pages_total", "KV pool pages", registry=r)
        self._last: Dict[int, float | None] = {}  # uid -> its last token's time (None: none yet)
        self._submitted: Dict[int, float] = {}

    # -- called by Frontend

    def submitted(self, uid: int) -> None:
        self._submitted[uid] = time.perf_counter()
        self._last[uid] = None

    def replied(self, uid: int, reply: Any) -> None:
        """One UserReply of request `uid` has arrived."""
        if uid not in self._submitted or reply.error is not None or not reply.token_ids:
            return
        now, last = time.perf_counter(), self._last[uid]
        if last is None:
            self.prompt_tokens.inc(reply.prompt_tokens)
            self.ttft.observe(now - self._submitted[uid])
        else:
            self.itl.observe(now - last)
        self.generation_tokens.inc(len(reply.token_ids))
        self._last[uid] = now

    def released(self, uid: int) -> None:
        self._submitted.pop(uid, None)
        self._last.pop(uid, None)

    # -- called at each scrape

    def scheduler_stats(self, stats: Dict[str, Any]) -> None:
        self.running.set(stats["running"])
        self.waiting.set(stats["queued"])
        self.pages_used.set(stats["pages_total"] - stats["pages_free"])
        self.pages_total.set(stats["pages_total"])


class CountRequests:
    """ASGI middleware: every HTTP request answered counts once in `requests_total`, by its route's
    path (a path no route serves counts as "other", so that a scanner cannot add labels) and
    status."""

    def __init__(self, app, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # raised before answering: what the client is told

        async def counting_send(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.metrics.requests.labels(endpoint_of(scope), str(status)).inc()


def endpoint_of(scope) -> str:
    """The path of the route serving `scope` (set by the router), or of the one that would have
    served it (a request refused before routing: a 401), or "other"."""
    route = scope.get("route")
    if route is None:
        app = scope.get("app")
        routes = app.router.routes if app is not None else []
        route = next((r for r in routes if r.matches(scope)[0] == Match.FULL), None)
    return getattr(route, "path", None) or "other"
