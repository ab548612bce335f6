"""Chapter 25's workload and tables: tenants' chat requests routed by the router's own pool.

The requests are OpenAI chat bodies, each a tenant's long system prompt and a short question; the
pool (minisgl/router/workers.py, the router's routing minus HTTP) keys them as the router does
(minisgl/router/keys.py) and picks a worker for each. A try-out passes its own tree class or
routing rule; the pool's other parts are the reference's.
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Sequence
from unittest import mock

from minisgl.router import workers
from minisgl.router.keys import routing_key
from minisgl.router.policy import Balance
from minisgl.router.tree import PrefixTree

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
ROUTER_RUN = RESULTS / "2026-12-06-cpu-router.txt"

SYSTEM = {
    "nurse": "You are Juliet's nurse: answer as she would, at length, with a story first. ",
    "friar": "You are Friar Laurence: answer with a herb, a remedy and a warning, in verse. ",
    "prince": "You are the Prince of Verona: answer with a ruling and the fine for breaking it. ",
}
QUESTIONS = ("Where is she?", "What hour is it?", "Who is at the door?", "Is it morning?")
ORDER = "nurse friar prince prince nurse friar nurse nurse friar prince friar prince".split()


def chat_body(tenant: str, question: str) -> bytes:
    messages = [
        {"role": "system", "content": SYSTEM[tenant] * 2},
        {"role": "user", "content": question},
    ]
    return json.dumps({"model": "m", "messages": messages}).encode()


def tenant_requests(order: Sequence[str] = ORDER) -> List[tuple]:
    """(tenant, body) of each request, the k-th request of a tenant asking its k-th question."""
    asked = {t: 0 for t in SYSTEM}
    out = []
    for tenant in order:
        out.append((tenant, chat_body(tenant, QUESTIONS[asked[tenant] % len(QUESTIONS)])))
        asked[tenant] += 1
    return out


def pool(
    n: int,
    policy: str = "cache_aware",
    tree: Callable[[], PrefixTree] = PrefixTree,
    balance: Balance = Balance(),
    max_tree_size: int = 1 << 22,
) -> workers.WorkerPool:
    """A pool of `n` workers (no server behind them: only routing runs), each tree a `tree()`."""
    p = workers.WorkerPool([f"http://worker-{i}" for i in range(n)], policy, balance, max_tree_size)
    for w in p.workers:
        w.tree = tree()
    return p


def shape(tree: PrefixTree) -> dict:
    """The tree as nested {edge: {...}} (token-id edges as tuples), to print or compare."""

    def below(node) -> dict:
        return {
            (c.edge if isinstance(c.edge, str) else tuple(c.edge)): below(c)
            for c in node.children.values()
        }

    return below(tree.root)


def walked(tree: PrefixTree, key) -> list:
    """The nodes a walk along `key` passes, found without the tree's own methods: each child
    filed under the key's next element, the last one perhaps only partly matched."""
    node, i, seen = tree.root, 0, []
    while i < len(key) and key[i] in node.children:
        node = node.children[key[i]]
        seen.append(node)
        i += len(node.edge)
    return seen


def newest(tree: PrefixTree) -> int:
    """The largest `last_used` in the tree: the tick of its latest walk."""
    stack, best = [tree.root], tree.root.last_used
    while stack:
        node = stack.pop()
        best = max(best, node.last_used)
        stack.extend(node.children.values())
    return best


@contextmanager
def routing_rule(rule: Callable) -> Iterator[None]:
    """The pool decides with `rule` instead of the reference's cache_aware while inside."""
    with mock.patch.object(workers, "cache_aware", rule):
        yield


@dataclass
class Routed:
    tenant: str
    worker: int
    key_len: int
    matched: int  # elements of the key the chosen worker's tree held before
    sizes: List[int]  # every tree's size after the request


def route(p: workers.WorkerPool, requests: Sequence[tuple]) -> List[Routed]:
    """Each request through `p.pick`, as the router's app routes a chat completion. Under
    cache_aware the pool's own trees say what each worker was sent; under another policy, trees
    kept here on the side do (the reference's), so the two policies read alike."""
    aside = None if p.policy == "cache_aware" else [PrefixTree() for _ in p.workers]
    trees = lambda: [w.tree for w in p.workers] if aside is None else aside  # noqa: E731
    out = []
    for tenant, body in requests:
        key = routing_key("/v1/chat/completions", body)
        held = [t.match(key) for t in trees()]
        i = p.workers.index(p.pick(key))
        if aside is not None:
            aside[i].insert(key)
        out.append(Routed(tenant, i, len(key), held[i], [t.size for t in trees()]))
    return out


def show(routed: Sequence[Routed]) -> None:
    print(f"{'#':>2}  {'tenant':<7} {'worker':>6}  {'held':>9}  tree sizes")
    for k, r in enumerate(routed):
        print(f"{k:>2}  {r.tenant:<7} {r.worker:>6}  {r.matched:>4}/{r.key_len:<4}  {r.sizes}")


def workers_of(routed: Sequence[Routed]) -> dict:
    """tenant -> the sorted workers its requests went to."""
    seen: dict = {}
    for r in routed:
        seen.setdefault(r.tenant, set()).add(r.worker)
    return {t: sorted(ws) for t, ws in seen.items()}


@dataclass
class RouterRow:
    router: str
    prefill: int
    prompt: int
    hit_rate: float  # percent
    ttft_p50_ms: int
    ttft_p99_ms: int
    per_worker: List[int]


ROW = re.compile(
    r"^(?P<router>\S.*?)\s{2,}(?P<prefill>\d+)\s+(?P<prompt>\d+)\s+(?P<hit>[\d.]+)%\s+[\d.]+\s+"
    r"[\d.]+\s+(?P<p50>\d+)ms\s+(?P<p99>\d+)ms\s+\[(?P<per>[\d, ]+)\]\s*$"
)


def read_router_run(path: Path = ROUTER_RUN) -> List[RouterRow]:
    """The rows of benchmarks/router.py's table in `path`; an error if it has none."""
    rows = []
    for line in path.read_text().splitlines():
        m = ROW.match(line)
        if m:
            per = [int(x) for x in m["per"].split(",")]
            rows.append(
                RouterRow(
                    m["router"],
                    int(m["prefill"]),
                    int(m["prompt"]),
                    float(m["hit"]),
                    int(m["p50"]),
                    int(m["p99"]),
                    per,
                )
            )
    if not rows:
        raise ValueError(f"{path.name}: no row of benchmarks/router.py's table")
    return rows
