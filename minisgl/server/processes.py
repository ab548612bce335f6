"""The two worker processes the API server starts: the scheduler and the tokenizer worker.

Each reports on `ready` once it can serve ("ready", name) or why it cannot ("error", name,
message). Ctrl-C in a terminal reaches every process of the group; the workers ignore it and let the
API server stop them in order. A worker whose API server is gone exits by itself (ParentWatch).
"""

from __future__ import annotations

import signal
import sys
import traceback
from collections import Counter
from typing import TYPE_CHECKING, Any, Dict

from .args import ServerArgs

if TYPE_CHECKING:
    from minisgl.models.limits import ModelLimits


def run_scheduler(args: ServerArgs, ready) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not _server_init(ready, "scheduler"):
        return
    import zmq

    from minisgl.scheduler import Scheduler, SchedulerConfig

    from .sockets import ZmqSchedulerIO

    try:
        io = ZmqSchedulerIO(zmq.Context(), args.scheduler_addr, args.tokenizer_addr)
        config = SchedulerConfig(model_path=args.model, **args.engine)
        if config.tp_size > 1:  # this process is rank 0; it starts the others (llm/parallel.py)
            from minisgl.llm.parallel import TensorParallelScheduler as Scheduler  # noqa: N814
        scheduler = Scheduler(config, io)
        counts = Counter()  # aborts by the state they found the request in, and refusals
        scheduler.events.subscribe(
            lambda e: (
                counts.update(
                    [f"abort_{e['state'].replace(' ', '_')}" if e.kind == "abort" else "reject"]
                )
                if e.kind in ("abort", "reject")
                else None
            )
        )
        # prompt tokens the prefill batches computed (a cached prefix is not): a router's benefit
        # (minisgl/router) is read as this count's drop across the workers
        prefill = Counter()
        scheduler.events.subscribe(
            lambda e: (
                prefill.update(prefill_tokens=sum(e["extend_lens"]))
                if e.kind == "launch" and e["phase"] == "prefill"
                else None
            )
        )
        io.stats = lambda: {
            **scheduler_stats(scheduler),
            "prefill_tokens": prefill["prefill_tokens"],
            **counts,
        }
    except Exception as e:  # a bad model directory or option: say so, do not hang the launcher
        ready.put(("error", "scheduler", f"{type(e).__name__}: {e}"))
        return
    ready.put(("ready", "scheduler"))
    try:
        while True:
            scheduler.step()
    except SystemExit:
        raise
    except BaseException:
        # The API server notices the exit and answers every request in flight with a 500.
        traceback.print_exc()
        sys.exit(1)


def _server_init(ready, name: str) -> bool:
    """Run MINISGL_SERVER_INIT's hook (init.py); a failure is this worker's reason not to start."""
    from .init import run_server_init

    try:
        run_server_init()
    except Exception as e:
        ready.put(("error", name, f"MINISGL_SERVER_INIT failed: {type(e).__name__}: {e}"))
        return False
    return True


def scheduler_stats(scheduler) -> Dict[str, Any]:
    """Slots and pages in use, for /debug/scheduler. `idle_integrity` is "ok" or what is wrong with
    the KV pool when nothing runs (CacheManager.check_integrity), None while requests run."""
    cache, table = scheduler.cache_manager, scheduler.table_manager
    running, queued = len(scheduler.live_requests()), len(scheduler.prefill_manager.pending)
    integrity = None
    if running == 0 and queued == 0 and not scheduler.in_flight:
        try:
            cache.check_integrity()
            integrity = "ok"
        except AssertionError as e:
            integrity = str(e)
    return {
        "slots_total": table.capacity,
        "slots_free": table.available_size,
        "pages_total": cache.num_pages,
        "pages_free": cache.num_free_pages,
        "pages_available": cache.available_pages,
        "running": running,
        "queued": queued,
        "in_flight": scheduler.in_flight,
        "idle_integrity": integrity,
    }


def run_tokenizer(args: ServerArgs, limits: ModelLimits, ready) -> None:
    """`limits`: the model's, resolved by the launcher (ModelLimits, as the engine has them)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not _server_init(ready, "tokenizer"):
        return
    import zmq

    from minisgl.models.tokenizer import load_tokenizer
    from minisgl.utils.threads import apply_thread_policy

    from .chat import load_chat_template
    from .sockets import POLL_MS, Inbox, Outbox, ParentWatch
    from .tokenizer_worker import TokenizerWorker

    apply_thread_policy()  # the scheduler's Engine applies it for its own process
    try:
        worker = TokenizerWorker(
            load_tokenizer(args.model),
            load_chat_template(args.model),
            limits.end_token_ids,
            limits.context_len,
        )
        ctx = zmq.Context()
        inbox = Inbox(ctx, args.tokenizer_addr)
        to_scheduler, to_api = Outbox(ctx, args.scheduler_addr), Outbox(ctx, args.api_addr)
    except Exception as e:
        ready.put(("error", "tokenizer", f"{type(e).__name__}: {e}"))
        return
    ready.put(("ready", "tokenizer"))
    parent = ParentWatch()
    while True:
        parent.check()
        msgs = inbox.drain(POLL_MS)
        if msgs:
            for_scheduler, for_api = worker.handle(msgs)
            to_scheduler.send(for_scheduler)
            to_api.send(for_api)
