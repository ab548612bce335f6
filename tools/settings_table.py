"""The README's table of MINISGL_* environment variables, rendered from their definitions
(minisgl/env.py and judge/settings.py), so the list cannot fall behind:

    python -m tools.settings_table           # print it
    python -m tools.settings_table --write   # put it into README.md, between its markers

tests/test_settings.py fails when README.md's copy differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from judge import settings as judge_settings
from minisgl import env

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- settings: python -m tools.settings_table --write -->", "<!-- /settings -->"


def table() -> str:
    return env.markdown_table(env.SETTINGS + judge_settings.SETTINGS)


def readme_block(text: str) -> str | None:
    """What README.md holds between the markers, or None without them."""
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def main(argv) -> int:
    if "--write" not in argv:
        print(table())
        return 0
    text = README.read_text(encoding="utf-8")
    if readme_block(text) is None:
        print(f"README.md has no {BEGIN} ... {END} markers", file=sys.stderr)
        return 1
    head, rest = text.split(BEGIN, 1)
    README.write_text(f"{head}{BEGIN}\n{table()}\n{END}{rest.split(END, 1)[1]}", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
