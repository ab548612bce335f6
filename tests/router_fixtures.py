"""What the router tests share: CPU workers on loopback, and an openai client for a URL."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, List

import openai

from minisgl.router.launch import start_workers, stop_all

MODEL = "shakespeare-qwen3"
GREEDY = {"temperature": 0, "max_tokens": 8}


@contextmanager
def worker_urls(count: int) -> Iterator[List[str]]:
    """`count` `python -m minisgl serve` workers on the bundled model, stopped on the way out."""
    servers = start_workers(count)
    try:
        yield [s.url for s in servers]
    finally:
        stop_all(servers)


def client(url: str) -> openai.OpenAI:
    """A client that never retries: a worker or router error reaches the test as it is."""
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
