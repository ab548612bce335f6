"""N workers and a router in front of them, on one machine: for a try-out, the router's tests
(tests/test_router_*.py) and its benchmark (benchmarks/router.py).

    python -m minisgl.router.launch --workers 4 --policy cache_aware       # minisgl's router
    python -m minisgl.router.launch --workers 4 --sglang                   # SGLang's ([router])

starts N `python -m minisgl serve` workers at once (each loads its model while the others do) on
free ports, then the router, prints the router's URL and serves until Ctrl-C. Options after `--`
go to every worker (default: the bundled model on the CPU, small pools: WORKER_ARGS). On several
GPUs give each worker its own: `CUDA_VISIBLE_DEVICES` per worker is the launcher's job there.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Dict, Iterator, List, Sequence

import httpx

from minisgl.server.background import BackgroundServer

# a prompt of ~150 tokens and a few hundred generated fit; 4 requests decode at once per worker
WORKER_ARGS = (
    "--max-running-req",
    "4",
    "--max-seq-len",
    "512",
    "--num-pages",
    "1024",
    "--dtype",
    "float32",
    "--device",
    "cpu",
)
WORKER_ENV = {"OMP_NUM_THREADS": "1"}
ROUTER = ("-m", "minisgl", "router")


def start_workers(n: int, *extra: str) -> List[BackgroundServer]:
    workers = [BackgroundServer(*WORKER_ARGS, *extra, env=WORKER_ENV) for _ in range(n)]
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(w.start) for w in workers]
    try:
        for f in futures:
            f.result()
    except BaseException:
        stop_all(workers)
        raise
    return workers


def stop_all(servers: Sequence[BackgroundServer]) -> None:
    for s in servers:
        try:
            s.stop()
        except subprocess.TimeoutExpired:
            pass  # killed


def kill(server: BackgroundServer) -> None:
    """SIGKILL the server and its worker processes at once: a machine that dies."""
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait()


@contextmanager
def minisgl_router(urls: Sequence[str], *options: str) -> Iterator[BackgroundServer]:
    router = BackgroundServer(
        "--workers", *urls, "--health-interval", "0.5", *options, command=ROUTER, timeout=120
    )
    router.start()
    try:
        yield router
    finally:
        stop_all([router])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def sglang_router(urls: Sequence[str], *options: str) -> Iterator[str]:
    """SGLang's router (`sglang-router`) in front of `urls`, until it lists every worker as
    healthy; yields its URL. Its Prometheus exporter gets a port of its own (two routers on the
    default one: the second panics)."""
    port, metrics = free_port(), free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sglang_router.launch_router",
            "--worker-urls",
            *urls,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--prometheus-port",
            str(metrics),
            "--log-level",
            "warn",
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"sglang-router exited ({proc.returncode}): " + proc.stdout.read()[-3000:]
                )
            try:
                listed = httpx.get(url + "/workers", timeout=5).json()["workers"]
                if len([w for w in listed if w.get("is_healthy")]) == len(urls):
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("sglang-router did not list every worker healthy in 120 s")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def prefill_tokens(urls: Sequence[str]) -> Dict[str, int]:
    """Each worker's count of prompt tokens its prefill batches computed (a cached prefix is not
    computed): /debug/scheduler's `prefill_tokens`."""
    return {u: httpx.get(u + "/debug/scheduler", timeout=30).json()["prefill_tokens"] for u in urls}


def main(argv=None) -> int:
    import argparse

    from .policy import POLICIES

    parser = argparse.ArgumentParser(prog="python -m minisgl.router.launch")
    parser.add_argument("--workers", type=int, default=2, help="how many workers (default 2)")
    parser.add_argument("--policy", choices=POLICIES, default="cache_aware")
    parser.add_argument(
        "--sglang", action="store_true", help="SGLang's router (pip install -e '.[router]')"
    )
    parser.add_argument("serve_args", nargs="*", help="after --: options for every worker")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    if args.sglang and args.policy == "shortest_queue":
        parser.error("SGLang's router has no shortest_queue (its power_of_two is the nearest)")
    servers = start_workers(args.workers, *args.serve_args)
    urls = [s.url for s in servers]
    print("workers:", " ".join(urls), flush=True)
    try:
        if args.sglang:
            with sglang_router(urls, "--policy", args.policy) as url:
                print(f"sglang-router ({args.policy}) on {url}; Ctrl-C stops all", flush=True)
                _wait()
        else:
            with minisgl_router(urls, "--policy", args.policy) as router:
                print(f"minisgl router ({args.policy}) on {router.url}; Ctrl-C stops all")
                _wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop_all(servers)
    return 0


def _wait() -> None:
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
