"""Run a plan of shell stages at once where the machine's cores allow (CI's `.ci/stages.py`).

Each stage is a shell command with the stages it must wait for and the cores it keeps busy; it
starts as soon as the stages it waits for have passed and there is room for it, in two lanes:

- a stage that spreads its work over the machine (`cores=None`, `--workers {cores}` in its
  command) is granted every core, one such stage at a time;
- stages that keep a core or two busy (one pytest process, one notebook kernel) run beside it,
  sharing half the cores (at least one) among themselves.

The machine is thus asked for up to one and a half times its cores: a spreading stage does not
keep every core busy all the time (start-up, its last few jobs, waits on its servers), nor does a
one-core stage its core (the CPU seconds in the table at the end tell by how much), and the side
lane fills those gaps instead of waiting for them. Standard library only.

- Each stage's output goes to its own log (`build/ci/NAME.log`), printed whole, not interleaved,
  when the stage ends.
- The log says when each stage starts and ends and how long CI has run (the stamps), a line every
  few minutes names what is still running, and a table at the end gives each stage's start, wall
  time, cores and CPU seconds: where the minutes go.
- A failed stage fails the run (exit 1); the stages that wait for it are not run, the others are.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

HEARTBEAT_S = 300.0


def machine_cores() -> int:
    """The cores this process may use: its CPU affinity where the system has one (a container's
    limit), else every core."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Stage:
    name: str  # one word: its log is build/ci/NAME.log
    command: str  # bash; `{cores}` is replaced by the cores this stage was granted
    what: str = ""  # one line for the log: what the stage proves
    after: Sequence[str] = ()  # stages that must pass first
    cores: Optional[int] = 1  # cores it keeps busy; None: it spreads over all the machine has


@dataclass
class Running:
    stage: Stage
    cores: int
    process: subprocess.Popen
    started: float


def check_plan(stages: Sequence[Stage]) -> None:
    """Refuse a plan the runner cannot follow, naming the stage: a name used twice, a stage that
    waits for one not listed before it (which also rules out a cycle), a bad core count."""
    seen: set = set()
    for s in stages:
        if not s.name.isidentifier():
            raise ValueError(f"stage name {s.name!r} must be one word (it names its log file)")
        if s.name in seen:
            raise ValueError(f"stage {s.name!r} is listed twice")
        unknown = [a for a in s.after if a not in seen]
        if unknown:
            raise ValueError(
                f"stage {s.name!r} waits for {', '.join(map(repr, unknown))}, "
                "which must be listed before it"
            )
        if s.cores is not None and s.cores < 1:
            raise ValueError(f"stage {s.name!r} asks for {s.cores} cores: at least 1, or None")
        seen.add(s.name)


