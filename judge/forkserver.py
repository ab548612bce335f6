"""A fork server for many short test runs (POSIX only).

Importing torch and the engine costs a test process seconds of CPU, most of a chapter's run. The
self-check and the mutation tool run the same tests dozens of times, and a learner's run reruns
failing exercises alone (judging._blame), so one server process imports them once and forks a
fresh child per run: the child is as new as a fresh process for everything that matters (learner
code, the swap, the tests and their modules are only imported after the fork) but starts in a
fraction of a second. Several children may run at once.

Protocol, one JSON line each way: the client sends {"id", "args", "env", "cwd", "output",
"threads"}; the server answers {"id", "pid"} once the child runs, then {"id", "exit"} when it has
ended (the answers of concurrent runs interleave).
"""

from __future__ import annotations

import gc
import importlib
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import threading
from typing import Dict, List, Tuple

from .parent_death import die_with_parent

BASE = [
    "pytest",
    "pytest_timeout",
    "judge.timer",
    "_pytest.python",
    "_pytest.assertion.rewrite",
    "judge.plugin",
    "judge.swap",
]
# What minisgl's tests import: the engine, and transformers for the Hugging Face references.
ENGINE = ["torch", "safetensors.torch", "tokenizers", "minisgl.llm", "minisgl.tiny_engine"]
REFERENCES = [
    "transformers",
    "transformers.models.qwen3.modeling_qwen3",
    "transformers.models.llama.modeling_llama",
]


def preload_for(modules: List[str], references: bool = True) -> List[str]:
    """Modules worth importing before forking, for runs whose targets live in `modules`.
    `references`: transformers too (the tests' Hugging Face references when their disk cache is
    cold; seconds to import, so not for a single learner run)."""
    heavy = (
        (ENGINE + (REFERENCES if references else []))
        if any(m.split(".")[0] == "minisgl" for m in modules)
        else []
    )
    # A Triton kernel module is imported in the child, never here: each @triton.jit reads
    # TRITON_INTERPRET when its module is imported, and whether a run interprets (CPU tensors) or
    # compiles is the child's to decide (tests/conftest.py). triton itself, the slow import, is
    # shared.
    kernels = [m for m in modules if m.rsplit(".", 1)[-1].startswith("triton_")]
    if kernels:
        heavy = heavy + ["triton"]
    return BASE + heavy + [m for m in modules if m not in heavy and m not in kernels]


def available() -> bool:
    return hasattr(os, "fork") and hasattr(os, "setsid")


def server_for(device: str, modules: List[str], references: bool = True) -> "ForkServer | None":
    """A started server for runs whose targets live in `modules`, or None where each run must be a
    plain subprocess: no fork here, or a GPU that a forked child could not use.

    On a GPU the server forks too: importing torch and the engine costs about 8 s there (the
    H200), as much as a chapter's tests. A child can use CUDA only if the server never initialised
    it (a CUDA context does not survive a fork), and whether importing the engine (Triton, the
    kernels) initialises it depends on library versions, so the server proves it before it says
    ready: a first child makes a CUDA tensor (`_cuda_usable_after_fork`)."""
    if not available():
        return None
    from .registry import REPO

    server = ForkServer(str(REPO), preload_for(modules, references), device)
    if not server.ready:
        server.close()
        return None
    return server


class _Run:
    def __init__(self) -> None:
        self.started = threading.Event()
        self.ended = threading.Event()
        self.pid: int | None = None
        self.code: int | None = None


