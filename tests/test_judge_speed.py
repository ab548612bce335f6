"""Fast verdicts whatever the learner's code does: per-test time budgets from the reference's
measured times (judge/budgets.py, judge/timer.py), an exercise that timed out is not run again,
and blame reruns only where they can change the verdict (judge/judging.py), forked from one
server (judge/forkserver.py).

A fake chapter, ch44, is added to the fake project of judge_fixtures.py: a tiny "engine" package
module whose `run` calls `step`, and a budgets file with small numbers, so each judged run takes
about a second. Nothing here asserts a wall-clock time: only what the verdict says."""

from __future__ import annotations

import contextlib
import json
import re
import textwrap
import threading
from pathlib import Path

import pytest

from judge.cli import main
from judge_fixtures import fake_project

ENGINE = '''
import os
import time


STARTED = []


class Engine:
    def step(self, x: int) -> int:
        """One step of the fake engine."""
        if not STARTED:  # a process's one-off start, as a GPU's first engine (FAKE_START seconds)
            STARTED.append(1)
            end = time.process_time() + float(os.environ.get("FAKE_START", "0"))
            while time.process_time() < end:
                pass
        # slow in a stale budget's test: it computes (CPU time is what budgets count)
        end = time.process_time() + float(os.environ.get("FAKE_STEP_SLEEP", "0"))
        while time.process_time() < end:
            pass
        return x + 1

    def run(self, n: int) -> int:
        """n steps."""
        x = 0
        for _ in range(n):
            x = self.step(x)
        return x

    def twice(self, x: int) -> int:
        """Two steps."""
        return self.step(self.step(x))
'''

TESTS = """
import time

from fakepkg.engine import Engine


def test_step():
    assert Engine().step(1) == 2, "step(1) should be 2"


def test_run_ten():
    assert Engine().run(10) == 10, "run(10) should be 10"


def test_run_twenty():
    assert Engine().run(20) == 20, "run(20) should be 20"


def test_twice():
    assert Engine().twice(0) == 2, "twice(0) should be 2"


def test_the_tests_own_slow_work():
    time.sleep(0.8)  # like computing a Hugging Face reference: not the engine's time
    assert Engine().run(3) == 3, "run(3) should be 3"
"""

REGISTRY = """

[ch44]
title = "A fake engine"
test_files = ["fake_tests/test_speed.py"]

[[ch44.exercises]]
name = "step"
target = "fakepkg.engine:Engine.step"
tests = ["test_speed.py::test_step", "test_speed.py::test_run_ten",
         "test_speed.py::test_run_twenty", "test_speed.py::test_twice",
         "test_speed.py::test_the_tests_own_slow_work"]

[[ch44.exercises]]
name = "run"
target = "fakepkg.engine:Engine.run"
tests = ["test_speed.py::test_run_ten", "test_speed.py::test_run_twenty",
         "test_speed.py::test_the_tests_own_slow_work"]

[[ch44.exercises]]
name = "twice"
target = "fakepkg.engine:Engine.twice"
tests = ["test_speed.py::test_twice"]
"""

# Small numbers, so that a hang costs a fraction of a second: budget = max(0.3, 2 x measured).
# the slow one: the default
BUDGETS = {
    "floor": {"cpu": 0.3},
    "factor": 2,
    "default": {"cpu": 0.5},
    "wait": 1.0,  # wall seconds blocked in the learner's code
    "times": {
        "cpu": {
            "test_speed.py::test_step": 0.01,
            "test_speed.py::test_run_ten": 0.01,
            "test_speed.py::test_run_twenty": 0.01,
            "test_speed.py::test_twice": 0.01,
        }
    },
}

