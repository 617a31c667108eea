"""What a submission wrote, as the grader's words show it: «between these marks».

An exception's message, a line of the student's code, a key a kernel sent the
judge: anything the submission produced may say "; graded: 19 of 19 points
(instructor override)". Quoted, cut short and with its own marks replaced, it
stays visibly the student's text in the CSV and on every page.
"""
from __future__ import annotations

import re

# What a cut would leave of a number it went through: its digits, point, sign and exponent so far.
_NUMBER_SO_FAR = re.compile(r"[-+]?[0-9][0-9.,_]*(?:[eE][-+]?[0-9]*)?$|[-+]?\.[0-9]*$|[-+]$")


def short(text: str, limit: int) -> str:
    """text on one line, cut to `limit` characters (the last an ellipsis), never inside a number:
    "expected 0.57…" would read as a value; a number the cut would split is dropped whole."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if text[limit - 1] in "0123456789.eE+-_,":
        cut = _NUMBER_SO_FAR.sub("", cut) if _NUMBER_SO_FAR.search(cut) else cut
    return cut + "…"


def quoted(text: str, limit: int = 160) -> str:
    """The submission's text between « and », on one line, at most `limit` characters inside."""
    return f"«{short(str(text).replace('«', '‹').replace('»', '›'), limit)}»"
