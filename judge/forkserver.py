"""A fork server for the self-check's many short runs (POSIX only).

Importing torch and transformers costs a test process ~8 s of CPU, most of a chapter's run. The
self-check runs the same tests dozens of times (reference, each stub, each variant), so each worker
keeps one server process that has imported them once, and forks a fresh child per run: the child
is as new as a fresh process for everything that matters (learner code, the swap, the tests and
their modules are only imported after the fork) but starts in a fraction of a second.

Learners' own runs do not use it: they are one process each, and a plain subprocess is simplest.

Protocol, one JSON line each way: the client sends {"args", "env", "cwd", "output", "threads"};
the server answers {"pid": ...} once the child runs, then {"exit": code} when it has ended.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import subprocess
import sys
import threading
from typing import Dict, List, Tuple

BASE = ["pytest", "pytest_timeout", "_pytest.python", "_pytest.assertion.rewrite", "judge.plugin", "judge.swap"]
# What minisgl's tests import: the engine, and transformers for the Hugging Face references.
ENGINE = ["torch", "safetensors.torch", "tokenizers", "transformers",
          "transformers.models.qwen3.modeling_qwen3", "transformers.models.llama.modeling_llama",
          "minisgl.llm", "minisgl.tiny_engine"]


def preload_for(modules: List[str]) -> List[str]:
    """Modules worth importing before forking, for runs whose targets live in `modules`."""
    heavy = ENGINE if any(m.split(".")[0] == "minisgl" for m in modules) else []
    return BASE + heavy + [m for m in modules if m not in heavy]


def available() -> bool:
    return hasattr(os, "fork") and hasattr(os, "setsid")


class ForkServer:
    """The client side: one server process, one run at a time."""

    def __init__(self, repo: str, preload: List[str]) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([repo] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.proc = subprocess.Popen([sys.executable, "-m", "judge.forkserver", *preload], cwd=repo, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, bufsize=1)
        self.ready = self.proc.stdout.readline().strip() == "ready"
        self.lock = threading.Lock()

    def run(self, args: List[str], env: Dict[str, str], cwd: str, output: str, time_left: float,
            threads: int | None) -> Tuple[int | None, bool]:
        """Run `python -m pytest *args` in a forked child; returns (exit code, killed on time)."""
        with self.lock:
            request = {"args": args, "env": env, "cwd": cwd, "output": output, "threads": threads}
            try:
                self.proc.stdin.write(json.dumps(request) + "\n")
                self.proc.stdin.flush()
                pid = json.loads(self.proc.stdout.readline())["pid"]
            except (OSError, ValueError, KeyError) as e:  # the server died: the caller runs it plainly
                self.ready = False
                raise RuntimeError(f"fork server unavailable: {e}") from None
            killed = threading.Event()

            def kill() -> None:
                killed.set()
                try:
                    os.killpg(pid, 9)
                except OSError:
                    pass

            timer = threading.Timer(time_left, kill)
            timer.start()
            try:
                line = self.proc.stdout.readline()
            finally:
                timer.cancel()
            try:
                os.killpg(pid, 9)  # whatever the child left behind
            except OSError:
                pass
            code = json.loads(line)["exit"] if line else None
            return code, killed.is_set()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


def serve(preload: List[str]) -> None:
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:
            pass  # not installed here (e.g. no transformers): the child imports what it needs
    gc.freeze()  # the preloaded objects: never collected again, and never copied by a child's gc
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"exit": os.waitstatus_to_exitcode(status)}), flush=True)


def _child(request: Dict) -> None:
    code = 70
    try:
        os.setsid()  # its own process group, which the client kills on timeout
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
        if request.get("threads") and "torch" in sys.modules:  # preloaded: the env var is read too late
            sys.modules["torch"].set_num_threads(int(request["threads"]))
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
    serve(sys.argv[1:])