STEP = "def step(self, x):\n    return x + 1\n"
RUN = (
    "def run(self, n):\n    x = 0\n    for _ in range(n):\n        x = self.step(x)\n    return x\n"
)
HANG = "def step(self, x):\n    while True:\n        x += 1\n"
BLOCKS = "import threading\n\ndef step(self, x):\n    threading.Event().wait()\n    return x + 1\n"
TWICE = "def twice(self, x):\n    return self.step(self.step(x))\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    # one test process, as on a one-core machine: the tests below count timeouts and reruns of
    # one process; the sharded run has tests of its own (test_a_sharded_run_...)
    monkeypatch.setenv("MINISGL_JUDGE_JOBS", "1")
    p = fake_project(tmp_path, monkeypatch)
    (tmp_path / "fakepkg" / "engine.py").write_text(ENGINE)
    (tmp_path / "fake_tests" / "test_speed.py").write_text(TESTS)
    with open(tmp_path / "registry.toml", "a") as f:
        f.write(REGISTRY)
    # beside the registry, as judge/budgets.json
    (tmp_path / "budgets.json").write_text(json.dumps(BUDGETS))
    return p


def judge_file(project, capsys, source: str, *argv):
    mine = project.write("mine.py", textwrap.dedent(source))
    code = main(["ch44", "--file", str(mine), "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def by_test(verdict):
    return {t["test"].split("::")[-1]: t for t in verdict["tests"]}


def by_exercise(verdict):
    return {e["name"]: e for e in verdict["exercises"]}


def test_a_hang_is_a_timeout_at_the_budget_naming_the_learners_line(project, capsys):
    code, v = judge_file(project, capsys, HANG)
    assert code == 1
    hung = by_test(v)["test_step"]
    assert hung["outcome"] == "timeout", (
        f"an endless loop should be a timeout, got {hung['outcome']}"
    )
    # the budget from the file (max(floor 0.3 s, 2 x 0.01 s)), not the 60 s hard cap
    assert "time budget of 0.3 s" in hung["message"], (
        f"the budget used is not named: {hung['message']}"
    )
    # the loop's own lines (2: `while True:`, 3: its body): where it was spinning when stopped
    assert re.search(r"mine\.py, line [23], in step", hung["where"] or ""), (
        f"the spinning line is not named: {hung['where']}"
    )


def test_code_that_blocks_is_stopped_at_the_wait_budget_not_the_hard_cap(project, capsys):
    """A wait that never ends (a recv, a get with no timeout) spends no CPU: the CPU budget would
    never stop it, only the minute of the hard cap."""
    code, v = judge_file(project, capsys, BLOCKS)
    hung = by_test(v)["test_step"]
    assert hung["outcome"] == "timeout" and hung["message"].startswith(
        "the test waited over 1 s in your code without computing"
    ), f"{hung['outcome']}: {hung['message']}"
    assert re.search(r"mine\.py, line 4, in step", hung["where"] or ""), hung["where"]
    assert v["counts"].get("timeout") == 1 and by_exercise(v)["step"]["status"] == "failing"


def test_an_exercise_that_timed_out_is_not_run_again(project, capsys):
    code, v = judge_file(project, capsys, HANG)
    tests = by_test(v)
    for name in ("test_run_ten", "test_run_twenty", "test_twice", "test_the_tests_own_slow_work"):
        assert (
            tests[name]["outcome"] != "passed"
            and tests[name]["message"] == "not run: step already timed out in test_step"
        ), f"{name}: {tests[name]['outcome']}, {tests[name]['message']}"
    assert v["counts"].get("timeout") == 1, f"one timeout expected, got {v['counts']}"
    assert by_exercise(v)["step"]["status"] == "failing"


WRONG_TWICE = "def twice(self, x):\n    return self.step(x) * 3\n"


def _outcomes(verdict):
    return (
        [(t["test"], t["outcome"], t["message"], t["where"]) for t in verdict["tests"]],
        {e["name"]: e["status"] for e in verdict["exercises"]},
    )


@pytest.mark.parametrize("jobs", ["2", "3", "7"])
def test_a_sharded_run_gives_the_one_process_verdict(project, capsys, jobs):
    """The tests split over processes (judge/shards.py), each run once, merged in their order."""
    source = STEP + RUN + WRONG_TWICE
    one = judge_file(project, capsys, source, "--jobs", "1")
    shared = judge_file(project, capsys, source, "--jobs", jobs)
    assert one[0] == shared[0] == 1
    assert _outcomes(shared[1]) == _outcomes(one[1])
    assert by_exercise(one[1])["twice"]["status"] == "failing"  # a verdict worth comparing


def test_a_sharded_run_does_not_run_a_hung_exercise_again_in_its_share(project, capsys):
    code, v = judge_file(project, capsys, HANG, "--jobs", "2")
    assert code == 1 and by_exercise(v)["step"]["status"] == "failing"
    tests = by_test(v)
    assert len(tests) == 5 and not any(t["outcome"] == "passed" for t in tests.values())
    timeouts = [n for n, t in tests.items() if t["outcome"] == "timeout"]
    assert 1 <= len(timeouts) <= 2, f"at most one timeout a share, got {timeouts}"
    for name, t in tests.items():
        assert name in timeouts or t["message"].startswith("not run: step already timed out"), t


def test_time_outside_the_engine_does_not_count_against_the_budget(project, capsys):
    # test_the_tests_own_slow_work sleeps 0.8 s, over its budget (the default, 0.5 s), but in the
    # test itself, not in the engine
    code, v = judge_file(project, capsys, STEP + "\n\n" + RUN)
    slow = by_test(v)["test_the_tests_own_slow_work"]
    assert slow["outcome"] == "passed", (
        f"the test's own work was held against the budget: {slow['message']}"
    )
    assert code == 0


def test_a_test_without_a_measured_time_gets_the_default_budget(project, capsys, tmp_path):
    budgets = json.loads((tmp_path / "budgets.json").read_text())
    # as for a test added since the last measurement
    del budgets["times"]["cpu"]["test_speed.py::test_step"]
    (tmp_path / "budgets.json").write_text(json.dumps(budgets))
    code, v = judge_file(project, capsys, HANG)
    hung = by_test(v)["test_step"]
    assert hung["outcome"] == "timeout" and "time budget of 0.5 s" in hung["message"], (
        f"expected the default budget of 0.5 s, got: {hung['outcome']}, {hung['message']}"
    )


def test_only_the_first_test_a_process_runs_gets_its_start_on_top_of_the_budget(
    project, capsys, tmp_path
):
    budgets = json.loads((tmp_path / "budgets.json").read_text())
    budgets["first_test"] = {"cpu": {"test_speed.py": 0.4}}
    (tmp_path / "budgets.json").write_text(json.dumps(budgets))
    hung = by_test(judge_file(project, capsys, HANG)[1])["test_step"]  # the first test
    assert hung["outcome"] == "timeout" and "time budget of 0.7 s" in hung["message"], (
        f"the first test's budget should be 0.3 s + the start's 0.4 s: {hung['message']}"
    )
    endless_twice = "def twice(self, x):\n    while True:\n        x += 1\n"
    hung = by_test(judge_file(project, capsys, endless_twice)[1])["test_twice"]  # a later one
    assert hung["outcome"] == "timeout" and "time budget of 0.3 s" in hung["message"], (
        f"a later test's budget should be its own 0.3 s: {hung['message']}"
    )


def test_measuring_times_each_test_where_it_is_not_first_and_keeps_the_start_apart(
    project, tmp_path, monkeypatch
):
    from judge.measure_budgets import measure

    monkeypatch.setenv("FAKE_START", "0.3")  # every process's first step computes 0.3 s
    assert measure(["ch44"], "cpu", 2) == 0
    data = json.loads((tmp_path / "budgets.json").read_text())
    times = data["times"]["cpu"]
    assert times["test_speed.py::test_step"] < 0.15, (
        f"test_step, the first collected test, was timed with the process's start: {times}"
    )
    assert max(times.values()) < 0.15, f"some test was timed with the process's start: {times}"
    assert 0.2 < data["first_test"]["cpu"]["test_speed.py"] < 0.6, (
        f"the start (0.3 s) should be kept as first_test: {data['first_test']}"
    )


def test_a_stale_budget_fails_the_reference_run(project, capsys, monkeypatch):
    # run(20) now spends 1 s in the engine: over 0.3 s
    monkeypatch.setenv("FAKE_STEP_SLEEP", "0.05")
    code = main(["ch44", "--solution", "--json"])
    v = json.loads(capsys.readouterr().out)
    assert code == 1 and not v["passed"], "the reference ran over its budgets, yet the run passed"
    assert any(
        "time budget" in g and "python -m judge.measure_budgets" in g for g in v["general"]
    ), f"no word of the stale budgets: {v['general']}"


def test_the_reference_within_its_budgets_passes(project, capsys):
    assert main(["ch44", "--solution", "--json"]) == 0, json.loads(capsys.readouterr().out)[
        "general"
    ]


def test_a_wrong_exercise_with_a_failed_test_of_its_own_is_not_rerun(project, capsys, monkeypatch):
    """`step` is wrong (test_step judges it alone); `run` is right but fails through `step`: only
    `run` is rerun alone, and comes out passing."""
    from judge import judging

    runs = []
    real = judging.run_pytest

    def counting(units, files, options):
        runs.append([f.rsplit("::", 1)[-1] for f in files])
        return real(units, files, options)

    monkeypatch.setattr(judging, "run_pytest", counting)
    code, v = judge_file(project, capsys, STEP.replace("x + 1", "x + 2") + "\n\n" + RUN)
    ex = by_exercise(v)
    assert ex["step"]["status"] == "failing", f"step: {ex['step']['status']}"
    assert ex["run"]["status"] == "passing" and "correct on its own" in ex["run"]["note"], (
        f"run: {ex['run']}"
    )
    reruns = runs[1:]
    assert len(reruns) == 1, f"expected one rerun (run alone), got {len(reruns)}: {reruns}"
    assert "test_step" not in reruns[0], f"the rerun ran step's own test: {reruns[0]}"


def test_the_fork_server_runs_two_at_once(tmp_path):
    """Two runs from one server at the same time: the first waits for a file only the second
    writes."""
    from judge import forkserver
    from judge.registry import REPO

    if not forkserver.available():
        pytest.skip("no fork on this platform")
    flag = tmp_path / "flag"
    (tmp_path / "test_wait.py").write_text(
        f"import time, pathlib\n\ndef test_wait():\n    for _ in range(400):\n"
        f"        if pathlib.Path({str(flag)!r}).exists():\n            return\n        "
        "time.sleep(0.05)\n"
        f"    raise AssertionError('the other run never ran')\n"
    )
    (tmp_path / "test_write.py").write_text(
        f"import pathlib\n\ndef test_write():\n    pathlib.Path({str(flag)!r}).touch()\n"
    )
    server = forkserver.ForkServer(str(REPO), ["pytest"])
    # installed plugins take seconds
    ENV = {
        "PATH": "/usr/bin:/bin",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    try:
        assert server.ready, "the fork server did not start"
        codes = {}

        def one(name):
            args = ["-q", "-p", "no:cacheprovider", str(tmp_path / f"test_{name}.py")]
            codes[name] = server.run(
                args, ENV, str(tmp_path), str(tmp_path / f"{name}.out"), 60, None
            )

        wait = threading.Thread(target=one, args=("wait",))
        wait.start()
        one("write")
        wait.join()
        assert codes["write"] == (0, False) and codes["wait"] == (0, False), (
            f"(exit code, killed) of the two runs: {codes}; the waiting one printed: "
            f"{(tmp_path / 'wait.out').read_text()[-300:]}"
        )
        # and a run past its time is stopped
        (tmp_path / "test_sleep.py").write_text(
            "import time\n\ndef test_sleep():\n    time.sleep(60)\n"
        )
        code, killed = server.run(
            ["-q", "-p", "no:cacheprovider", str(tmp_path / "test_sleep.py")],
            ENV,
            str(tmp_path),
            str(tmp_path / "sleep.out"),
            1,
            None,
        )
        assert killed, f"a run past its time limit was not stopped (exit code {code})"
    finally:
        server.close()


def test_exercises_that_only_failed_through_a_hang_are_cleared_by_one_rerun(
    project, capsys, monkeypatch
):
    """`step` hangs; `run` and `twice` are right, but their tests were not run after step's timeout:
    one rerun of the two together, with the reference's step, clears both."""
    from judge import judging

    runs = []
    real = judging.run_pytest
    monkeypatch.setattr(judging, "run_pytest", lambda *a: runs.append(a[1]) or real(*a))
    code, v = judge_file(project, capsys, HANG + "\n\n" + RUN + "\n\n" + TWICE)
    ex = by_exercise(v)
    assert ex["step"]["status"] == "failing", f"step: {ex['step']['status']}"
    for name in ("run", "twice"):
        assert ex[name]["status"] == "passing" and "in place of step" in (ex[name]["note"] or ""), (
            f"{name}: {ex[name]}"
        )
    assert len(runs) == 2, f"expected the run and one rerun, got {len(runs)} runs"


def test_a_forked_run_sees_the_engine_switches_of_its_own_environment(tmp_path):
    """The server imports the engine (and minisgl.env) once; a run forked from it with
    MINISGL_ATTENTION_BACKEND=torch (an exercise's engine_env) must get that, not the server's
    value."""
    from judge import forkserver
    from judge.registry import REPO

    if not forkserver.available():
        pytest.skip("no fork on this platform")
    (tmp_path / "test_env.py").write_text(
        "from minisgl.env import ENV\n\ndef test_env():\n"
        "    assert ENV.ATTENTION_BACKEND.value == 'torch', ENV.ATTENTION_BACKEND.value\n"
    )
    server = forkserver.ForkServer(str(REPO), ["pytest", "minisgl.env"])
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYTHONPATH": str(REPO),
        "MINISGL_ATTENTION_BACKEND": "torch",
    }
    try:
        assert server.ready, "the fork server did not start"
        code, _ = server.run(
            ["-q", "-p", "no:cacheprovider", str(tmp_path / "test_env.py")],
            env,
            str(tmp_path),
            str(tmp_path / "env.out"),
            60,
            None,
        )
        assert code == 0, (
            "the forked run saw another attention backend: "
            f"{(tmp_path / 'env.out').read_text()[-200:]}"
        )
    finally:
        server.close()


def test_a_fork_server_for_a_gpu_is_refused_where_a_forked_child_cannot_use_one():
    """On a GPU the judge forks its runs too, but only once a forked child has made a CUDA tensor;
    without a usable GPU the server for "cuda" is refused (plain subprocesses then), and one for
    "auto" forks as on a CPU."""
    from judge import forkserver
    from judge.registry import REPO

    if not forkserver.available():
        pytest.skip("no fork on this platform")
    import torch

    gpu = torch.cuda.is_available()
    for device, want in (("cuda", gpu), ("auto", True)):
        server = forkserver.ForkServer(str(REPO), ["pytest", "torch"], device)
        try:
            assert server.ready == want, f"fork server for {device!r} (GPU here: {gpu})"
        finally:
            server.close()


def test_auto_takes_the_gpus_budgets_only_where_there_is_one(monkeypatch):
    from judge import budgets

    data = {"times": {"cpu": {"t.py::a": 1.0}, "cuda": {"t.py::a": 2.0}}}
    for gpu, want in ((False, "cpu"), (True, "cuda")):
        monkeypatch.setattr(budgets, "_has_nvidia_gpu", lambda gpu=gpu: gpu)
        got = budgets.Budgets(data, "auto", 120.0).measured
        assert got == data["times"][want], f"auto with a GPU {gpu}: the times {got}, want {want}'s"


def test_the_test_process_starts_the_device_before_its_first_test(tmp_path):
    """The GPU's one-off start-up (judge/device_warmup.py) is done before the first test's clock
    starts, with the run's device, so no test's measured time or budget holds it."""
    from judge.runner import RunOptions, run_pytest

    log = tmp_path / "log.txt"
    # Loaded before the judge's plugin configures: records the warm-up instead of doing it.
    (tmp_path / "conftest.py").write_text(
        "import pathlib\nfrom judge import device_warmup\n\n"
        "import time\n\n"
        "def record(device):\n"
        f"    with open({str(log)!r}, 'a') as f:\n"
        "        f.write(f'warm-up {device}\\n')\n"
        "    end = time.process_time() + 0.5  # CPU time, as a CUDA context costs\n"
        "    while time.process_time() < end:\n"
        "        pass\n"
        "    return False\n\n"
        "device_warmup.warm_up = record\n"
    )
    (tmp_path / "test_first.py").write_text(
        "def test_first():\n"
        f"    with open({str(log)!r}, 'a') as f:\n"
        "        f.write('first test\\n')\n"
    )
    run = run_pytest([], [str(tmp_path / "test_first.py")], RunOptions(device="cpu"))
    assert [t.outcome for t in run.tests] == ["passed"], (run.tests, run.general, run.output_tail)
    lines = log.read_text().splitlines() if log.exists() else []
    assert lines == ["warm-up cpu", "first test"], (
        f"the test process's log {lines}: the device's warm-up comes once, before the first test"
    )
    assert run.tests[0].cpu is not None and run.tests[0].cpu < 0.3, (
        f"the first test's CPU time {run.tests[0].cpu} s holds the warm-up's 0.5 s: its budget pays"
    )


class _FakeTorch:
    """Records the CUDA work asked of it (this machine may have no GPU)."""

    float32, bfloat16 = "float32", "bfloat16"

    def __init__(self, gpu: bool) -> None:
        self.made = []
        made = self.made

        class CUDAGraph:
            def replay(self):
                made.append("replay")

        @contextlib.contextmanager
        def graph(g):
            made.append("capture")
            yield

        self.cuda = type(
            "cuda",
            (),
            {
                "is_available": staticmethod(lambda: gpu),
                "is_bf16_supported": staticmethod(lambda: True),
                "CUDAGraph": CUDAGraph,
                "graph": staticmethod(graph),
            },
        )

    def ones(self, *shape, device, dtype="float32"):
        self.made.append((device, dtype))
        return _FakeTensor()


class _FakeTensor:
    def __matmul__(self, other):
        return self

    def sum(self):
        return self

    def item(self):
        return 8.0


GPU_WARM_UP = [
    ("cuda", "float32"),
    ("cuda", "bfloat16"),
    ("cuda", "float32"),
    "capture",
    "replay",
    "triton_key",
    "import minisgl.gpu",
]


@pytest.mark.parametrize(
    "device, gpu, want",
    [
        ("cuda", True, GPU_WARM_UP),
        ("auto", True, GPU_WARM_UP),
        ("auto", False, []),
        ("cpu", True, []),
    ],
)
def test_the_warm_up_starts_cuda_cublas_a_graph_and_triton_only_on_a_gpu(
    monkeypatch, device, gpu, want
):
    import sys

    from judge import device_warmup

    fake = _FakeTorch(gpu)
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(device_warmup, "_triton_key", lambda: fake.made.append("triton_key"))
    monkeypatch.setattr(device_warmup, "GPU_MODULES", ["minisgl.gpu"])
    monkeypatch.setattr(
        device_warmup.importlib, "import_module", lambda name: fake.made.append(f"import {name}")
    )
    done = device_warmup.warm_up(device)
    assert fake.made == want and done == bool(want), (
        f"warm_up({device!r}) with a GPU {gpu}: did {fake.made}, want {want}"
    )


def test_the_warm_up_never_compiles_an_engine_kernel():
    """A kernel compiled before the swap would keep the reference's helpers in memory (its cache is
    keyed by its arguments, not its helpers' source), so a learner's swapped-in helper would never
    run: the warm-up touches torch's own work and imports only."""
    from judge import device_warmup

    source = Path(device_warmup.__file__).read_text()
    code = source.split('"""', 2)[2]  # past the module's docstring
    for name in ("minisgl.kernel", "LLM(", "launch(", "[grid]"):
        assert name not in code, f"device_warmup runs {name!r}: a kernel compiled before the swap"
    assert all(not m.startswith("minisgl.kernel") for m in device_warmup.GPU_MODULES)


ELSEWHERE_TESTS = """
import multiprocessing as mp

from fakepkg.engine import Engine


class StoppedElsewhere(RuntimeError):
    hung = True  # as classroom/ranks.py's RanksTimedOut: the code under test hung in a child


def _in_a_child(x):
    # the code under test runs in a forked child, out of the test process's sampler's sight; the
    # harness waits for it with a timeout of its own, as run_ranks waits for a group's ranks
    p = mp.get_context("fork").Process(target=Engine().step, args=(x,), daemon=True)
    p.start()
    p.join(0.5)
    if p.is_alive():
        p.kill()
        p.join()
        raise StoppedElsewhere("the child did not finish in 0.5 s; it was stopped")
    return p.exitcode


def test_step_in_a_child():
    assert _in_a_child(1) == 0, "the child failed"


def test_step_in_another_child():
    assert _in_a_child(2) == 0, "the child failed"


def test_step_here():
    assert Engine().step(1) == 2, "step(1) should be 2"
"""

ELSEWHERE_REGISTRY = """

[ch45]
title = "A fake engine run in other processes"
test_files = ["fake_tests/test_elsewhere.py"]

[[ch45.exercises]]
name = "step"
target = "fakepkg.engine:Engine.step"
tests = ["test_elsewhere.py::test_step_in_a_child", "test_elsewhere.py::test_step_in_another_child",
         "test_elsewhere.py::test_step_here"]
"""


def test_a_hang_that_a_harness_stopped_in_another_process_counts_as_the_exercises_timeout(
    project, capsys, tmp_path
):
    """The ranks of chapter 16 run the learner's code in processes the sampler does not see; the
    harness stops them after its own timeout and raises an exception with `hung = True`. That is
    the exercise's timeout, once: its other tests are not run (a hang cost 20 s a test before)."""
    (tmp_path / "fake_tests" / "test_elsewhere.py").write_text(ELSEWHERE_TESTS)
    with open(tmp_path / "registry.toml", "a") as f:
        f.write(ELSEWHERE_REGISTRY)
    mine = project.write("mine.py", HANG)
    code = main(["ch45", "--file", str(mine), "--json"])
    v = json.loads(capsys.readouterr().out)
    tests = by_test(v)
    first = tests["test_step_in_a_child"]
    assert code == 1 and first["outcome"] == "timeout", (
        f"expected a timeout, got {first['outcome']}: {first['message']}"
    )
    assert "the child did not finish in 0.5 s" in first["message"], first["message"]
    for name in ("test_step_in_another_child", "test_step_here"):
        why = tests[name]["message"]
        assert why == "not run: step already timed out in test_step_in_a_child", (
            f"{name}: {tests[name]['outcome']}, {why}"
        )
    assert v["counts"].get("timeout") == 1 and by_exercise(v)["step"]["status"] == "failing"
