"""nbgrader's receipts of a submission, kept beside its feedback page so that the feedback goes back.

On a JupyterHub (deploy/hub/), a student's Submit leaves two small files beside the notebook in
nbgrader's exchange, which formgrader's Collect copies into grader/work/collected/<student>/<lab>/:
`timestamp.txt` and `submission_secret.txt`. nbgrader's release_feedback (formgrader's Release
Feedback) reads them beside each feedback page, and files the page in the exchange under a hash of
the secret, where only that student's Assignment List finds it. `python -m grader grade` writes its
own feedback pages, so it puts the receipts there (`keep`).

A receipt is the student's own only where the course's collect (grader.grading.exchange) took the
folder from the Unix user it names: nbgrader's collect took any folder in anyone's name, and a student
chose the secret another's feedback was filed under. So a receipt is kept only where the manifest that
exchange writes beside the collected folder names this student and lab and holds the receipt's digest;
each is read without following a link. Anything else gets a stand-in.
"""
from __future__ import annotations

import hashlib
import re
import secrets
from datetime import UTC, datetime
from pathlib import Path

from grader.common.private_write import write_private

from .collect import Submission
from .exchange import manifest_path, read_manifest
from .plain_copy import read_regular

#: nbgrader's receipts beside a notebook that formgrader collected (<student>/<lab>/<lab>.ipynb): when it was
#: handed in, and the secret that nbgrader's release_feedback files its feedback under and the student's
#: Assignment List finds it by. The student's nbgrader wrote them, so each must look like one.
RECEIPTS = {"timestamp.txt": re.compile(r"[0-9][0-9 :.+TZUC-]{0,63}"),
            "submission_secret.txt": re.compile(r"[0-9A-Za-z_-]{1,256}")}
#: What stands in for a receipt that is missing or is not nbgrader's (a stand-in secret is one nobody holds).
STAND_INS = {"timestamp.txt": lambda: datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC"),
             "submission_secret.txt": lambda: secrets.token_hex(64)}
MAX_RECEIPT_BYTES = 300


def keep(submission: Submission, feedback_dir: Path) -> list[str]:
    """Write nbgrader's receipts of a submission beside its feedback page, where release_feedback reads
    them; returns the names of those kept from the submission. A receipt that is missing (a notebook not
    handed in through the exchange), that the course's collect did not vouch for, or that is not a plain
    small file of nbgrader's form gets a stand-in:
    release_feedback stops at the first page without both, which would keep the rest of the class's
    pages from them, and a page filed under a stand-in secret reaches nobody."""
    kept = []
    if not feedback_dir.is_dir():
        return kept  # no page was written
    vouched = _vouched(submission)
    for name, form in RECEIPTS.items():
        text = vouched.get(name)
        if text is not None and form.fullmatch(text):
            kept.append(name)
        else:
            text = STAND_INS[name]()
        write_private(feedback_dir / name, text)  # the grading account's alone: release_feedback runs as it
    return kept


def _vouched(submission: Submission) -> dict[str, str]:
    """{name: text} of the submission's receipts that the course's collect vouches for: its manifest beside
    <student>/<lab>/ names this student and lab and holds each receipt's digest as it copied it."""
    folder = submission.path.parent
    if folder.name != submission.lab:
        return {}  # not nbgrader's layout: handed in some other way
    manifest = read_manifest(manifest_path(folder.parent, submission.lab))
    if not manifest or manifest.get("student") != submission.student or manifest.get("lab") != submission.lab \
            or not isinstance(manifest.get("receipts"), dict):
        return {}
    vouched = {}
    for name in RECEIPTS:
        try:
            raw = read_regular(folder / name, MAX_RECEIPT_BYTES)
            if hashlib.sha256(raw).hexdigest() == manifest["receipts"].get(name):
                vouched[name] = raw.decode("utf-8").strip()
        except (OSError, UnicodeDecodeError):
            continue
    return vouched
