"""A name with a leading underscore stays inside its package (tools/private_access.py)."""

from pathlib import Path

from tools.private_access import scan


def _write(root: Path, files: dict) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_no_package_uses_another_packages_private_names():
    found = scan()
    assert not found, f"{len(found)} use(s) of another package's private names, first: {found[0]}"


def test_a_planted_crossing_is_found(tmp_path):
    _write(
        tmp_path,
        {
            "eng/__init__.py": "",
            "eng/core.py": (
                "_STATE = None\nclass Sched:\n    def _step(self):\n        self._live = 1\n"
            ),
            "eng/view/__init__.py": "",
            "eng/view/plot.py": (
                "from eng.core import _STATE\nfrom eng import core\n"
                "def show(s):\n    s._step()\n    return core._STATE, s._live, s._own\n"
                "class Mine:\n    def __init__(self):\n        self._own = 0\n"
            ),
        },
    )
    found = sorted((c.path, c.line, c.name) for c in scan(tmp_path, ("eng",), ()))
    assert found == [
        ("eng/view/plot.py", 1, "_STATE"),
        ("eng/view/plot.py", 4, "_step"),
        ("eng/view/plot.py", 5, "_STATE"),
        ("eng/view/plot.py", 5, "_live"),
    ], found


def test_private_names_used_inside_their_own_package_pass(tmp_path):
    _write(
        tmp_path,
        {
            "eng/__init__.py": "",
            "eng/core.py": (
                "_STATE = None\nclass Sched:\n    def _step(self):\n        self._live = 1\n"
            ),
            "eng/loop.py": (
                "from .core import _STATE\nfrom . import core\ndef run(s):\n    s._step()\n"
                "    return core._STATE\n"
            ),
            "eng/other.py": "import sys\ndef where():\n    return sys._getframe(0)\n",
        },
    )
    assert scan(tmp_path, ("eng",), ()) == []
