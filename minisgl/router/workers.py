"""The router's workers: their URLs, load, health, and the prefix tree of what each was sent.

A worker is "in" while it answers /health with 200. One that fails a health check, refuses a
connection, or drops a request it was answering is taken out at once (with the reason, shown by the
router's /health); the health loop puts it back when it answers 200 again, with an empty tree: a
worker that came back has most likely restarted, its cache empty.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from typing import Dict, List

import httpx

from .policy import POLICIES, Balance, RoundRobin, cache_aware, shortest_queue
from .tree import Key, PrefixTree


@dataclass(eq=False)
class Worker:
    url: str
    tree: PrefixTree = field(default_factory=PrefixTree)
    load: int = 0  # requests the router has sent it and not yet seen answered
    out: str | None = None  # why it is taken out; None while in

    def describe(self) -> Dict:
        return {
            "url": self.url,
            "healthy": self.out is None,
            "reason": self.out,
            "load": self.load,
            "tree_size": self.tree.size,
        }


class NoWorker(Exception):
    """Every worker is out."""


class WorkerPool:
    def __init__(
        self,
        urls: List[str],
        policy: str,
        balance: Balance = Balance(),
        max_tree_size: int = 1 << 22,
    ) -> None:
        if not urls:
            raise ValueError("a router needs at least one worker URL")
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}: one of {', '.join(POLICIES)}")
        urls = [url.rstrip("/") for url in urls]
        if len(set(urls)) != len(urls):
            raise ValueError(f"a worker URL is listed twice: {urls}")
        if max_tree_size < 1:
            raise ValueError(f"max tree size must be at least 1, got {max_tree_size}")
        self.workers = [Worker(url) for url in urls]
        self.policy, self.balance, self.max_tree_size = policy, balance, max_tree_size
        self.rr = RoundRobin()

    def live(self) -> List[Worker]:
        return [w for w in self.workers if w.out is None]

    def pick(self, key: Key | None, exclude=()) -> Worker:
        """The worker for a request whose routing key is `key` (None: a request that has none, as
        a GET or a body that is not JSON), among those in and not in `exclude`. Under cache_aware
        the key goes into the chosen worker's tree, which is then cut back to `max_tree_size`."""
        live = [w for w in self.live() if w not in exclude]
        if not live:
            reasons = "; ".join(
                f"{w.url}: {w.out or 'failed for this request'}" for w in self.workers
            )
            raise NoWorker(f"no worker can take the request ({reasons})")
        loads = [w.load for w in live]
        if self.policy == "round_robin" or key is None and self.policy == "cache_aware":
            return live[self.rr.choose(len(live))]
        if self.policy == "shortest_queue":
            return live[shortest_queue(loads)]
        matches = [w.tree.match(key) for w in live]
        sizes = [w.tree.size for w in live]
        worker = live[cache_aware(matches, len(key), loads, sizes, self.balance)]
        worker.tree.insert(key)
        worker.tree.evict(self.max_tree_size)
        return worker

    def take_out(self, worker: Worker, reason: str) -> None:
        if worker.out is None:
            print(f"minisgl router: {worker.url} taken out: {reason}", file=sys.stderr, flush=True)
        worker.out = reason

    def put_back(self, worker: Worker) -> None:
        if worker.out is not None:
            print(f"minisgl router: {worker.url} is back", file=sys.stderr, flush=True)
            worker.tree = PrefixTree()
        worker.out = None

    async def check(self, client: httpx.AsyncClient, timeout: float) -> None:
        """One round of health checks, all workers at once."""

        async def one(worker: Worker) -> None:
            try:
                r = await client.get(worker.url + "/health", timeout=timeout)
            except httpx.HTTPError as e:
                self.take_out(worker, f"/health failed: {type(e).__name__}: {e}")
                return
            if r.status_code == 200:
                self.put_back(worker)
            else:
                self.take_out(worker, f"/health answered {r.status_code}: {r.text[:200]}")

        await asyncio.gather(*(one(w) for w in self.workers))

    async def watch(self, client: httpx.AsyncClient, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await self.check(client, timeout=max(interval, 1.0))
