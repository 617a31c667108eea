"""nbgrader's receipts of a submission, kept beside its feedback page so that the feedback goes back.

On a JupyterHub (deploy/hub/), a student's Submit leaves two small files beside the notebook in
nbgrader's exchange, which formgrader's Collect copies into grader/work/collected/<student>/<lab>/:
`timestamp.txt` and `submission_secret.txt`. nbgrader's release_feedback (formgrader's Release
Feedback) reads them beside each feedback page, and files the page in the exchange under a hash of
the secret, where only that student's Assignment List finds it. `python -m grader grade` writes its
own feedback pages, so it puts the receipts there (`keep`).
"""
from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime
from pathlib import Path

from .collect import Submission

#: nbgrader's receipts beside a notebook that formgrader collected (<student>/<lab>/<lab>.ipynb): when it was
#: handed in, and the secret that nbgrader's release_feedback files its feedback under and the student's
#: Assignment List finds it by. The student's nbgrader wrote them, so each must look like one.
RECEIPTS = {"timestamp.txt": re.compile(r"[0-9][0-9 :.+TZUC-]{0,63}"),
            "submission_secret.txt": re.compile(r"[0-9A-Za-z_-]{1,256}")}
#: What stands in for a receipt that is missing or is not nbgrader's (a stand-in secret is one nobody holds).
STAND_INS = {"timestamp.txt": lambda: datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC"),
             "submission_secret.txt": lambda: secrets.token_hex(64)}


def keep(submission: Submission, feedback_dir: Path) -> list[str]:
    """Write nbgrader's receipts of a submission beside its feedback page, where release_feedback reads
    them; returns the names of those kept from the submission. A receipt that is missing (a notebook not
    handed in through the exchange) or is not a plain small file of nbgrader's form gets a stand-in:
    release_feedback stops at the first page without both, which would keep the rest of the class's
    pages from them, and a page filed under a stand-in secret reaches nobody."""
    kept = []
    if not feedback_dir.is_dir():
        return kept  # no page was written
    for name, form in RECEIPTS.items():
        text = _receipt(submission.path.parent / name) if submission.path.parent.name == submission.lab else None
        if text is not None and form.fullmatch(text):
            kept.append(name)
        else:
            text = STAND_INS[name]()
        (feedback_dir / name).write_text(text, encoding="utf-8")
    return kept


def _receipt(path: Path) -> str | None:
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 300:
            return None
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
