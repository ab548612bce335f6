"""The judge's test process as a child: started in a process group of its own, killed with the
whole group (also whatever the learner's code left running), its output drained by a thread that
keeps only the end of it. runner.py starts and reads it; this module knows nothing of pytest."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Dict, List

from .registry import REPO

OUTPUT_KEEP = 16_000  # bytes of the subprocess's output kept (its end)


def popen(cmd: List[str], env: Dict[str, str], time_left: float):
    """(exit code, killed on time, output tail) of a fresh subprocess in its own process group."""
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=(os.name == "posix"),
    )
    tail = Tail(proc.stdout)
    killed = False
    try:
        proc.wait(timeout=time_left)
    except subprocess.TimeoutExpired:
        killed = True
    finally:
        kill_group(proc)  # also any children the learner's code left behind
        proc.wait()
        tail.join()
    return proc.returncode, killed, tail.text()


def file_tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - OUTPUT_KEEP))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return (
        (f"[... {size - OUTPUT_KEEP} bytes of output cut ...]\n" + data)
        if size > OUTPUT_KEEP
        else data
    )


# Why a test process's exit status never came back: the fork server that started it, its parent,
# reaps it and reports the status; only the tests and the learner's code run in that process, so
# they killed it (judge/grading/run.py reads these words in a judge's verdict).
SUPERVISOR_LOST = (
    "unknown status: the judge's fork server, this test process's parent, was killed while it "
    "ran; only the tests and the learner's code run in the test processes"
)


def exit_reason(code: int | None) -> str:
    """How a test process ended, for a message; None: its end was never reported."""
    if code is None:
        return SUPERVISOR_LOST
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}" + (" - out of memory?" if name == "SIGKILL" else "")
    return f"exit status {code}: os._exit() or a crash"


def kill_group(proc: subprocess.Popen) -> None:
    try:
        if os.name == "posix":
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except (ProcessLookupError, PermissionError, OSError):
        pass


class Tail:
    """Drains a pipe in a thread, keeping only its last OUTPUT_KEEP bytes (output can be huge)."""

    def __init__(self, pipe) -> None:
        self.pipe = pipe
        self.buf = bytearray()
        self.total = 0
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        for chunk in iter(
            lambda: (
                self.pipe.read1(65536) if hasattr(self.pipe, "read1") else self.pipe.read(65536)
            ),
            b"",
        ):
            self.total += len(chunk)
            self.buf += chunk
            if len(self.buf) > 2 * OUTPUT_KEEP:
                del self.buf[: len(self.buf) - OUTPUT_KEEP]

    def join(self) -> None:
        self.thread.join(timeout=5)
        try:
            self.pipe.close()
        except OSError:
            pass

    def text(self) -> str:
        data = bytes(self.buf[-OUTPUT_KEEP:]).decode("utf-8", errors="replace")
        return (
            (f"[... {self.total - OUTPUT_KEEP} bytes of output cut ...]\n" + data)
            if self.total > OUTPUT_KEEP
            else data
        )
