"""Files of the grader's that no other user of the machine reads, written without following a link.

Used by grader.judge.client (the judge's running cell and required checks) and grader.grading
(the work folder's receipts, run file, recorded values).
"""
from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, text: str, group: int | None = None) -> None:
    """path, with text, readable by its owner alone, or by `group` too (0640), never written through a
    link planted there: made new beside it, then put in its place at once."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "w",
                   encoding="utf-8") as f:
        if group is not None:
            os.fchown(f.fileno(), -1, group)
            os.fchmod(f.fileno(), 0o640)
        f.write(text)
    tmp.replace(path)
