"""nbgrader's Release Feedback, each page released readable by the student it is filed for.

The grader keeps its feedback pages private to the grading account (0600 in grader/work/feedback/), and
nbgrader 0.9.6's release_feedback copies each with shutil.copy, mode and all: in the exchange the page
stayed 0600, the instructor's, and the student's Fetch Feedback (running as the student) was refused.
`FeedbackRelease` (c.ExchangeFactory.release_feedback in nbgrader_config.py) makes each released page
0644 in nbgrader's feedback folder, which release_feedback keeps at 0711: no one can list it, and a page
is reached only by its name, a hash of its student's submission secret, as nbgrader intends.

Standard library and nbgrader only: the instructor's formgrader imports it from their copy of the course.
"""
from __future__ import annotations

import os
import stat

from nbgrader.exchange.default.release_feedback import ExchangeReleaseFeedback

PAGE_MODE = 0o644


class FeedbackRelease(ExchangeReleaseFeedback):
    """nbgrader's release_feedback, then each page in the exchange's feedback folder made readable."""

    def copy_files(self):
        super().copy_files()
        folder = os.open(self.dest_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for name in os.listdir(folder):
                if name.endswith(".html"):
                    _readable(folder, name)
        finally:
            os.close(folder)


def _readable(folder: int, name: str) -> None:
    """The page `name` of the folder, PAGE_MODE, through a descriptor: never through a link planted there."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        return  # a link, or gone: nbgrader's pages are plain files
    try:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != PAGE_MODE:
            os.fchmod(fd, PAGE_MODE)
    finally:
        os.close(fd)
