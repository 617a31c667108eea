"""Covers: course.predict.

course.predict: a student's prediction set beside the measured value, in words; silent under grading."""
from __future__ import annotations

import pytest

from course import predict


@pytest.mark.parametrize("guess, actual, words", [
    (3, 3, "right, within 5%"),
    (3.1, 3, "right, within 5%"),
    (2, 3, "33% too low, 0.67× the measured value"),
    (6, 3, "100% too high, 2× the measured value"),
    (-1, 3, "133% too low."),
    (0, 0, ": right."),
    (1, 0, "measured nothing, and you predicted 1"),
])
def test_which_way_and_how_far(guess, actual, words):
    line = predict.verdict(guess, actual, "the root's bytes", unit="tensors")
    assert line.startswith(f"**the root's bytes:** you predicted {guess:.3g} tensors")
    assert words in line


def test_no_prediction_or_not_a_number_says_what_to_do():
    assert "You wrote no prediction: put a number in place of None" in predict.verdict(None, 0.25, "the bubble")
    assert "is not a number" in predict.verdict("a quarter", 0.25, "the bubble")
    assert "is not a number" in predict.verdict(True, 1, "the bubble")
    with pytest.raises(ValueError, match="must be a finite number"):
        predict.verdict(1, float("nan"), "the bubble")


def test_the_source_of_the_value_is_named_and_a_factor_has_no_space():
    assert "computed 12" in predict.verdict(10, 12, "the crossover batch", source="computed")
    assert "you predicted 1.5×, measured 0.56×" in predict.verdict(1.5, 0.56, "the speed-up", unit="×")


def test_against_shows_markdown_and_nothing_under_grading(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda value: shown.append(value))
    predict.against(2, 3, "the root's bytes")
    assert len(shown) == 1 and "33% too low" in shown[0].data
    monkeypatch.setattr(predict, "under_grader", lambda: True)
    assert predict.against(2, 3, "the root's bytes") is None and len(shown) == 1
