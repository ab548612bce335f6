"""`python -m minisgl serve [--model DIR] [--port N] ...`: the OpenAI-compatible server;
`python -m minisgl router --workers URL ... [--policy cache_aware]`: a router in front of several.

It serves the reference engine; `python judge.py serve chNN` serves a learner's functions of a
chapter, through the init hook every server process runs (minisgl/server/init.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minisgl.env import API_KEY
from minisgl.server.args import DEFAULT_MAX_BYTES


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minisgl")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    s.add_argument(
        "--model",
        type=Path,
        default=None,
        help="a Hugging Face model directory (default: the bundled model)",
    )
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument(
        "--port", type=int, default=8000, help="0: any free port (the ready line names it)"
    )
    s.add_argument(
        "--served-model-name",
        default=None,
        help="the model name clients use (default: the directory's name)",
    )
    s.add_argument(
        "--api-key",
        default=API_KEY.read() or None,
        help="require 'Authorization: Bearer KEY' on /v1/*, /tokenize and /detokenize "
        "(default: $MINISGL_API_KEY; unset: no key)",
    )
    s.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_BYTES,
        help="the largest request body accepted; a larger one is answered 413 without being "
        f"read (default {DEFAULT_MAX_BYTES}, 4 MiB)",
    )
    s.add_argument("--device", default=None, help="auto, cpu, cuda, cuda:1, ...")
    s.add_argument(
        "--dtype", default=None, help="float32, bfloat16 or float16 (default: float32 on a CPU)"
    )
    s.add_argument("--max-running-req", type=int, default=None, help="requests decoding at once")
    s.add_argument("--max-seq-len", type=int, default=None, help="longest request, prompt + output")
    s.add_argument("--num-pages", type=int, default=None, help="KV pool size in pages")
    s.add_argument("--page-size", type=int, default=None)
    s.add_argument("--cache-type", choices=["radix", "naive"], default=None)
    s.add_argument(
        "--schedule-policy",
        choices=["fcfs", "lpm"],
        default=None,
        help="order of the waiting queue: arrival (fcfs, default) or longest cached prefix (lpm)",
    )
    s.add_argument(
        "--optimistic-admission",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="admit on an estimate of the tokens requests use and retract when pages run out "
        "(default off: reserve prompt + max_tokens)",
    )
    s.add_argument(
        "--mixed-batches",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let a prefill step carry the running requests' decode tokens (default off)",
    )
    s.add_argument(
        "--speculative",
        choices=["lookup", "draft"],
        default=None,
        help="speculative decoding: drafts from prompt lookup (each request's own tokens) or "
        "from a draft model (--draft-model), verified by the model in one forward (default off)",
    )
    s.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=None,
        help="the most draft tokens verified per request and step (default 4)",
    )
    s.add_argument(
        "--draft-model",
        type=Path,
        default=None,
        help="the draft model's directory, with --speculative draft (it must share the tokenizer)",
    )
    s.add_argument(
        "--tp-size",
        type=int,
        default=None,
        help="tensor-parallel ranks: processes of the scheduler, one GPU each on CUDA (default 1)",
    )
    s.add_argument(
        "--log-level", default="warning", help="uvicorn's log level (info shows each request)"
    )
    add_router_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "router":
        return run_router(parser, args)
    if args.max_request_bytes < 1:
        parser.error(f"--max-request-bytes must be at least 1, got {args.max_request_bytes}")

    from minisgl.server.args import ServerArgs
    from minisgl.server.launcher import serve

    names = {
        "device": "device",
        "dtype": "dtype",
        "max_running_req": "max_running_req",
        "max_seq_len": "max_seq_len_override",
        "num_pages": "num_page_override",
        "page_size": "page_size",
        "cache_type": "cache_type",
        "schedule_policy": "schedule_policy",
        "optimistic_admission": "optimistic_admission",
        "mixed_batches": "mixed_batches",
        "speculative": "speculative",
        "num_speculative_tokens": "num_speculative_tokens",
        "tp_size": "tp_size",
    }
    engine = {
        option: getattr(args, name)
        for name, option in names.items()
        if getattr(args, name) is not None
    }
    server_args = ServerArgs(
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        engine=engine,
        api_key=args.api_key,
        max_request_bytes=args.max_request_bytes,
    )
    if args.model is not None:
        if not args.model.is_dir():
            parser.error(f"--model {args.model}: not a directory")
        server_args.model = args.model.resolve()
    if args.draft_model is not None:
        if not args.draft_model.is_dir():
            parser.error(f"--draft-model {args.draft_model}: not a directory")
        engine["draft_model"] = str(args.draft_model.resolve())
    return serve(server_args, log_level=args.log_level)


def add_router_parser(sub) -> None:
    from minisgl.router.policy import POLICIES, Balance

    b = Balance()
    r = sub.add_parser(
        "router", help="route requests across several `serve` workers (minisgl/router)"
    )
    r.add_argument("--workers", nargs="+", required=True, metavar="URL", help="the workers' URLs")
    r.add_argument("--policy", choices=POLICIES, default="cache_aware")
    r.add_argument("--host", default="127.0.0.1")
    r.add_argument("--port", type=int, default=8000, help="0: any free port")
    r.add_argument(
        "--balance-abs-threshold",
        type=int,
        default=b.abs_threshold,
        help="cache_aware: requests in flight between the busiest and the idlest worker past "
        f"which (with the relative one) the idlest takes the request (default {b.abs_threshold})",
    )
    r.add_argument(
        "--balance-rel-threshold",
        type=float,
        default=b.rel_threshold,
        help=f"cache_aware: the busiest's load over the idlest's (default {b.rel_threshold})",
    )
    r.add_argument(
        "--cache-threshold",
        type=float,
        default=b.cache_threshold,
        help="cache_aware: the share of a prompt a worker's tree must match to win it; below, "
        f"the worker with the smallest tree takes it (default {b.cache_threshold})",
    )
    r.add_argument(
        "--max-tree-size",
        type=int,
        default=1 << 22,
        help="cache_aware: characters (or token ids) each worker's tree keeps; past it the least "
        "recently used leaves go (default 4194304)",
    )
    r.add_argument("--health-interval", type=float, default=1.0, help="seconds between checks")
    r.add_argument(
        "--startup-timeout",
        type=float,
        default=300.0,
        help="seconds to wait for every worker's /health at start",
    )
    r.add_argument(
        "--api-key",
        default=API_KEY.read() or None,
        help="the workers' key, for the router's own look at /v1/models (clients send theirs)",
    )
    r.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_BYTES,
        help="the largest request body passed on; a larger one is answered 413 unread, as a "
        f"worker answers it (default {DEFAULT_MAX_BYTES})",
    )
    r.add_argument("--log-level", default="warning")


def run_router(parser, args) -> int:
    from minisgl.router.policy import Balance
    from minisgl.router.serve import serve_router
    from minisgl.router.workers import WorkerPool

    if args.max_request_bytes < 1:
        parser.error(f"--max-request-bytes must be at least 1, got {args.max_request_bytes}")
    if args.health_interval <= 0:
        parser.error(f"--health-interval must be positive, got {args.health_interval}")
    bad = [u for u in args.workers if not u.startswith(("http://", "https://"))]
    if bad:
        parser.error(f"--workers: not an http:// or https:// URL: {bad[0]}")
    try:
        balance = Balance(
            args.balance_abs_threshold, args.balance_rel_threshold, args.cache_threshold
        )
        pool = WorkerPool(args.workers, args.policy, balance, args.max_tree_size)
    except ValueError as e:
        parser.error(str(e))
    return serve_router(
        pool,
        args.host,
        args.port,
        args.health_interval,
        args.startup_timeout,
        args.log_level,
        args.api_key,
        args.max_request_bytes,
    )


if __name__ == "__main__":
    sys.exit(main())