class Runner:
    def __init__(self, stages: Sequence[Stage], cores: int, log_dir: Path) -> None:
        check_plan(stages)
        self.stages = list(stages)
        self.cores = max(1, cores)
        self.log_dir = log_dir
        self.t0 = time.monotonic()
        self.waiting: List[Stage] = list(stages)
        self.running: Dict[str, Running] = {}
        # name -> (outcome, start offset, wall seconds, cores granted, CPU seconds)
        self.results: Dict[str, tuple] = {}

    # ------------------------------------------------------------------ the log
    def stamp(self, text: str) -> None:
        now = time.strftime("%H:%M:%S", time.gmtime())
        print(f"== [{now}, {time.monotonic() - self.t0:.0f} s in] {text}", flush=True)

    def log_path(self, stage: Stage) -> Path:
        return self.log_dir / f"{stage.name}.log"

    # ------------------------------------------------------------------ scheduling
    def granted(self, stage: Stage) -> int:
        return self.cores if stage.cores is None else min(stage.cores, self.cores)

    def side_lane(self) -> int:
        """The cores the stages that do not spread share beside the one that does: half, or all
        once no spreading stage is left to run."""
        spreading = [s for s in self.waiting if s.cores is None] + [
            r for r in self.running.values() if r.stage.cores is None
        ]
        return max(1, self.cores // 2) if spreading else self.cores

    def fits(self, stage: Stage, cores: int) -> bool:
        if not self.running:
            return True  # whatever it asks for, a stage alone runs
        if stage.cores is None:
            return all(r.stage.cores is not None for r in self.running.values())
        beside = sum(r.cores for r in self.running.values() if r.stage.cores is not None)
        return beside + cores <= self.side_lane()

    def ready(self, stage: Stage) -> Optional[bool]:
        """True: may start; False: wait; None: never (a stage it waits for did not pass)."""
        outcomes = [self.results.get(a, (None,))[0] for a in stage.after]
        if any(o not in (None, "passed") for o in outcomes):
            return None
        return all(o == "passed" for o in outcomes)

    def start_what_fits(self) -> None:
        for stage in list(self.waiting):
            ready = self.ready(stage)
            if ready is None:
                self.waiting.remove(stage)
                blocked = [a for a in stage.after if self.results[a][0] != "passed"]
                self.results[stage.name] = ("not run", None, 0.0, 0, None)
                self.stamp(f"{stage.name}: not run, it waits for {', '.join(blocked)}")
                continue
            cores = self.granted(stage)
            # plan order, but a later stage that fits now goes first: nothing idles
            if ready and self.fits(stage, cores):
                self.waiting.remove(stage)
                self.launch(stage, cores)

    def launch(self, stage: Stage, cores: int) -> None:
        command = stage.command.replace("{cores}", str(cores))
        self.stamp(f"start {stage.name} ({cores} of {self.cores} cores): {stage.what or command}")
        log = open(self.log_path(stage), "w", encoding="utf-8")
        log.write(f"$ {command}\n")
        log.flush()
        process = subprocess.Popen(
            ["bash", "-c", command],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stopped whole on an interrupt
        )
        log.close()
        self.running[stage.name] = Running(stage, cores, process, time.monotonic())

    def reap(self) -> None:
        for name, r in list(self.running.items()):
            ended = _ended(r.process)
            if ended is None:
                continue
            code, cpu = ended
            del self.running[name]
            wall = time.monotonic() - r.started
            outcome = "passed" if code == 0 else f"FAILED (exit {code})"
            self.results[name] = (outcome, r.started - self.t0, wall, r.cores, cpu)
            busy = f", {cpu:.0f} CPU s" if cpu is not None else ""
            self.show_log(r.stage, f"{name} {outcome} in {wall:.0f} s{busy}")

    def show_log(self, stage: Stage, headline: str) -> None:
        self.stamp(f"{headline}; its log ({self.log_path(stage)}):")
        text = self.log_path(stage).read_text(encoding="utf-8", errors="replace")
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
        print(f"== end of {stage.name}'s log", flush=True)

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.stamp(
            f"{len(self.stages)} stages on {self.cores} cores: "
            + ", ".join(
                s.name + (f" (after {', '.join(s.after)})" if s.after else "") for s in self.stages
            )
        )
        beat = time.monotonic()
        try:
            while self.waiting or self.running:
                self.start_what_fits()
                time.sleep(0.5)
                self.reap()
                if time.monotonic() - beat >= HEARTBEAT_S and self.running:
                    beat = time.monotonic()
                    self.stamp("still running: " + ", ".join(self.running))
        except BaseException:  # an interrupt (or a bug here): leave no stage running
            self.stop_all()
            raise
        return self.summary()

    def stop_all(self) -> None:
        for r in self.running.values():
            try:
                os.killpg(r.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def summary(self) -> int:
        self.stamp("stages, in the order they started:")
        rows = sorted(self.results.items(), key=lambda kv: (kv[1][1] is None, kv[1][1] or 0))
        for name, (outcome, start, wall, cores, cpu) in rows:
            when = "-" if start is None else f"{start:5.0f} s"
            busy = "-" if cpu is None else f"{cpu:5.0f} s"
            print(
                f"   {name:<12} start {when:>7}  wall {wall:5.0f} s  cores {cores}  "
                f"CPU {busy:>7}  {outcome}"
            )
        print("   (CPU: user + system time of the stage's processes that were waited for)")
        bad = [n for n, r in self.results.items() if r[0] != "passed"]
        self.stamp(f"FAILED: {', '.join(bad)}" if bad else "every stage passed")
        return 1 if bad else 0


def _ended(process: subprocess.Popen) -> Optional[tuple]:
    """(exit code, CPU seconds of the process and the children it waited for) once it has ended,
    else None. The CPU time tells how many cores a stage really keeps busy (None where the system
    has no wait4)."""
    if not hasattr(os, "wait4"):
        code = process.poll()
        return None if code is None else (code, None)
    pid, status, usage = os.wait4(process.pid, os.WNOHANG)
    if pid == 0:
        return None
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_utime + usage.ru_stime


def main(stages: Sequence[Stage], argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--cores",
        type=int,
        default=machine_cores(),
        help="cores to share among the stages (default: all the machine has)",
    )
    p.add_argument("--log-dir", type=Path, default=Path("build/ci"))
    p.add_argument("--only", nargs="+", metavar="STAGE", help="run only these stages")
    args = p.parse_args(argv)
    if args.only:
        unknown = set(args.only) - {s.name for s in stages}
        if unknown:
            p.error(f"no stage named {', '.join(sorted(unknown))}")
        stages = [
            Stage(s.name, s.command, s.what, [a for a in s.after if a in args.only], s.cores)
            for s in stages
            if s.name in args.only
        ]
    if args.cores < 1:
        p.error(f"--cores must be at least 1, got {args.cores}")
    return Runner(stages, args.cores, args.log_dir).run()
