"""tools/stages.py, CI's stage runner: stages side by side as the cores allow, a failure fails
the run and skips only what waits for it, each stage's output kept in its own log."""

from __future__ import annotations

import pytest

from tools.stages import Runner, Stage, check_plan


def run(stages, cores, tmp_path):
    runner = Runner(stages, cores, tmp_path)
    return runner.run(), runner.results


def test_one_spreading_stage_at_a_time_with_one_core_stages_beside_it_in_half_the_cores(tmp_path):
    # on 4 cores: the side lane is 2 cores, so a and b run at once and c waits for one of them;
    # wide spreads over all 4 beside them, and wide2 waits for wide
    stages = [
        Stage("a", "sleep 1.5"),
        Stage("b", "sleep 1.5"),
        Stage("c", "true"),
        Stage("wide", "sleep 1.5; echo cores={cores}", cores=None),
        Stage("wide2", "true", cores=None),
    ]
    code, results = run(stages, 4, tmp_path)
    assert code == 0
    start = {name: r[1] for name, r in results.items()}
    assert max(start["a"], start["b"], start["wide"]) < 1.0, f"not started together: {start}"
    assert start["c"] >= 1.4, f"c started before a or b gave its core back: {start}"
    assert start["wide2"] >= 1.4, f"two spreading stages ran at once: {start}"
    assert (tmp_path / "wide.log").read_text().splitlines()[-1] == "cores=4"


def test_on_two_cores_one_stage_runs_beside_the_spreading_one(tmp_path):
    stages = [Stage("a", "sleep 1.5"), Stage("b", "true"), Stage("wide", "sleep 1.5", cores=None)]
    code, results = run(stages, 2, tmp_path)
    assert code == 0
    start = {name: r[1] for name, r in results.items()}
    assert start["wide"] < 1.0 and start["b"] >= 1.4, start


def test_once_no_spreading_stage_is_left_the_others_use_every_core(tmp_path):
    stages = [Stage("a", "sleep 1.5"), Stage("b", "sleep 1.5"), Stage("c", "sleep 1.5")]
    code, results = run(stages, 3, tmp_path)
    start = {name: r[1] for name, r in results.items()}
    assert code == 0 and max(start.values()) < 1.0, start


def test_a_stage_waits_for_the_stages_it_names(tmp_path):
    stages = [
        Stage("first", f"sleep 1; echo done > {tmp_path}/first.txt"),
        Stage("then", f"cat {tmp_path}/first.txt", after=["first"]),
    ]
    code, _ = run(stages, 4, tmp_path)
    assert code == 0
    assert (tmp_path / "then.log").read_text().splitlines()[-1] == "done"


def test_a_failed_stage_fails_the_run_and_only_its_dependents_are_not_run(tmp_path, capsys):
    stages = [
        Stage("bad", "echo the reason; exit 3"),
        Stage("good", "echo fine"),
        Stage("after_bad", "echo never", after=["bad"]),
    ]
    code, results = run(stages, 2, tmp_path)
    assert code == 1
    assert results["bad"][0] == "FAILED (exit 3)"
    assert results["good"][0] == "passed"
    assert results["after_bad"][0] == "not run"
    assert not (tmp_path / "after_bad.log").exists()
    out = capsys.readouterr().out
    assert "the reason" in out, "the failed stage's log is not printed"
    assert "FAILED: bad, after_bad" in out


def test_a_stage_wanting_more_cores_than_the_machine_has_still_runs(tmp_path):
    code, results = run([Stage("big", "echo {cores}", cores=8)], 2, tmp_path)
    assert code == 0 and results["big"][3] == 2


@pytest.mark.parametrize(
    "stages, problem",
    [
        ([Stage("a", "true"), Stage("a", "true")], "listed twice"),
        ([Stage("a", "true", after=["b"]), Stage("b", "true")], "must be listed before it"),
        ([Stage("two words", "true")], "one word"),
        ([Stage("a", "true", cores=0)], "at least 1"),
    ],
)
def test_a_plan_the_runner_cannot_follow_is_refused_naming_the_stage(stages, problem):
    with pytest.raises(ValueError, match=problem):
        check_plan(stages)


def test_ci_plan_is_a_plan_the_runner_follows():
    import runpy
    from pathlib import Path

    plan = runpy.run_path(str(Path(__file__).resolve().parent.parent / ".ci" / "stages.py"))
    check_plan(plan["STAGES"])
