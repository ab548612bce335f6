"""A server in a subprocess, for tests and benchmarks: `with BackgroundServer() as url: ...`."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List, Sequence

READY = re.compile(r"^minisgl: serving (\S+) on (http://\S+)$")


SERVE = ("-m", "minisgl", "serve")


class BackgroundServer:
    """`python -m minisgl serve --port 0 ARGS` until it prints its ready line (a free port is picked
    by the server itself, so two runs never race for one). Its output is kept in `self.log`.
    `command`: what follows `python` in place of `-m minisgl serve`, for a command that ends by
    running it (`judge.py serve ch13`)."""

    def __init__(
        self,
        *args: str,
        timeout: float = 300.0,
        env: dict | None = None,
        command: Sequence[str] = SERVE,
    ) -> None:
        self.args, self.timeout, self.command = list(args), timeout, list(command)
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.log: List[str] = []

    def start(self) -> str:
        root = str(Path(__file__).resolve().parents[2])
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, self.env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, *self.command, "--port", "0", *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
            start_new_session=True,
        )
        ready = threading.Event()
        threading.Thread(target=self._read, args=(ready,), daemon=True).start()
        if not ready.wait(self.timeout) or not self.url:
            self.stop()
            raise RuntimeError("the server did not start:\n" + "".join(self.log[-20:]))
        return self.url

    def _read(self, ready: threading.Event) -> None:
        for line in self.proc.stdout:
            self.log.append(line)
            m = READY.match(line.strip())
            if m:
                self.url = m.group(2)
                ready.set()
        ready.set()  # the server exited

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, as a service manager would; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped, does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def wait_gone(pids: List[int], timeout: float) -> List[int]:
    """The pids still alive after up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)
