"""Other clients' latency while one client sends 10 MB request bodies in a loop (issue 44).

    python benchmarks/hostile_body.py                 # bundled model, CPU
    python benchmarks/hostile_body.py --clients 16 --requests 4 --bodies 200

One server (`python -m minisgl serve`, default --max-request-bytes, 4 MiB). Two runs of the same
streaming workload: --clients clients, each sending --requests streamed /v1/completions one after
another (random token-id prompts and outputs of --len tokens, greedy, ignore_eos): once alone, once
while another process sends 10 MB bodies in a loop (a text prompt, a list of words, a list of token
ids, in turn; at most --bodies of them, and no longer than the workload runs). Printed side by side:
TTFT p50 and ITL p50 (minisgl/bench/stats.py, as bench_serve.py measures them) with the ratio,
and the hostile bodies' answers: their status codes and the time from sending one to its answer.
Before the body limit, one such body held the server 29 to 53 s and everyone else with it.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import random
import sys
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serve import one_request  # noqa: E402

from minisgl.bench.stats import percentile, stream_latencies  # noqa: E402

MB10 = 10_000_000


def hostile_bodies(model: str) -> List[bytes]:
    """Three 10 MB bodies, each a prompt far longer than any context: text, words, token ids."""
    head = b'{"model": "%s", "max_tokens": 1, "prompt": ' % model.encode()
    text = head + b'"' + b"a" * (MB10 - len(head) - 3) + b'"}'
    words = head + b"[" + b'"w", ' * ((MB10 - len(head)) // 5 - 1) + b'"w"]}'
    ids = head + b"[" + b"11, " * ((MB10 - len(head)) // 4 - 1) + b"11]}"
    return [text, words, ids]


def hostile_loop(url: str, model: str, stop, results, most: int) -> None:
    """Send 10 MB bodies one after another until `stop` is set or `most` were sent; put
    (status, seconds) of each on `results`."""
    import httpx

    bodies = hostile_bodies(model)
    headers = {"content-type": "application/json"}
    with httpx.Client(timeout=300) as client:
        for i in range(most):
            if stop.is_set():
                break
            start = time.perf_counter()
            try:
                status = client.post(
                    url + "/v1/completions", content=bodies[i % 3], headers=headers
                ).status_code
            except httpx.HTTPError as e:  # the server closed the connection mid-body
                status = type(e).__name__
            results.put((status, time.perf_counter() - start))


async def workload(url: str, model: str, clients: int, requests: int, length: int, vocab: int):
    import httpx

    rng = random.Random(0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)

    async def client_loop(client) -> List[Dict]:
        out = []
        for _ in range(requests):
            prompt = [rng.randrange(vocab) for _ in range(length)]
            out.append(await one_request(client, url, model, prompt, length, 0.0))
        return out

    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        runs = await asyncio.gather(*[client_loop(client) for _ in range(clients)])
    latencies = [stream_latencies(r["sent"], r["chunks"]) for run in runs for r in run]
    ttft = [first * 1000 for first, _ in latencies]
    itl = [gap * 1000 for _, gaps in latencies for gap in gaps]
    return percentile(ttft, 50), percentile(itl, 50)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=4, help="streamed requests per client")
    ap.add_argument("--len", type=int, default=32, help="prompt and output tokens a request")
    ap.add_argument("--bodies", type=int, default=200, help="the most 10 MB bodies sent")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    from minisgl.models import BUNDLED_MODEL
    from minisgl.server.background import BackgroundServer

    vocab = 4096  # the bundled model's
    server = BackgroundServer(
        "--device", args.device, "--max-running-req", str(args.clients), "--dtype", "float32",
        env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    url = server.start()
    model = BUNDLED_MODEL.name
    try:
        go = lambda: asyncio.run(  # noqa: E731
            workload(url, model, args.clients, args.requests, args.len, vocab)
        )
        go()  # warm-up: the first requests pay for start-up work
        alone = go()
        ctx = mp.get_context("spawn")
        stop, results = ctx.Event(), ctx.Queue()
        sender = ctx.Process(target=hostile_loop, args=(url, model, stop, results, args.bodies))
        sender.start()
        time.sleep(1.0)  # its first bodies under way
        beside = go()
        stop.set()
        sender.join(600)
        answers = []
        while not results.empty():
            answers.append(results.get())
    finally:
        server.stop()
    print(
        f"{model} on {args.device}: {args.clients} streaming clients x {args.requests} requests, "
        f"{args.len}-token prompts and outputs"
    )
    print(f"{'':24}{'alone':>10}{'beside 10 MB bodies':>22}{'ratio':>8}")
    for name, a, b in [
        ("TTFT p50 (ms)", alone[0], beside[0]),
        ("ITL p50 (ms)", alone[1], beside[1]),
    ]:
        print(f"{name:24}{a:10.1f}{b:22.1f}{b / a:8.2f}")
    statuses: Dict = {}
    for status, _ in answers:
        statuses[status] = statuses.get(status, 0) + 1
    seconds = [s * 1000 for _, s in answers]
    print(
        f"hostile client: {len(answers)} bodies of 10 MB sent during the run, answers {statuses}; "
        f"time to the answer p50 {percentile(seconds, 50):.0f} ms, max {max(seconds):.0f} ms"
        if answers
        else "hostile client: no body answered"
    )


if __name__ == "__main__":
    main()
