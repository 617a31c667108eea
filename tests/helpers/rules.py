"""The rules an exercise's text states, each beside the planted mistake that breaks it.

A lab's fairness data (tests/test_labN_grading.py) has a rule table, RULES:

    RULES = {
        "moe_forward": {                                   # the exercise (its answer cell's grade_id)
            "Run each expert **once**": "each expert called once per token",   # a MISTAKES name
            "Gradients must reach `x`, `weights`, `w1` and `w2`": ("...", "..."),  # or several
            "returns at once with a request": NotARule("says what isend does, asks nothing"),
        },
    }

Each phrase is quoted from the exercise's text (`exercise_texts`: the markdown from its
"## Exercise" heading to its answer cell, and the released answer cell itself, docstring and
comments). Each rule names the planted mistakes that break it: MISTAKES entries whose test
cell is that exercise's, so the fairness test already asserts that each costs exactly that
exercise. A phrase that holds a keyword but asks nothing of the student's code says so
(NotARule, and why). A rule that cannot be tested is dropped from the text or rephrased:
the table has no third kind.

`problems` says what the test finds wrong: every graded exercise has a table; every phrase is in its text; every
mistake named exists and is its exercise's; and every sentence of the text with one of
KEYWORDS (must, once, in place, only) holds a phrase of the table.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import nbformat

from . import REPO


@dataclass(frozen=True)
class NotARule:
    """A phrase with a keyword that states no rule for the student's code: why not."""
    why: str


#: Words that state a rule a test must hold: a sentence holding one needs an entry. "at once" (at the same
#: time) and "only then" are left out; "in place" is in either spelling.
KEYWORDS = re.compile(r"\b(must|(?<!at )once|in[ -]place|only(?! then))\b", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+(?=[A-Z`(*_\"'$])|\n\s*\n|\n(?=\s*(?:[-*] |\d+\. |#))")


def _flat(text: str) -> str:
    return " ".join(text.split())


def exercise_texts(lab: str) -> dict[str, str]:
    """{answer cell's grade_id: its exercise's text} for the code answers of the released lab."""
    nb = nbformat.read(REPO / "labs" / lab / f"{lab}.ipynb", as_version=4)
    texts, since_heading = {}, None
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "markdown" and not meta:
            lines = cell.source.splitlines()
            last = max((i for i, line in enumerate(lines) if line.startswith("## ")), default=None)
            if last is not None and lines[last].startswith("## Exercise"):   # its text runs from its heading
                since_heading = ["\n".join(lines[last:])]
            elif last is not None:                        # a section of another kind: no exercise's text
                since_heading = None
            elif since_heading is not None:
                since_heading.append(cell.source)
        elif cell.cell_type == "code" and meta.get("solution"):
            assert since_heading is not None, f"{lab}: answer {meta.get('grade_id')} has no '## Exercise' heading"
            texts[meta["grade_id"]] = "\n\n".join([*since_heading, cell.source])
            since_heading = since_heading[:1]             # a second answer of the exercise: its heading, then its own
    return texts


def keyword_sentences(text: str) -> list[str]:
    """The sentences of `text` (whitespace flattened) that hold one of KEYWORDS."""
    return [_flat(s) for s in _SENTENCE_END.split(text) if KEYWORDS.search(s)]


def problems(lab: str, rules: dict[str, dict], mistakes: dict) -> list[str]:
    """What is wrong with a lab's rule table (empty: nothing)."""
    texts = exercise_texts(lab)
    found = []
    for exercise in sorted(set(texts) - set(rules)):
        found.append(f"{exercise}: no rule table (list the rules its text states, and the mistakes that break them)")
    for exercise in sorted(set(rules) - set(texts)):
        found.append(f"{exercise}: a rule table for no exercise of {lab}")
    for exercise, table in rules.items():
        if exercise not in texts:
            continue
        text = _flat(texts[exercise])
        if not any(not isinstance(what, NotARule) for what in table.values()):
            found.append(f"{exercise}: no rule with a mistake (every exercise states at least what it computes)")
        for phrase, what in table.items():
            if _flat(phrase) not in text:
                found.append(f"{exercise}: {phrase!r} is not in the exercise's text")
            if isinstance(what, NotARule):
                if not what.why.strip():
                    found.append(f"{exercise}: {phrase!r} is no rule, but says not why")
                continue
            for name in (what,) if isinstance(what, str) else what:
                if name not in mistakes:
                    found.append(f"{exercise}: {phrase!r} names {name!r}, which is not a planted mistake")
                elif mistakes[name][1] != f"test_{exercise}":
                    found.append(f"{exercise}: {phrase!r} names {name!r}, a mistake of {mistakes[name][1]}")
        phrases = [_flat(phrase) for phrase in table]
        for sentence in keyword_sentences(texts[exercise]):
            if not any(phrase in sentence or sentence in phrase for phrase in phrases):
                found.append(f"{exercise}: {sentence[:160]!r} states a rule ({KEYWORDS.search(sentence)[0]!r}) "
                             f"that the table does not list")
    return found
