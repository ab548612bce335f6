"""A class of ch01 notebooks for the grader's tests and its 40-copy run: solutions, stubs,
known-wrong variants (judge/variants/ch01_*) made into notebooks, and hostile submissions.

    python -m tests.grading_class OUT [--copies 40]  # OUT/<student>.ipynb, OUT/expected.json

Each hostile `complete_one` ends with the right body, so a submission whose attack worked would
pass: "passing" in its verdict means the sandbox let it through.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "ch01_core.ipynb"
STUB = REPO / "notebooks" / "ch01_core.ipynb"
RIGHT = "    self.cached_len = self.device_len\n    self.device_len += 1\n"


def _complete_one(attack: str) -> str:
    return "def complete_one(self):\n" + textwrap.indent(textwrap.dedent(attack), "    ") + RIGHT


HOSTILE: Dict[str, str] = {
    # a fork bomb: stopped by the process limit, its processes killed with the submission
    "fork_bomb": _complete_one(
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """
    ),
    # an allocation loop: MemoryError at the address-space limit. numpy's empty arrays take
    # address space without touching it, so the limit is reached in a blink whatever the load (a
    # bytearray's zeroing of 3 GB once outlasted the test's time budget on a busy CI machine)
    "allocation_loop": _complete_one(
        """
        import numpy
        hoard = []
        try:
            while True:
                hoard.append(numpy.empty(64 << 20, dtype=numpy.uint8))
        except MemoryError:  # how much it got says which limit stopped it
            raise MemoryError(f"refused after {len(hoard) * 64} MiB") from None
        """
    ),
    # a file of many GB: refused at the file-size limit (EFBIG)
    "huge_file": _complete_one(
        """
        import os, tempfile
        with open(os.path.join(tempfile.gettempdir(), "big.bin"), "wb") as f:
            for _ in range(100_000):
                f.write(bytes(1 << 20))
        """
    ),
    # the judge's package: read-only for it
    "writes_the_judge": _complete_one(
        """
        import judge
        with open(judge.__file__, "a") as f:
            f.write("\\n# graded by a student\\n")
        """
    ),
    # its parent (the judge's fork server), and the grader if it can see it
    "kills_its_parent": _complete_one(
        """
        import os, signal
        os.kill(os.getppid(), signal.SIGKILL)
        """
    ),
    # the judge itself (its test process's parent's parent)
    "kills_its_grandparent": _complete_one(
        """
        import os, signal
        with open(f"/proc/{os.getppid()}/stat") as f:
            grandparent = int(f.read().rsplit(")", 1)[1].split()[1])
        if grandparent > 1:
            os.kill(grandparent, signal.SIGKILL)
        """
    ),
    # its own test process, in the middle of a test, with the status of a success
    "exits_in_a_test": _complete_one(
        """
        import os
        os._exit(0)
        """
    ),
    # every file its test process has open: pytest's output, the judge's results file
    "closes_its_files": _complete_one(
        """
        import os
        os.closerange(1, 4096)
        """
    ),
}
# the test process while the judge loads the notebook's code, before any test (a default value is
# computed when its `def` runs), with the status of a success
EXITS_WHILE_LOADING = "import os\n\ndef complete_one(self, _=os._exit(0)):\n" + RIGHT


ENDLESS = _complete_one("while True:\n    pass\n")  # the judge's time budget stops it
FAILING_ONE = {"complete_one": "failing"}
NOT_PASSING_ONE = {"complete_one": "not passing"}  # failing, timeout, crashed...: anything else


def neighbour_reader(path: Path) -> str:
    """Reads another submission (the grader hides the submissions folder)."""
    return _complete_one(f"open({str(path)!r}).read()\n")


def network_client(port: int) -> str:
    """Connects to the grader's machine (the sandbox has no network, not even its loopback)."""
    return _complete_one(
        f"""
        import socket
        socket.create_connection(("127.0.0.1", {port}), timeout=5).close()
        """
    )


def notebook(
    replace: Optional[Dict[str, str]] = None, stub: bool = False, tryout_loop: bool = False
) -> dict:
    """The solution notebook (or the learner's stub), with some exercise cells' code replaced."""
    nb = json.loads((STUB if stub else SOLUTION).read_text())
    for cell in nb["cells"]:
        tag = cell.get("metadata", {}).get("minisgl", {}).get("exercise")
        if tag and replace and tag.split(".")[1] in replace:
            cell["source"] = replace[tag.split(".")[1]]
        if tag and tryout_loop:  # try-out code after the def: the judge never runs it
            cell["source"] = "".join(cell["source"]) + "\n\nwhile True:\n    pass\n"
    if tryout_loop:
        nb["cells"].append(
            {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
             "source": "while True:  # a scratch cell that never ends\n    pass\n"}
        )  # fmt: skip
    return nb


def variants() -> Dict[str, Dict[str, str]]:
    """ch01's known-wrong variants (judge/variants/ch01_*), built from the current reference as
    the judge builds them, as {variant: {exercise: its code}}."""
    import ast

    from judge.registry import load_registry, variant_files
    from judge.variant_edits import variant_source

    chapter = load_registry().chapter("ch01")
    out = {}
    for path in variant_files(chapter):
        source = variant_source(path, chapter)
        names = [n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]
        out[path.stem] = {name: source for name in names}
    return out


