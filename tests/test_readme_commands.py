"""The README's two commands are what CI runs first, in a fresh virtual environment
(tools/readme_commands.py reads them from the README): if their shape changes so that the tool
cannot find them, or CI stops reading them, a test fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.readme_commands import ReadmeCommandError, readme_command

REPO = Path(__file__).resolve().parent.parent


def test_the_readme_has_a_setup_command_that_installs_the_workbook_and_runs_the_judge():
    setup = readme_command("setup")
    assert setup.startswith("pip install ") and '-e ".[workbook]"' in setup, setup
    assert "python judge.py ch" in setup, f"the set-up command runs no judge: {setup}"


def test_the_readme_has_a_test_command_that_runs_pytest():
    assert readme_command("test").startswith("python -m pytest"), readme_command("test")


def test_ci_runs_the_readmes_commands_before_installing_anything_else():
    ci = (REPO / ".ci" / "run").read_text()
    reads = [ci.find("tools.readme_commands setup"), ci.find("tools.readme_commands test")]
    assert -1 not in reads, ".ci/run does not read the README's commands with tools.readme_commands"
    first_install = ci.find("pip install")
    assert first_install == -1 or max(reads) < first_install, (
        ".ci/run installs something before it runs the README's commands as a newcomer would"
    )


@pytest.mark.parametrize(
    "readme, problem",
    [
        ("# no markers\n```bash\npython -m pytest\n```\n", "found 0"),
        ("<!-- newcomer: test -->\n```bash\npip install x\npython -m pytest\n```\n", "found 2"),
        ("<!-- newcomer: test -->\nRun:\n```bash\npython -m pytest\n```\n", "found 0"),
    ],
)
def test_a_readme_whose_command_lost_its_shape_is_refused_naming_the_marker(readme, problem):
    with pytest.raises(ReadmeCommandError, match=problem):
        readme_command("test", readme)