class ForkServer:
    """The client side: one server process; runs may be started from several threads at once."""

    def __init__(self, repo: str, preload: List[str], device: str = "cpu") -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [repo] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        if device == "cpu":
            # as in its children (runner.py): triton, whichever preload imports it (transformers'
            # models do), jits its language's own helpers (tl.cdiv, ...) at import, and a CPU
            # child's interpreted kernels can call only interpreted ones
            env.setdefault("TRITON_INTERPRET", "1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "judge.forkserver", device, *preload],
            cwd=repo,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        self.ready = self.proc.stdout.readline().strip() == "ready"
        self.lock = threading.Lock()
        self.runs: Dict[int, _Run] = {}
        self.ids = itertools.count()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
                run = self.runs[msg["id"]]
            except (ValueError, KeyError, TypeError):
                continue
            if "pid" in msg:
                run.pid = msg["pid"]
                run.started.set()
            if "exit" in msg:
                run.code = msg["exit"]
                run.ended.set()
        self.ready = False  # the server is gone: every run still waiting ends
        for run in list(self.runs.values()):
            run.started.set()
            run.ended.set()

    def run(
        self,
        args: List[str],
        env: Dict[str, str],
        cwd: str,
        output: str,
        time_left: float,
        threads: int | None,
    ) -> Tuple[int | None, bool]:
        """Run `python -m pytest *args` in a forked child; returns (exit code, killed on time)."""
        run = _Run()
        with self.lock:
            rid = next(self.ids)
            self.runs[rid] = run
            request = {
                "id": rid,
                "args": args,
                "env": env,
                "cwd": cwd,
                "output": output,
                "threads": threads,
            }
            try:
                if not self.ready:
                    raise OSError("not running")
                self.proc.stdin.write(json.dumps(request) + "\n")
                self.proc.stdin.flush()
            except (OSError, ValueError) as e:  # the server died: the caller runs it plainly
                self.ready = False
                del self.runs[rid]
                raise RuntimeError(f"fork server unavailable: {e}") from None
        try:
            run.started.wait(60)
            if run.pid is None:
                raise RuntimeError("fork server unavailable: it ended")
            killed = not run.ended.wait(time_left)
            _kill_group(run.pid)  # on time, and whatever the child left behind
            if killed:
                run.ended.wait(10)
            return run.code, killed
        finally:
            if run.pid is not None and not run.ended.is_set():
                _kill_group(run.pid)  # interrupted (Ctrl-C): the child is in a session of its own
            with self.lock:
                self.runs.pop(rid, None)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, 9)
    except OSError:
        pass


def serve(device: str, preload: List[str]) -> None:
    # Ctrl-C in the terminal reaches the whole foreground group, this server too; its children
    # (sessions of their own) do not see it. The server must outlive it to kill them when its
    # client closes stdin, so the client alone decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:
            pass  # not installed here (e.g. no transformers): the child imports what it needs
    if "torch" in sys.modules and "minisgl" in sys.modules:
        # The engine's thread policy before the first fork, so every child starts with it
        # (inter-op threads can be set only once, before any parallel work).
        from minisgl.utils.threads import apply_thread_policy

        apply_thread_policy()
    gc.freeze()  # the preloaded objects: never collected again, and never copied by a child's gc
    if device != "cpu" and not _cuda_usable_after_fork(device):
        print("no: a forked child cannot use CUDA here", flush=True)
        return
    print("ready", flush=True)
    # One thread only (a fork copies no other thread, and no lock one of them might hold): poll
    # stdin for requests and reap ended children in turn. Answers go out with os.write.
    fd = sys.stdin.fileno()
    buf = b""
    children: Dict[int, object] = {}  # pid -> request id
    eof = False
    while not eof or children:
        if not eof:
            ready, _, _ = select.select([fd], [], [], 0.02 if children else None)
            if ready:
                chunk = os.read(fd, 65536)
                eof = not chunk
                buf += chunk
        elif children:
            select.select([], [], [], 0.02)
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            request = json.loads(line)
            server = os.getpid()
            pid = os.fork()
            if pid == 0:
                die_with_parent(server)  # before the child runs anything of the learner's
                _child(request)
            children[pid] = request.get("id")
            _answer({"id": request.get("id"), "pid": pid})
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid in children:
                _answer({"id": children.pop(pid), "exit": os.waitstatus_to_exitcode(status)})
        if eof:  # the client has gone: its runs are not wanted any more
            for pid in children:
                _kill_group(pid)


def _cuda_usable_after_fork(device: str) -> bool:
    """Whether a child forked from here can use the GPU (`device` "cuda", or "auto" where torch sees
    one). Asked of a child, since asking here (even `torch.cuda.is_available()`) initialises CUDA
    in this process and so breaks every later child."""
    if "torch" not in sys.modules:
        return True  # nothing imported that could have initialised CUDA: children start clean
    if sys.modules["torch"].cuda.is_initialized():
        return False
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import torch

            if device == "cuda" or torch.cuda.is_available():
                torch.ones(1, device="cuda").sum().item()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _answer(msg: Dict) -> None:
    data = (json.dumps(msg) + "\n").encode()
    while data:
        data = data[os.write(1, data) :]


def _child(request: Dict) -> None:
    code = 70
    try:
        os.setsid()  # its own process group, which the client kills on timeout
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh process
        out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.stdin = open(os.devnull)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.dont_write_bytecode = True
        for path in reversed(request["env"].get("PYTHONPATH", "").split(os.pathsep)):
            if path and path not in sys.path:
                sys.path.insert(0, path)
        if (
            request.get("threads") and "torch" in sys.modules
        ):  # preloaded: the env var is read too late
            sys.modules["torch"].set_num_threads(int(request["threads"]))
        if (
            "minisgl.env" in sys.modules
        ):  # preloaded: its switches were read with the server's environment
            sys.modules["minisgl.env"].ENV.reload()
        import pytest

        code = int(pytest.main(request["args"]))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
