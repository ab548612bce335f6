"""The grader's parts, without running a judge: which notebook is whose, the points file, what a
sandboxed judge's output means, the cache, and the files written (CSV, JSON, HTML, Gradescope,
JUnit). The sandbox itself and real submissions: test_grading_class.py."""

from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from extras import needs_extra
from judge.child_process import SUPERVISOR_LOST
from judge.grading import export, report, run
from judge.grading.discover import SubmissionError, discover
from judge.grading.isolate import Containment, Limits, Outcome
from judge.grading.points import Points
from judge.grading.points import load as load_points
from tests import grading_class
from tools.site_check import find_chromium

SCHEMA = json.loads((Path(__file__).parent / "data" / "gradescope_results.schema.json").read_text())
POINTS = Points(1.0, {"ch01.complete_one": 3.0})


def _write(path: Path, nb: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb))
    return path


def test_students_are_folders_or_file_names_and_chapters_come_from_the_tags(tmp_path):
    _write(tmp_path / "alice" / "ch01_core.ipynb", grading_class.notebook())
    _write(tmp_path / "bob.ipynb", grading_class.notebook(stub=True))
    _write(tmp_path / ".ipynb_checkpoints" / "bob-checkpoint.ipynb", grading_class.notebook())
    other = json.loads((grading_class.REPO / "solutions" / "ch02_layers.ipynb").read_text())
    _write(tmp_path / "carol.ipynb", other)
    subs, skipped = discover(["ch01"], [tmp_path])
    assert [(s.student, s.chapter) for s in subs] == [("alice", "ch01"), ("bob", "ch01")]
    assert len(skipped) == 1 and "carol.ipynb: its exercises are of ch02, not of ch01" in skipped[0]
    both, skipped = discover(["ch01", "ch02"], [tmp_path])
    assert [(s.student, s.chapter) for s in both] == [
        ("alice", "ch01"),
        ("bob", "ch01"),
        ("carol", "ch02"),
    ]


def test_bad_submission_lists_are_refused_naming_what_is_wrong(tmp_path):
    _write(tmp_path / "alice" / "a.ipynb", grading_class.notebook())
    _write(tmp_path / "alice" / "b.ipynb", grading_class.notebook())
    with pytest.raises(SubmissionError, match="two notebooks for alice, ch01"):
        discover(["ch01"], [tmp_path])
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(SubmissionError, match="is not a notebook"):
        discover(["ch01"], [tmp_path / "notes.txt"])
    with pytest.raises(SubmissionError, match="no such file or folder"):
        discover(["ch01"], [tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SubmissionError, match="holds no notebook"):
        discover(["ch01"], [tmp_path / "empty"])


@pytest.mark.parametrize(
    "args,message",
    [
        (["ch99", "class"], "unknown chapter 'ch99'"),
        (["ch01"], "name the submissions"),
        (["class"], "name at least one chapter"),
        (["ch01", "missing"], "missing: no such file or folder"),
        (["ch01", "class", "--jobs", "0"], "--jobs must be at least 1, got 0"),
        (["ch01", "class", "--wall-s", "-1"], "--wall-s must be positive, got -1.0"),
    ],
)
def test_grade_refuses_a_wrong_command_line_naming_what_is_wrong(
    tmp_path, monkeypatch, capsys, args, message
):
    from judge.grading import cli

    _write(tmp_path / "class" / "alice.ipynb", grading_class.notebook())
    monkeypatch.chdir(tmp_path)
    assert cli.main(args) == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "grades").exists()  # nothing judged, nothing written


def test_points_file_is_checked(tmp_path):
    assert load_points().of("ch01.complete_one") == 1.0  # the shipped file: 1 point each
    good = tmp_path / "p.toml"
    good.write_text('default = 2\n[exercises]\n"ch01.complete_one" = 5\n')
    assert (load_points(good).of("ch01.complete_one"), load_points(good).of("ch01.x")) == (5, 2)
    for text, message in [
        ("default = -1\n", "default must be a number >= 0"),
        ('[exercises]\n"ch01.complete_one" = true\n', "must be a number >= 0"),
        ("[exercises]\ncomplete_one = 1\n", "should be chNN.exercise"),
        ("points = 1\n", "unknown keys"),
        ("default = [", "not valid TOML"),
    ]:
        good.write_text(text)
        with pytest.raises(ValueError, match=message):
            load_points(good)
    with pytest.raises(ValueError, match="points file not found"):
        load_points(tmp_path / "none.toml")


