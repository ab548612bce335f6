"""tests/refusals.py: a refusal of the wrong kind fails naming what was wanted and keeps the
learner's error as the failure's cause or context, where the judge finds the learner's line
(judge/failure_messages.learner_frame walks that chain)."""

from __future__ import annotations

import pytest

from refusals import raised, refused_as_wanted, refuses


def _lookup(name):
    return {"AbortMsg": 1}[name]  # a list name raises TypeError, not the ValueError wanted


def test_a_refusal_of_another_kind_fails_naming_the_rule_and_keeps_the_error():
    with pytest.raises(pytest.fail.Exception) as failed:
        with refuses(ValueError, "lookup(['AbortMsg'])", naming="unknown message type"):
            _lookup(["AbortMsg"])
    assert "raised TypeError" in str(failed.value)
    assert "expected a ValueError naming 'unknown message type'" in str(failed.value)
    assert isinstance(failed.value.__context__, TypeError), "the learner's error is lost"


def test_a_refusal_without_the_words_fails_naming_them():
    with pytest.raises(pytest.fail.Exception, match="naming 'unknown'"):
        with refuses(ValueError, "check()", naming="unknown"):
            raise ValueError("bad type")


def test_a_checked_refusal_fails_from_the_learners_error():
    err = raised(lambda: _lookup(["AbortMsg"]), "lookup(['AbortMsg'])")
    with pytest.raises(AssertionError, match="expected a ValueError") as failed:
        refused_as_wanted(err, isinstance(err, ValueError), "expected a ValueError")
    assert failed.value.__cause__ is err
    refused_as_wanted(err, True, "not raised when the refusal is right")
