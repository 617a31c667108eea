"""What a submission wrote, as the grader's words show it: «between these marks».

An exception's message, a line of the student's code, a key a kernel sent the
judge: anything the submission produced may say "; graded: 19 of 19 points
(instructor override)". Quoted, cut short and with its own marks replaced, it
stays visibly the student's text in the CSV and on every page.
"""
from __future__ import annotations


def short(text: str, limit: int) -> str:
    """text on one line, cut to `limit` characters (the last an ellipsis)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def quoted(text: str, limit: int = 160) -> str:
    """The submission's text between « and », on one line, at most `limit` characters inside."""
    return f"«{short(str(text).replace('«', '‹').replace('»', '›'), limit)}»"