def _sub(tmp_path, student="alice"):
    path = _write(tmp_path / f"{student}.ipynb", grading_class.notebook())
    (sub,), _ = discover(["ch01"], [path])
    return sub


def _judge_json(statuses, crashed=0, general=()):
    exercises, tests = [], []
    for name, status in statuses.items():
        test = f"tests/test_ch01_core.py::test_{name}"
        ok = status == "passing"
        exercises.append(
            {"id": f"ch01.{name}", "name": name, "status": status, "problem": None,
             "passed": int(ok), "total": 1, "tests": [test]}
        )  # fmt: skip
        tests.append(
            {"test": test, "outcome": "passed" if ok else "failed",
             "message": None if ok else f"{name} <b>went</b> wrong"}
        )  # fmt: skip
    counts = {"crashed": crashed} if crashed else {}
    passed = not crashed and all(s == "passing" for s in statuses.values())
    return json.dumps(
        {"passed": passed, "exercises": exercises, "tests": tests, "counts": counts,
         "general": list(general)}
    )  # fmt: skip


ALL = ["complete_one", "extend_len", "can_decode", "is_greedy"]


def test_what_a_sandboxed_judge_left_means(tmp_path):
    sub = _sub(tmp_path)
    timed = run.interpret(sub, Outcome(None, "", "", 31.2, True, 30.0))
    assert timed.outcome == run.TIMED_OUT and "wall-time limit, 30 s (--wall-s)" in timed.reason
    assert [e.status for e in timed.exercises] == [run.NOT_JUDGED] * 4
    bomb = run.interpret(sub, Outcome(None, "", "", 4.0, False, 30.0, True, 64))
    assert bomb.outcome == run.CRASHED and "process limit, 64 processes" in bomb.reason
    killed = run.interpret(sub, Outcome(-9, "", "Traceback...\nboom\n", 3.0, False))
    assert killed.outcome == run.CRASHED
    assert killed.reason == "the judge died without a verdict (killed by SIGKILL): boom"
    # the sandbox's shell, the judge's parent, reports a signal as 128 + its number
    segv = run.interpret(sub, Outcome(139, "", "", 3.0, False))
    assert segv.reason == "the judge died without a verdict (killed by SIGSEGV)"
    assert "(exit status 3)" in run.interpret(sub, Outcome(3, "", "", 3.0, False)).reason
    bad = run.interpret(
        sub, Outcome(2, '{"passed": false, "error": "corrupt notebook"}', "", 1, False)
    )
    assert (bad.outcome, bad.reason) == (run.REJECTED, "corrupt notebook")
    statuses = dict.fromkeys(ALL, "passing") | {"complete_one": "failing"}
    judged = run.interpret(sub, Outcome(1, _judge_json(statuses), "", 5, False))
    assert judged.outcome == run.JUDGED
    assert judged.exercises[0].failures == ["test_complete_one: complete_one <b>went</b> wrong"]
    # The run died with no exercise to blame (its fork server killed): no status can be trusted,
    # whichever the judge's blame reruns settled on (both shapes seen with kills_its_parent).
    for statuses in (dict.fromkeys(ALL, "passing"), statuses):
        died = _judge_json(statuses, crashed=1, general=["the test process ended abruptly"])
        crashed = run.interpret(sub, Outcome(1, died, "", 5, False))
        assert crashed.outcome == run.CRASHED and "ended abruptly" in crashed.reason
        assert report.score(crashed, POINTS).earned == 0
    # The shape seen a third time: no general line, is_greedy blamed for a test whose process
    # ended with no status (its fork server killed), complete_one (the culprit) "passing".
    data = json.loads(_judge_json(dict.fromkeys(ALL, "passing") | {"is_greedy": "failing"}))
    data["tests"][3]["message"] = (
        f"the test process ended abruptly ({SUPERVISOR_LOST}) during this test"
    )
    lost = run.interpret(sub, Outcome(1, json.dumps(data), "", 5, False))
    assert lost.outcome == run.CRASHED and "fork server was killed" in lost.reason
    # A crash inside a test is its exercise's: the judge blames it and adds no general line.
    blamed = run.interpret(sub, Outcome(1, _judge_json(statuses, crashed=2), "", 5, False))
    assert blamed.outcome == run.JUDGED


