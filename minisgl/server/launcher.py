"""`python -m minisgl serve`: start the scheduler and the tokenizer worker, then serve HTTP.

    API server (this process: FastAPI on uvicorn)
        --> tokenizer worker (text -> ids, ids -> text)  --> scheduler (the engine)
        <--------------------------------------------------
    over ZMQ PUSH/PULL sockets in a temporary directory.

The workers are spawned (not forked: a forked CUDA context is unusable). The server prints one line
when it is ready (`minisgl: serving MODEL on http://HOST:PORT`). On Ctrl-C or SIGTERM uvicorn
stops, and then the workers are stopped; a worker whose server is killed outright exits by itself.
A watchdog notices a worker that dies while serving: requests in flight get a 500, /health a 503.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import shutil
import signal
import socket
import sys
import tempfile
from typing import TYPE_CHECKING, Callable, List, Tuple

from .args import ServerArgs

if TYPE_CHECKING:
    from minisgl.models.limits import ModelLimits

READY_TIMEOUT_S = 600  # loading a large checkpoint onto a GPU can take minutes
WATCH_S = 0.2


def start_workers(args: ServerArgs) -> Tuple[List[mp.Process], "ModelLimits"]:
    """Spawn the scheduler and the tokenizer worker; return them and the model's limits once both
    are ready, or raise RuntimeError saying which could not start and why (and stop the other)."""
    from minisgl.models.limits import ModelLimits

    from . import processes

    # What the model allows a request (context length, end ids, sampling defaults), resolved once
    # here as the engine resolves it, and handed to the tokenizer worker.
    try:
        limits = ModelLimits.from_dir(args.model, args.engine.get("max_seq_len_override"))
    except (OSError, TypeError, ValueError) as e:
        raise RuntimeError(f"the server could not start: {e}") from None
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    procs = [
        ctx.Process(
            target=processes.run_scheduler,
            args=(args, ready),
            name="minisgl-scheduler",
            # a daemon may not start processes: with tensor parallelism the scheduler is rank 0
            # and starts the others (they end with it: their sockets to it close)
            daemon=args.engine.get("tp_size", 1) == 1,
        ),
        ctx.Process(
            target=processes.run_tokenizer,
            args=(args, limits, ready),
            name="minisgl-tokenizer",
            daemon=True,
        ),
    ]
    for p in procs:
        p.start()
    waiting = {"scheduler", "tokenizer"}
    try:
        while waiting:
            try:
                status, name, *rest = ready.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in procs if p.exitcode is not None]
                if dead:
                    raise RuntimeError(
                        f"{dead[0].name} exited with code {dead[0].exitcode} while starting"
                    )
                continue
            if status == "error":
                raise RuntimeError(f"the {name} could not start: {rest[0]}")
            waiting.discard(name)
    except BaseException:
        stop_workers(procs)
        raise
    return procs, limits


def stop_workers(procs: List[mp.Process], timeout: float = 5.0) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()


async def watch(procs: List[mp.Process], frontend, stopping: Callable[[], bool]) -> None:
    """Fail the frontend as soon as a worker process has died, unless the server is stopping.

    A dead worker takes its requests with it: without this, their clients would wait forever, and
    /health would keep saying ok.

    Receives: `procs`, the worker processes (`name`; `exitcode` None while alive); `frontend`, with
        `failure` (None while it serves) and `fail(reason)`; `stopping()`, True once the server has
        begun to stop (a SIGTERM or Ctrl-C to the process group reaches the workers too).
    Returns: (a coroutine, run beside the app) once it has failed the frontend, found the server
        stopping, or found the frontend failed already.
    Leaves: `frontend.fail(reason)` called once, the reason naming the dead worker and its exit
        code, unless the server is stopping; a line on stderr saying so.
    Uses: `asyncio.sleep(WATCH_S)` between looks, and once more before deciding: the signal that
        ended the worker may be reaching this process at the same moment.
    Checked: a worker that dies fails the frontend, naming it and its exit code; one that dies while
        the server stops does not; nothing happens while all live; in a live server, a scheduler
        killed mid-stream gives its client an error and /health a 503.
    """
    while frontend.failure is None:
        dead = next((p for p in procs if p.exitcode is not None), None)
        if dead is not None:
            await asyncio.sleep(WATCH_S)  # the same signal may be reaching this process now
            if stopping():
                return
            frontend.fail(f"{dead.name} exited with code {dead.exitcode}")
            print(
                f"minisgl: {dead.name} died (exit code {dead.exitcode}); /health is now 503",
                file=sys.stderr,
                flush=True,
            )
            return
        await asyncio.sleep(WATCH_S)


def bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def serve(args: ServerArgs, log_level: str = "warning") -> int:
    try:  # the server's own packages (pyproject.toml); the offline engine needs none of them
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn
        import zmq  # noqa: F401
    except ImportError as e:
        print(
            f"minisgl: the server needs fastapi, uvicorn, pyzmq and prometheus_client ({e}); "
            "pip install -e . installs them",
            file=sys.stderr,
            flush=True,
        )
        return 1

    from .init import run_server_init

    try:
        run_server_init()  # before the app is built: it may put other functions in place
    except Exception as e:
        print(f"minisgl: MINISGL_SERVER_INIT failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    from .app import create_app
    from .frontend import Frontend
    from .sglang_routes import install_sglang_routes
    from .token_routes import PromptTokenizer

    try:
        sock = bind(args.host, args.port)  # first: a port in use fails before any model is loaded
    except OSError as e:
        print(
            f"minisgl: cannot listen on {args.host}:{args.port}: {e.strerror or e}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    args.ipc_dir = tempfile.mkdtemp(prefix="minisgl-")
    procs: List[mp.Process] = []
    try:
        try:
            procs, limits = start_workers(args)
        except RuntimeError as e:
            print(f"minisgl: {e}", file=sys.stderr, flush=True)
            return 1
        frontend = Frontend(args.api_addr, args.tokenizer_addr)
        server: uvicorn.Server | None = None

        def background_tasks():  # started with the app, in its event loop
            return [frontend.listen(), watch(procs, frontend, lambda: server.should_exit)]

        workers = {p.name.removeprefix("minisgl-"): p.pid for p in procs}
        app = create_app(
            frontend,
            args.model_name,
            background_tasks,
            workers,
            api_key=args.api_key,
            tokenizer=PromptTokenizer(args.model, limits.context_len),
            stopping=lambda: server.should_exit,
            max_request_bytes=args.max_request_bytes,
        )
        install_sglang_routes(
            app, args.model, args.model_name, args.engine.get("tp_size", 1)
        )  # for SGLang's router
        server = uvicorn.Server(
            uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=2)
        )
        host, port = sock.getsockname()[:2]
        print(f"minisgl: serving {args.model_name} on http://{host}:{port}", flush=True)
        # uvicorn handles SIGINT/SIGTERM itself, then raises the signal again once it has stopped,
        # which by default would end this process before the workers are stopped: swallow that one.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
        server.run(sockets=[sock])
        frontend.close()
        return 0
    finally:
        stop_workers(procs)
        sock.close()
        shutil.rmtree(args.ipc_dir, ignore_errors=True)