def write_class(
    out: Path, copies: int = 40, port: Optional[int] = None, secret: Optional[str] = None
) -> Dict[str, dict]:
    """`copies` notebooks in `out` (at least the fixed ones below and one solution), and what each
    verdict must be (also in expected.json): {"outcome": one or several joined by "|",
    "statuses": {exercise: status, or "not passing"}}; an exercise not named must be "passing".
    A verdict other than "judged" has no statuses to check (its exercises earn nothing).
    `port`: a port listening on this machine's loopback, which a submission tries to reach;
    `secret`: an environment variable of the grader's, which a submission tries to read."""
    out.mkdir(parents=True, exist_ok=True)
    neighbour = out / "solution_00.ipynb"
    stub = dict.fromkeys(["complete_one", "extend_len", "can_decode", "is_greedy"], "not attempted")
    cases = [  # name, notebook, outcome, statuses
        ("stub", notebook(stub=True), "judged", stub),
        ("tryout_loop", notebook(tryout_loop=True), "judged", {}),
        ("endless_loop", notebook({"complete_one": ENDLESS}), "judged", FAILING_ONE),
        # Stopped at the process limit where a pids cgroup tells (root), else at the wall-time
        # limit, unless the judge's own budget ended it first: any, if complete_one earns nothing.
        ("fork_bomb", notebook({"complete_one": HOSTILE["fork_bomb"]}),
         "crashed|timed out|judged", NOT_PASSING_ONE),
        ("reads_a_neighbour", notebook({"complete_one": neighbour_reader(neighbour)}), "judged",
         FAILING_ONE),
        ("kills_its_parent", notebook({"complete_one": HOSTILE["kills_its_parent"]}),
         "crashed|judged", NOT_PASSING_ONE),
        ("exits_while_loading", notebook({"complete_one": EXITS_WHILE_LOADING}),
         "crashed|judged", dict.fromkeys(stub, "not passing")),
    ]  # fmt: skip
    # Each ends a process of the judge's chain. Which verdict comes depends on what the kill hit
    # and when (a judge that died gives none): any, as long as complete_one earns nothing.
    for name in ("kills_its_grandparent", "exits_in_a_test", "closes_its_files"):
        cases.append((name, notebook({"complete_one": HOSTILE[name]}), "crashed|judged",
                      NOT_PASSING_ONE))  # fmt: skip
    for name in ("allocation_loop", "huge_file", "writes_the_judge"):
        cases.append((name, notebook({"complete_one": HOSTILE[name]}), "judged", FAILING_ONE))
    if port is not None:
        code = network_client(port)
        cases.append(("opens_a_socket", notebook({"complete_one": code}), "judged", FAILING_ONE))
    if secret is not None:
        code = _complete_one(f"import os\nos.environ[{secret!r}]\n")
        cases.append(("reads_the_environment", notebook({"complete_one": code}), "judged",
                      FAILING_ONE))  # fmt: skip
    for variant, code in variants().items():
        cases.append((variant, notebook(code), "judged", dict.fromkeys(code, "failing")))
    # at least one solution: reads_a_neighbour tries to read solution_00's notebook, and a class of
    # fixed cases only (the known-wrong variants grow with the chapter) would have no neighbour
    for i in range(max(1, copies - len(cases))):
        cases.append((f"solution_{i:02d}", notebook(), "judged", {}))
    expected = {}
    for name, nb, outcome, statuses in cases:
        (out / f"{name}.ipynb").write_text(json.dumps(nb))
        expected[name] = {"outcome": outcome, "statuses": statuses}
    (out / "expected.json").write_text(json.dumps(expected, indent=1))
    return expected


def wrong_verdicts(expected: Dict[str, dict], grades: dict) -> List[str]:
    """The submissions of `grades` (grades.json) whose verdict is not the expected one."""
    verdicts = {s["student"]: s for s in grades["submissions"]}
    wrong = [f"{name}: no verdict" for name in expected if name not in verdicts]
    for student, want in expected.items():
        got = verdicts.get(student)
        if got is None:
            continue
        statuses = {e["name"]: e["status"] for e in got["exercises"]}
        seen = f"{got['outcome']} {statuses} ({got['reason'] or 'no reason'}; {got['general']})"
        if got["outcome"] not in want["outcome"].split("|"):
            wrong.append(f"{student}: {seen}, expected {want['outcome']}")
        elif got["outcome"] == "judged":
            for name, status in statuses.items():
                must = want["statuses"].get(name, "passing")
                if status != must and not (must == "not passing" and status != "passing"):
                    wrong.append(f"{student}: {seen}, expected {name} {must}")
    return wrong


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--copies", type=int, default=40)
    parser.add_argument("--check", type=Path, metavar="GRADES_JSON", help="check a grading of it")
    args = parser.parse_args()
    if args.check:
        expected = json.loads((args.out / "expected.json").read_text())
        wrong = wrong_verdicts(expected, json.loads(args.check.read_text()))
        print("\n".join(wrong) or f"all {len(expected)} verdicts right")
        raise SystemExit(1 if wrong else 0)
    print(f"{len(write_class(args.out, args.copies))} notebooks in {args.out}")