def test_a_passing_exercise_and_a_run_without_verdict_count_as_they_should(tmp_path):
    sub = _sub(tmp_path)
    data = json.loads(_judge_json(dict.fromkeys(ALL, "passing") | {"complete_one": "failing"}))
    # extend_len passes (the judge reran it alone) though its shared test failed for complete_one
    data["exercises"][1]["tests"].append("tests/test_ch01_core.py::test_complete_one")
    judged = run.interpret(sub, Outcome(1, json.dumps(data), "", 5, False))
    assert judged.exercises[1].status == "passing" and judged.exercises[1].failures == []
    died = _judge_json(dict.fromkeys(ALL, "passing"), crashed=1, general=["ended abruptly"])
    crashed = run.interpret(sub, Outcome(1, died, "", 5, False))
    passing = {ex["id"]: ex["passing"] for ex in report.summary([judged, crashed])}
    assert passing == {"ch01.complete_one": 0, "ch01.extend_len": 1, "ch01.can_decode": 1,
                       "ch01.is_greedy": 1}  # fmt: skip


def _fake_sandbox(monkeypatch, calls):
    def fake_run(self, chapter, notebook, workdir, name):
        calls.append(name)
        return Outcome(0, _judge_json(dict.fromkeys(ALL, "passing")), "", 1.0, False)

    monkeypatch.setattr(run.Sandbox, "run", fake_run)


def test_grading_again_judges_only_changed_notebooks(tmp_path, monkeypatch):
    calls = []
    _fake_sandbox(monkeypatch, calls)
    folder = tmp_path / "class"
    for name in ("alice", "bob"):
        _write(folder / f"{name}.ipynb", grading_class.notebook())
    none = Containment(False, False, None)

    def grade():
        subs, _ = discover(["ch01"], [folder])
        cache = run.Cache(tmp_path / "cache.json", "judge-v1")
        return run.grade(subs, none, Limits(), [], cache, jobs=2)

    assert [v.cached for v in grade()] == [False, False] and len(calls) == 2
    assert [v.cached for v in grade()] == [True, True] and len(calls) == 2
    _write(folder / "bob.ipynb", grading_class.notebook(stub=True))  # bob changed his notebook
    assert [v.cached for v in grade()] == [True, False] and len(calls) == 3


def _verdicts(tmp_path):
    sub_a, sub_b = _sub(tmp_path, "alice"), _sub(tmp_path, "bob")
    statuses = dict.fromkeys(ALL, "passing") | {"complete_one": "failing"}
    return [
        run.interpret(sub_a, Outcome(1, _judge_json(statuses), "", 5, False)),
        run.interpret(sub_b, Outcome(-9, "", "", 2, False)),
    ]


def test_table_and_json_hold_every_student_and_exercise(tmp_path):
    verdicts = _verdicts(tmp_path)
    report.write_csv(tmp_path / "g.csv", verdicts, POINTS)
    rows = list(csv.DictReader(open(tmp_path / "g.csv")))
    assert [(r["student"], r["outcome"], r["score"], r["max_score"]) for r in rows] == [
        ("alice", "judged", "3.0", "6.0"),
        ("bob", "crashed", "0", "6.0"),
    ]
    assert rows[0]["ch01.complete_one"] == "failing" and rows[0]["ch01.is_greedy"] == "passing"
    assert rows[1]["ch01.complete_one"] == "not judged" and "SIGKILL" in rows[1]["reason"]
    report.write_json(tmp_path / "g.json", verdicts, POINTS, ["limits"])
    data = json.loads((tmp_path / "g.json").read_text())
    assert data["exercises"] == [f"ch01.{n}" for n in ALL]
    assert [s["score"] for s in data["submissions"]] == [3.0, 0]


