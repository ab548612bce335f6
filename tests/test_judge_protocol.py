"""The judge's two processes share one protocol (judge/protocol.py): what one writes, the other
reads back as the same objects."""

import dataclasses

from judge import protocol as p


def test_a_spec_reads_back_as_written(tmp_path):
    spec = p.RunSpec(
        results=str(tmp_path / "results.jsonl"),
        test_dirs=[str(tmp_path)],
        done=["t.py::a"],
        device="cpu",
        timed_out={"ch42.double": "t.py::b"},
        units=[
            p.UnitSpec(
                "ch42",
                "notebook",
                "error",
                [p.SnippetSpec("cell 3", "def double(x): ...", "double")],
                [
                    p.ExerciseSpec(
                        "ch42.double", "double", "pkg.mod:double", True, None, ["t.py::a"], False
                    )
                ],
            )
        ],
        budget=p.BudgetSpec({"t.py::a": 0.5}, 5.0, 10.0, 30.0, 60.0, ["triton"], ["pkg"]),
    )
    spec.write(tmp_path / "spec.json")
    back = p.RunSpec.read(tmp_path / "spec.json")
    assert back == spec, "the spec read back differs from the one written"
    assert back.budget.limit("t.py::a") == 5.0 and back.budget.limit("t.py::new") == 30.0, (
        "a test's budget: max(floor, factor x measured) when measured, else the default"
    )


def test_every_event_reads_back_as_written_and_a_cut_line_is_skipped(tmp_path):
    events = [cls() for cls in p.EVENTS.values()]
    events.append(
        p.Result(
            "t.py::a", "failed", 0.25, "expected 2, got 3", None, False, "cell 3, line 1", None
        )
    )
    path = tmp_path / "results.jsonl"
    path.write_text(
        "".join(e.to_json() + "\n" for e in events) + '{"event": "result", "test": "t.py'
    )
    back = p.read_events(path)
    assert [(type(e), dataclasses.asdict(e)) for e in back] == [
        (type(e), dataclasses.asdict(e)) for e in events
    ], "the events read back differ from those written"
