"""The README's two commands, read from the README itself, so that CI runs exactly what a
newcomer copies and the two can never drift apart.

Each command is the one-line ```bash block that follows an HTML comment naming it (invisible on
GitHub and on the site): `<!-- newcomer: setup -->` before the set-up command, `<!-- newcomer:
test -->` before the test command.

    python3 -m tools.readme_commands setup   # prints the set-up command
    python3 -m tools.readme_commands test    # prints the test command

Standard library only: CI runs it before anything is installed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
KINDS = ("setup", "test")


class ReadmeCommandError(ValueError):
    """The README no longer has a command where the tool looks (the message says what to fix)."""


def readme_command(kind: str, text: str | None = None) -> str:
    """The README's `kind` command ("setup" or "test"): the single line of the ```bash block right
    after its `<!-- newcomer: kind -->` comment."""
    if kind not in KINDS:
        raise ReadmeCommandError(f"unknown command {kind!r}: the README has {', '.join(KINDS)}")
    text = README.read_text(encoding="utf-8") if text is None else text
    found = re.findall(rf"<!-- newcomer: {kind} -->\s*\n```bash\n(.*?)```", text, re.DOTALL)
    if len(found) != 1:
        raise ReadmeCommandError(
            f"README.md must have exactly one ```bash block right after `<!-- newcomer: {kind} -->`"
            f" (found {len(found)}): CI runs that block as a newcomer would"
        )
    lines = [line for line in found[0].splitlines() if line.strip()]
    if len(lines) != 1:
        raise ReadmeCommandError(
            f"the README's {kind} command must be one line a newcomer copies, found {len(lines)}"
        )
    return lines[0].strip()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(f"usage: python3 -m tools.readme_commands {'|'.join(KINDS)}", file=sys.stderr)
        return 2
    try:
        print(readme_command(argv[0]))
    except ReadmeCommandError as e:
        print(f"tools.readme_commands: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