def test_gradescope_results_follow_the_documented_schema(tmp_path):
    verdicts = _verdicts(tmp_path)
    export.write_gradescope(tmp_path / "gs", verdicts, POINTS)
    alice = json.loads((tmp_path / "gs" / "alice_ch01.json").read_text())
    bob = json.loads((tmp_path / "gs" / "bob_ch01.json").read_text())
    for results in (alice, bob):
        jsonschema.validate(results, SCHEMA)
    assert (
        alice["score"] == 3.0
        and [t["status"] for t in alice["tests"]] == ["failed"] + ["passed"] * 3
    )
    assert alice["tests"][0]["max_score"] == 3.0 and "went" in alice["tests"][0]["output"]
    assert bob["score"] == 0 and "crashed" in bob["output"]
    # One submission (Gradescope's own run): the one results.json it reads.
    export.write_gradescope(tmp_path / "one", verdicts[:1], POINTS)
    jsonschema.validate(json.loads((tmp_path / "one" / "results.json").read_text()), SCHEMA)
    with pytest.raises(jsonschema.ValidationError):  # the schema can fail
        jsonschema.validate({**alice, "tests": [{"status": "ok"}]}, SCHEMA)


def test_junit_xml_parses_with_a_failure_per_failing_exercise(tmp_path):
    export.write_junit(tmp_path / "j.xml", _verdicts(tmp_path), POINTS)
    root = ET.parse(tmp_path / "j.xml").getroot()
    suites = root.findall("testsuite")
    assert [(s.get("name"), s.get("tests"), s.get("failures")) for s in suites] == [
        ("alice.ch01", "4", "1"),
        ("bob.ch01", "4", "4"),
    ]
    failure = suites[0].find("testcase[@name='complete_one']/failure")
    assert failure.get("message") == "failing" and "went" in failure.text
    assert suites[0].find("testcase[@name='is_greedy']/failure") is None
    assert "SIGKILL" in suites[1].find("system-err").text


def test_html_report_escapes_what_learners_wrote(tmp_path):
    report.write_html(tmp_path / "r.html", _verdicts(tmp_path), POINTS, ["limits"])
    html = (tmp_path / "r.html").read_text()
    assert "complete_one &lt;b&gt;went&lt;/b&gt; wrong" in html and "<b>went</b>" not in html
    assert 'id="grades"' in html and "1 of 2" in html  # is_greedy passes for alice, not bob


def test_classroom_template_is_what_the_generator_writes():
    from judge.grading import classroom

    committed = (
        grading_class.REPO / "classroom_template" / ".github" / "workflows" / "classroom.yml"
    )
    assert committed.read_text() == classroom.render(classroom.TEMPLATE_CHAPTERS, load_points()), (
        "stale: regenerate it with python -m judge.grading.classroom > its path"
    )


@needs_extra("dev", "playwright")
@pytest.mark.skipif(not find_chromium(), reason="no chromium (apt-get install -y chromium)")
def test_html_report_opens_in_chromium_without_console_errors(tmp_path):
    from playwright import sync_api

    report.write_html(tmp_path / "r.html", _verdicts(tmp_path), POINTS, ["limits"])
    errors = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=find_chromium(), headless=True, args=["--no-sandbox"]
        )
        page = browser.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto((tmp_path / "r.html").as_uri())
        rows = page.locator("#grades tbody tr").count()
        cells = page.locator("#grades td.failing").count()
        browser.close()
    assert errors == [] and rows == 2 and cells == 1


@pytest.mark.parametrize("changed", [False, True])
def test_a_checkout_changed_while_grading_is_reported(tmp_path, monkeypatch, capsys, changed):
    """Without namespaces a submission may write into the judge's checkout (as root it did, into
    judge/__init__.py): the grader compares the checkout before and after and says so."""
    from judge.grading import cli

    _fake_sandbox(monkeypatch, [])
    prints = iter(["before", "after" if changed else "before"])
    monkeypatch.setattr(cli, "fingerprint", lambda: next(prints))
    monkeypatch.setattr(cli, "probe", lambda: Containment(False, False, None))
    _write(tmp_path / "class" / "alice.ipynb", grading_class.notebook())
    code = cli.main(["ch01", str(tmp_path / "class"), "--out", str(tmp_path / "out")])
    said = " ".join(capsys.readouterr().err.split())
    containment = json.loads((tmp_path / "out" / "grades.json").read_text())["containment"]
    assert (code, "changed while grading" in said) == ((3, True) if changed else (0, False))
    assert any("changed while grading" in line for line in containment) == changed
