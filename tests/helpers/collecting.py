"""The course's collect (grader/grading/exchange.py) run as formgrader's Collect runs it, in a test's folder.

    log = collect(exchange_root, course, {"ada": uid, ...}, update=False)   # nbgrader's result and its log

The Unix users it looks up are a mapping of the test's (real uids that no account needs to own). Each
course gets a blank gradebook copied from one made once a session: nbgrader makes a new one by running
its `alembic` script, a second a time.
"""
from __future__ import annotations

import atexit
import functools
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from nbgrader.auth import Authenticator
from nbgrader.coursedir import CourseDirectory
from nbgrader.utils import capture_log

from grader.grading.exchange import StrictCollect

COURSE, LAB = "course101", "08_experts"


@functools.cache
def _blank_gradebook() -> Path:
    from nbgrader.api import Gradebook

    folder = Path(tempfile.mkdtemp(prefix="blank-gradebook-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{path}"  # nbgrader finds `alembic` by name
    try:
        Gradebook(f"sqlite:///{folder / 'gradebook.db'}", COURSE).close()
    finally:
        os.environ["PATH"] = path
    return folder / "gradebook.db"


def blank_gradebook(target: Path) -> Path:
    shutil.copyfile(_blank_gradebook(), target)
    return target


def collect(exchange_root: Path, course: Path, uids: dict[str, int], update: bool = False,
            **coursedir) -> tuple[dict, str]:
    """One collect of LAB from exchange_root/COURSE/inbound into course/collected: (nbgrader's result, its
    log at formgrader's level, INFO), the students' uids looked up in `uids`."""
    class MappedCollect(StrictCollect):
        def uid_of(self, student):
            return uids.get(student)

    gradebook = course / "gradebook.db"
    if not gradebook.exists():
        blank_gradebook(gradebook)
    config = CourseDirectory(root=str(course), course_id=COURSE, assignment_id=LAB, submitted_directory="collected",
                             db_url=f"sqlite:///{gradebook}", **coursedir)
    app = MappedCollect(coursedir=config, authenticator=Authenticator(), root=str(exchange_root))
    app.update = update
    level = app.log.level
    app.log.setLevel(logging.INFO)
    try:
        result = capture_log(app)
    finally:
        app.log.setLevel(level)
    return result, result.get("log", "")
