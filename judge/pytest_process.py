"""One pytest process of a run: `build` writes its spec (protocol.RunSpec: what to swap, which tests
are done, the budgets) and puts together its command line and environment; `launch` starts it,
forked from the run's server when it has one, else as a fresh subprocess (child_process.py)."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

from . import budgets as budgets_file
from . import settings
from .child_process import file_tail, popen
from .protocol import RunSpec, UnitSpec
from .registry import REPO
from .run_results import RunOptions, RunResult, TestResult

SPEC_ENV = settings.SPEC.name  # the spec file's path, for the test process (plugin.py)


@dataclass
class Launch:
    """One pytest process, ready to start: its command line, environment and files."""

    cmd: List[str]
    env: Dict[str, str]
    results: Path  # where the process appends its events (protocol.py)
    output: Path  # where a forked process's output goes


def build(
    units: List[UnitSpec],
    test_files,
    options: RunOptions,
    tmp: Path,
    attempt: int,
    done: List[str],
    result: RunResult,
    shard: List[int],
    shared_timeouts: str,
) -> Launch:
    """Write the spec (what to swap, which tests are already done, the budgets) and put together the
    command line and environment of one pytest process."""
    results_path = tmp / f"results{attempt}.jsonl"
    spec_path = tmp / f"spec{attempt}.json"
    _write_spec(
        units, test_files, options, results_path, spec_path, done, result, shard, shared_timeouts
    )
    cmd = _pytest_command(test_files, options)
    env = _environment(options, spec_path)
    return Launch(cmd, env, results_path, tmp / f"output{attempt}.txt")


def _write_spec(
    units: List[UnitSpec],
    test_files,
    options: RunOptions,
    results_path: Path,
    spec_path: Path,
    done: List[str],
    result: RunResult,
    shard: List[int],
    shared_timeouts: str,
) -> None:
    test_dirs = sorted({str(Path(file_of(f)).resolve().parent) for f in test_files})
    spec = RunSpec(
        results=str(results_path),
        units=units,
        test_dirs=test_dirs,
        done=list(done),
        device=options.device,
        timed_out=_timed_out(result.tests, units),
        shard=shard,
        shared_timeouts=shared_timeouts,
        first_last=options.first_last,
    )
    if _timer_usable():
        data = options.budgets if options.budgets is not None else budgets_file.load()
        packages = (
            options.packages
            or sorted({e.target.split(".")[0] for u in units for e in u.exercises})
            or ["minisgl"]
        )
        spec.budget = budgets_file.Budgets(data, options.device, options.test_timeout).spec(
            packages
        )
    spec.write(spec_path)
    results_path.touch()


def _pytest_command(test_files, options: RunOptions) -> List[str]:
    files = [Path(file_of(f)).resolve() for f in test_files]
    # pytest names tests relative to its rootdir, and not at all outside it.
    rootdir = (
        REPO
        if all(_inside(f, REPO) for f in files)
        else Path(os.path.commonpath([f.parent for f in files]))
    )
    # no:unraisableexception: at exit it runs gc.collect() five times, seconds with torch loaded.
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "judge.plugin",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:unraisableexception",
        "-q",
        "--tb=no",
        "--show-capture=no",
        "--no-header",
        "-o",
        "console_output_style=classic",
        "--rootdir",
        str(rootdir),
        "-c",
        str(REPO / "pyproject.toml"),
    ]
    if _timer_usable():
        cmd += ["-p", "judge.timer"]  # budgets and the hard cap
    elif _has_pytest_timeout():  # no signals to interrupt a test with (Windows): the hard cap only
        cmd += [
            "-p",
            "pytest_timeout",
            f"--timeout={options.test_timeout:g}",
            f"--timeout-method={_timeout_method()}",
        ]
    repo_tests = (REPO / "tests").resolve()
    if any(f.parent == repo_tests for f in files):
        cmd += ["--device", options.device]  # the repo's conftest defines it
    if options.keyword:
        cmd += ["-k", options.keyword]
    if options.stop_at_first_failure:
        cmd += ["-x"]
    cmd += [str(f) for f in test_files]
    return cmd


def _environment(options: RunOptions, spec_path: Path) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(options.env)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the judge writes nothing into the learner's checkout
    env["PYTHONUNBUFFERED"] = "1"
    # Installed pytest plugins (nbval, benchmark, ...) cost seconds to import and judge nothing.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env[SPEC_ENV] = str(spec_path)
    env.setdefault("MINISGL_TEST_DEVICE", options.device)
    if options.device == "cpu":  # Triton kernels on CPU tensors run only in its interpreter
        env.setdefault("TRITON_INTERPRET", "1")
    if options.threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(options.threads)
    return env


def launch(process: Launch, options: RunOptions, time_left: float):
    """(exit code, killed on time, output tail): forked from the run's server when it has one, else
    a fresh subprocess."""
    if options.launcher is not None and options.launcher.ready:
        try:
            returncode, killed = options.launcher.run(
                process.cmd[3:],
                process.env,
                str(REPO),
                str(process.output),
                time_left,
                options.threads,
            )
            return returncode, killed, file_tail(process.output)
        except RuntimeError:
            pass  # the server is gone: start the process afresh
    return popen(process.cmd, process.env, time_left)


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def _timer_usable() -> bool:
    return hasattr(signal, "pthread_kill") and hasattr(signal, "SIGALRM")


def _timed_out(tests: List[TestResult], units: List[UnitSpec]) -> Dict[str, str]:
    """Exercise id -> the test it timed out in, from an earlier attempt (timer.py's rule: the
    exercise whose code was running, else every swapped exercise the test judges)."""
    from .registry import test_matches

    out: Dict[str, str] = {}
    for t in tests:
        if t.outcome != "timeout":
            continue
        ids = (
            [t.culprit]
            if t.culprit
            else [
                e.id
                for u in units
                for e in u.exercises
                if e.swap and any(test_matches(r, t.test) for r in e.tests)
            ]
        )
        for i in ids:
            out.setdefault(i, t.test)
    return out


def _has_pytest_timeout() -> bool:
    import importlib.util

    return importlib.util.find_spec("pytest_timeout") is not None


def file_of(selector: str | Path) -> str:
    return str(selector).split("::", 1)[0]


def _timeout_method() -> str:
    # signal: the timed-out test fails and the others still run; threads where there are no signals.
    return "signal" if hasattr(signal, "SIGALRM") else "thread"
