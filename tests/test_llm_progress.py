"""`LLM.generate`'s progress bar (minisgl/llm/progress_bar.py): where it shows, and that it counts
tokens."""

from __future__ import annotations

import pytest

from helpers import build_llm
from minisgl import SamplingParams
from minisgl.env import ENV
from minisgl.llm import progress_bar as progress


@pytest.fixture
def drawn(monkeypatch):
    """Every draw of the terminal bar, as (tokens done, tokens made, requests finished); no
    output."""
    seen = []

    class Recorder:
        shown = False

        def draw(self, done, tokens, finished, total, requests, elapsed):
            self.shown = True
            seen.append((done, tokens, finished, total))

        def close(self, tokens, requests, elapsed):
            seen.append(("closed", tokens))

    monkeypatch.setattr(progress, "_Bar", lambda notebook: Recorder())
    monkeypatch.setattr(progress, "_in_notebook", lambda: False)
    monkeypatch.setattr(progress, "EVERY", 0.0)
    return seen


def test_no_bar_by_default_under_pytest(monkeypatch, drawn):
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    monkeypatch.setattr(progress, "DELAY", 0.0)
    llm = build_llm()
    llm.generate(["ROMEO:"] * 4, SamplingParams(max_tokens=8))
    assert drawn == [], (
        f"expected no progress bar under pytest by default, got {len(drawn)} draw(s)"
    )


def test_off_means_off_even_when_asked(monkeypatch, drawn):
    monkeypatch.setattr(ENV.PROGRESS, "value", "off")
    llm = build_llm()
    llm.generate(["ROMEO:"] * 2, SamplingParams(max_tokens=4), progress=True)
    assert drawn == [], f"expected no bar with MINISGL_PROGRESS=off, got {len(drawn)} draw(s)"


def test_the_bar_counts_tokens_and_ends_full(drawn):
    llm = build_llm()
    out = llm.generate(
        ["ROMEO:", "JULIET:", "KING:"],
        SamplingParams(max_tokens=12, ignore_eos=True),
        progress=True,
    )
    draws = [d for d in drawn if d[0] != "closed"]
    assert draws, "expected the bar to be drawn while generating, it never was"
    moving = [d for d in draws if d[2] == 0 and d[0] > 0]
    assert moving, (
        f"expected the bar to move before any request finished; it showed {draws[:3]} ..."
    )
    assert all(d[3] == 36 for d in draws), (
        f"expected a total of 36 tokens (3 x 12), saw {draws[0][3]}"
    )
    made = sum(len(o["token_ids"]) for o in out)
    assert drawn[-1] == ("closed", made), (
        f"expected the bar closed with {made} tokens, got {drawn[-1]}"
    )
