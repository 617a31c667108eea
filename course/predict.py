"""Predict, then measure: a number a student writes down before a run, set beside what the run gave.

    PREDICTION = None    # in a cell of its own, before the run: replace None with your number
    ...                  # the run
    predict.against(PREDICTION, measured, "bytes the naive root sends, in tensors")

`against` shows one line of markdown: the prediction and the measured value, which way the
prediction was off and by how much (a ratio, and in percent of the measured value); without a
prediction, what to do. It grades nothing: under nbgrader it shows nothing and returns None.
`verdict` is the same line as a string, for any caller.

Used in: lab 2 (02_data_parallel), lab 3 (03_model_parallel), lab 5 (05_sharded_data_parallel),
lab 6 (06_pipeline_parallel).
"""
from __future__ import annotations

import math
import numbers

from course.grading import under_grader

#: within this share of the measured value a prediction counts as right
CLOSE = 0.05


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _shown(value: float, unit: str) -> str:
    space = "" if unit in ("", "×", "%") else " "      # 0.56×, 3 tensors
    return f"{value:.3g}{space}{unit}"


def verdict(prediction, actual, what: str, *, unit: str = "", source: str = "measured") -> str:
    """One line: the prediction against the actual value, which way and how far off."""
    value = _number(actual)
    if value is None:
        raise ValueError(f"the {source} value of {what} must be a finite number, got {actual!r}")
    guess = _number(prediction)
    if prediction is None:
        return (f"**{what}:** {source} {_shown(value, unit)}. You wrote no prediction: put a number in place "
                "of None in the prediction cell above, before running, and run both cells again.")
    if guess is None:
        return (f"**{what}:** {source} {_shown(value, unit)}. Your prediction, {prediction!r}, is not a number: "
                "write one (say 3 or 0.25) in the prediction cell.")
    head = f"**{what}:** you predicted {_shown(guess, unit)}, {source} {_shown(value, unit)}"
    if value == 0:
        return head + (": right." if guess == 0 else f": {source} nothing, and you predicted {_shown(guess, unit)}.")
    off = (guess - value) / abs(value)
    if abs(off) <= CLOSE:
        return head + f": right, within {CLOSE:.0%}."
    direction = "too high" if off > 0 else "too low"
    factor = f", {abs(guess / value):.2g}× the {source} value" if guess * value > 0 else ""
    return head + f": {abs(off):.0%} {direction}{factor}."


def against(prediction, actual, what: str, *, unit: str = "", source: str = "measured") -> None:
    """Display `verdict(...)` as markdown; nothing under grading."""
    if under_grader():
        return
    from IPython.display import Markdown, display
    display(Markdown(verdict(prediction, actual, what, unit=unit, source=source)))
