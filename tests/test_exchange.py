"""Covers: grader.grading.exchange, grader.grading.plain_copy, grader.grading.feedback_release.

The course's collect (grader/grading/exchange.py): a submission is taken only from the student it names.

nbgrader's exchange keeps inbound/ writable by every student. Played here with real files owned by
real (unused) uids, as root, the Unix users looked up in a mapping of the test's: a folder in another
student's name, one dated 2099, a notebook that is a link, a hard link, a fifo, a file of another
owner, a folder over the size cap; each is refused with an error line in the log that formgrader's
Collect dialog shows (nbgrader's capture_log, as formgrader calls it), and each student's latest
accepted submission is the one collected, with the manifest that receipts.py trusts. tests/test_hub.py
plays the same attacks on a real hub, as real users, in a browser.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nbgrader.auth import Authenticator
from nbgrader.coursedir import CourseDirectory
from nbgrader.utils import capture_log, notebook_hash
from traitlets.config import Config

from grader.grading import exchange
from grader.grading.feedback_release import FeedbackRelease
from helpers import REPO, collecting

COURSE, LAB = collecting.COURSE, collecting.LAB
UIDS = {"ada": 47001, "bo": 47002}  # unused on a test machine: files are chowned to them
TEACHER_UID = 47000
SECRET = "ab12" * 32

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the submissions' files are chowned to other uids: "
                                                          "run as root")


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M:%S.%f UTC")


def _submit(inbound: Path, claimed: str, owner: str, when: datetime, notebook: str = '{"cells": []}',
            tag: str = "r4nd0m") -> Path:
    """A submission as nbgrader's submit leaves it: <claimed>+<lab>+<timestamp>+<random>/, owned by owner."""
    folder = inbound / f"{claimed}+{LAB}+{_stamp(when)}+{tag}"
    folder.mkdir()
    (folder / f"{LAB}.ipynb").write_text(notebook)
    (folder / "timestamp.txt").write_text(_stamp(when))
    (folder / "submission_secret.txt").write_text(SECRET if owner == claimed else "f0" * 64)
    _chown(folder, UIDS[owner])
    return folder


def _chown(folder: Path, uid: int) -> None:
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, uid, uid, follow_symlinks=False)


@pytest.fixture
def world(tmp_path):
    """An exchange with an inbound folder writable by all, and a course to collect into."""
    return _world(tmp_path)


def _world(tmp_path: Path) -> tuple[Path, Path]:
    inbound = tmp_path / "exchange" / COURSE / "inbound"
    inbound.mkdir(parents=True)
    os.chmod(tmp_path / "exchange", 0o1777)
    os.chmod(inbound, 0o2733)
    course = tmp_path / "course"
    course.mkdir()
    return inbound, course


def _collect(tmp_path: Path, course: Path, update: bool = False, **config) -> tuple[dict, str]:
    """One collect as formgrader's Collect runs it: (nbgrader's result, its log)."""
    return collecting.collect(tmp_path / "exchange", course, UIDS, update, **config)


def _collected(course: Path, student: str) -> Path:
    return course / "collected" / student / LAB


def _now() -> datetime:
    """This moment, read when a test makes its folders (a module's import can be minutes before)."""
    return datetime.now(UTC).replace(tzinfo=None)


def test_a_folder_in_another_student_s_name_is_refused_and_the_real_one_collected(tmp_path, world):
    inbound, course = world
    _submit(inbound, "ada", "ada", _now() - timedelta(hours=1), notebook='{"honest": 1}')
    forged = _submit(inbound, "ada", "bo", datetime(2025, 1, 1) + (_now() - datetime(2025, 1, 1)) / 2,
                     notebook='{"blank": 1}', tag="forged")  # older than now, newer than nothing: owner decides
    forged_later = _submit(inbound, "ada", "bo", _now() - timedelta(minutes=1), notebook='{"blank": 1}', tag="later")
    result, log = _collect(tmp_path, course)
    assert result["success"], result.get("error")
    assert (_collected(course, "ada") / f"{LAB}.ipynb").read_text() == '{"honest": 1}'
    assert (_collected(course, "ada") / "submission_secret.txt").read_text() == SECRET
    for folder in (forged, forged_later):  # each named, with whom it claims and who made it, and what to do
        line = next(line for line in log.splitlines() if line.startswith(f"[ERROR] Refused {folder.name!r}"))
        assert "it claims to be ada's, but its owner is uid 47002" in line
        assert line.endswith("ask ada to submit again if theirs is missing.")
    assert f"[ERROR] 2 submissions refused (above): a folder that is not its student's own Submit can be removed " \
           f"from {inbound}" in log
    manifest = json.loads(exchange.manifest_path(course / "collected" / "ada", LAB).read_text())
    assert manifest["owner_uid"] == UIDS["ada"] and manifest["student"] == "ada" and manifest["lab"] == LAB
    assert manifest["inbound"].endswith("+r4nd0m")
    assert set(manifest["receipts"]) == {"timestamp.txt", "submission_secret.txt"}
    assert not (course / "collected" / "bo").exists()


def test_a_timestamp_from_the_future_is_refused_beyond_the_clock_allowance(tmp_path, world):
    inbound, course = world
    _submit(inbound, "ada", "ada", _now() - timedelta(hours=2), notebook='{"first": 1}', tag="first")
    future = _submit(inbound, "ada", "ada", datetime(2099, 1, 1), notebook='{"future": 1}', tag="future")
    _submit(inbound, "bo", "bo", _now() + exchange.CLOCK_ALLOWANCE / 2, notebook='{"skewed": 1}')  # within it
    result, log = _collect(tmp_path, course)
    assert result["success"], result.get("error")
    assert (_collected(course, "ada") / f"{LAB}.ipynb").read_text() == '{"first": 1}'
    assert (_collected(course, "bo") / f"{LAB}.ipynb").read_text() == '{"skewed": 1}'
    assert f"Refused {future.name!r}" in log and "2099-01-01 00:00:00 UTC, is past this machine's clock" in log
    assert "by more than 5 minutes" in log
    # ada's first, dated two hours before its folder was made: collected, and flagged as a claim
    assert "[WARNING] 'ada+08_experts+" in log and "its date is the student's claim" in log
    assert not any("'bo+" in line and "claim" in line for line in log.splitlines())


@pytest.mark.parametrize("plant, words", [
    (lambda f, t: (f / f"{LAB}.ipynb").unlink() or (f / f"{LAB}.ipynb").symlink_to(t), "symbolic link"),
    (lambda f, t: (f / "notes").mkdir() or (f / "notes" / "x.py").symlink_to(t), "symbolic link"),
    (lambda f, t: (f / "folder-link").symlink_to(t.parent, target_is_directory=True), "symbolic link"),
    (lambda f, t: os.link(f / f"{LAB}.ipynb", f.parent / "elsewhere"), "has 2 hard links"),
    (lambda f, t: os.mkfifo(f / "pipe"), "fifo"),
    (lambda f, t: os.chown(f / f"{LAB}.ipynb", UIDS["ada"], UIDS["ada"]), "belongs to uid 47001"),
], ids=["notebook is a link", "a link in a subfolder", "a folder that is a link", "a hard link", "a fifo",
        "a file of another student"])
def test_a_submission_holding_anything_but_its_owner_s_plain_files_is_refused(tmp_path, world, plant, words):
    inbound, course = world
    solution = tmp_path / "instructor" / "solution.ipynb"
    solution.parent.mkdir()
    solution.write_text('{"the": "solution"}')
    os.chmod(solution, 0o600)
    _submit(inbound, "bo", "bo", _now() - timedelta(hours=1), notebook='{"bo": "blank"}', tag="honest")
    attack = _submit(inbound, "bo", "bo", _now() - timedelta(minutes=5), tag="attack")
    plant(attack, solution)
    for path in [attack, *attack.rglob("*")]:  # what the plant made is bo's, as bo would have made it
        if path.lstat().st_uid == 0:
            os.chown(path, UIDS["bo"], UIDS["bo"], follow_symlinks=False)
    result, log = _collect(tmp_path, course)
    assert result["success"], result.get("error")
    line = next(line for line in log.splitlines() if line.startswith(f"[ERROR] Refused {attack.name!r}"))
    assert words in line, line
    collected = _collected(course, "bo")
    assert (collected / f"{LAB}.ipynb").read_text() == '{"bo": "blank"}'  # bo's earlier, honest one
    assert not any("solution" in p.read_text() for p in collected.rglob("*") if p.is_file())
    assert all(stat.S_ISREG(p.lstat().st_mode) or stat.S_ISDIR(p.lstat().st_mode) for p in collected.rglob("*"))


def test_only_refused_submissions_collect_nothing_and_say_so(tmp_path, world):
    inbound, course = world
    attack = _submit(inbound, "bo", "bo", _now() - timedelta(minutes=5))
    (attack / f"{LAB}.ipynb").unlink()
    (attack / f"{LAB}.ipynb").symlink_to("/etc/shadow")
    _submit(inbound, "ada", "ada", _now() - timedelta(minutes=5))
    (inbound / f"nobody-here+{LAB}+{_stamp(_now())}+x").mkdir()  # a name with no Unix user
    (inbound / f"ada+{LAB}+not a time+x").mkdir()             # nbgrader's collect failed on the whole class
    result, log = _collect(tmp_path, course)
    assert result["success"], result.get("error")
    assert "Nothing of bo collected" in log and not (course / "collected" / "bo" / LAB).exists()
    assert "no Unix user of this machine is named nobody-here" in log
    assert "'not a time' is no time" in log
    assert (_collected(course, "ada") / f"{LAB}.ipynb").is_file()
    assert not list((course / "collected").glob("*/.*collecting*"))  # no staging folder left behind


def test_a_link_swapped_in_after_the_listing_is_not_followed(tmp_path, world, monkeypatch):
    """The copy opens what it listed with O_NOFOLLOW: a link that replaced a plain file between the listing
    and the open (here: a listing that lies) is refused, not read."""
    inbound, course = world
    attack = _submit(inbound, "bo", "bo", _now() - timedelta(minutes=5))
    (attack / f"{LAB}.ipynb").unlink()
    (attack / f"{LAB}.ipynb").symlink_to("/etc/shadow")
    real_stat = os.stat

    def lying_stat(path, *args, dir_fd=None, follow_symlinks=True):
        info = real_stat(path, *args, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
        if path == f"{LAB}.ipynb" and not follow_symlinks:  # "a plain file" when listed
            return os.stat_result((stat.S_IFREG | 0o644, *tuple(info)[1:]))
        return info

    monkeypatch.setattr(exchange.os, "stat", lying_stat)
    result, log = _collect(tmp_path, course)
    assert result["success"], result.get("error")
    assert "could not be opened as it was listed (a symbolic link)" in log
    assert not (course / "collected" / "bo" / LAB).exists()


def test_the_size_cap_refuses_one_submission_and_ignore_patterns_are_kept(tmp_path, world):
    inbound, course = world
    big = _submit(inbound, "bo", "bo", _now() - timedelta(minutes=5), notebook="x" * 5000)
    ada = _submit(inbound, "ada", "ada", _now() - timedelta(minutes=5))
    (ada / ".ipynb_checkpoints").mkdir()
    (ada / ".ipynb_checkpoints" / "old.ipynb").write_text("{}")
    _chown(ada, UIDS["ada"])
    result, log = _collect(tmp_path, course, max_dir_size=4)  # kB, as nbgrader counts it
    assert result["success"], result.get("error")
    assert f"Refused {big.name!r}" in log and "more than 4000 bytes (CourseDirectory.max_dir_size)" in log
    assert not (_collected(course, "ada") / ".ipynb_checkpoints").exists()
    assert (_collected(course, "ada") / f"{LAB}.ipynb").is_file()


def test_update_takes_a_newer_accepted_submission_and_never_a_refused_one(tmp_path, world):
    inbound, course = world
    first = _submit(inbound, "ada", "ada", _now() - timedelta(hours=2), notebook='{"v": 1}', tag="one")
    (first / "timestamp.txt").write_text("garbage a student wrote")  # read back by the next collect
    assert _collect(tmp_path, course)[0]["success"]
    _submit(inbound, "ada", "bo", _now() - timedelta(minutes=2), notebook='{"forged": 1}', tag="forged")
    result, log = _collect(tmp_path, course, update=True)
    assert result["success"], result.get("error")
    assert "No newer submission to collect: ada" in log
    assert (_collected(course, "ada") / f"{LAB}.ipynb").read_text() == '{"v": 1}'
    _submit(inbound, "ada", "ada", _now() - timedelta(minutes=1), notebook='{"v": 2}', tag="two")
    result, log = _collect(tmp_path, course, update=True)
    assert result["success"] and "Updating submission: ada" in log, log
    assert (_collected(course, "ada") / f"{LAB}.ipynb").read_text() == '{"v": 2}'
    manifest = json.loads(exchange.manifest_path(course / "collected" / "ada", LAB).read_text())
    assert manifest["inbound"].endswith("+two")


def _as_uid(uid: int, work) -> str:
    """What work() returns (text), run in a child process that is uid and nothing more."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.close(read)
            import sqlite3  # noqa: F401  (this Python's library may lie where only root reads: loaded first)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.write(write, work().encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        reported = pipe.read()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and reported, f"the process of uid {uid} did not finish"
    return reported


@pytest.fixture
def open_folder():
    """A folder other uids can reach (pytest's own is root's alone)."""
    base = Path(tempfile.mkdtemp())
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base)


def test_the_instructor_collects_without_root(open_folder):
    """As the instructor runs it (formgrader, their own uid): the students' 0644 files in 0755 folders."""
    inbound, course = _world(open_folder)
    for student in UIDS:
        folder = _submit(inbound, student, student, _now() - timedelta(minutes=5), notebook=f'{{"{student}": 1}}')
        for path in [folder, *folder.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
    collecting.blank_gradebook(course / "gradebook.db")
    for path in (inbound, course, course / "gradebook.db"):
        os.chown(path, TEACHER_UID, TEACHER_UID)

    def collect() -> str:
        result, log = _collect(open_folder, course)
        return json.dumps({"success": result["success"], "log": log, "error": result.get("error")})

    reported = _as_uid(TEACHER_UID, collect)
    assert json.loads(reported)["success"], reported
    for student in UIDS:
        notebook = _collected(course, student) / f"{LAB}.ipynb"
        assert notebook.read_text() == f'{{"{student}": 1}}' and notebook.stat().st_uid == TEACHER_UID
        assert stat.S_IMODE(notebook.stat().st_mode) == 0o600


def test_a_private_feedback_page_is_released_readable_by_its_name_alone(open_folder):
    """The grader keeps its pages 0600; nbgrader's release_feedback copied that mode into the exchange,
    where the student's Fetch Feedback could not read it."""
    course = open_folder / "course"
    page_dir = course / "feedback" / "ada" / LAB
    page_dir.mkdir(parents=True)
    for name, text in ((f"{LAB}.html", "<p>ada's page</p>"), ("timestamp.txt", _stamp(_now())),
                       ("submission_secret.txt", SECRET)):
        (page_dir / name).write_text(text)
        os.chmod(page_dir / name, 0o600)
    (open_folder / "exchange").mkdir(mode=0o1777)
    os.chmod(open_folder / "exchange", 0o1777)
    coursedir = CourseDirectory(root=str(course), course_id=COURSE, assignment_id=LAB, feedback_directory="feedback")
    release = FeedbackRelease(coursedir=coursedir, authenticator=Authenticator(), root=str(open_folder / "exchange"))
    result = capture_log(release)
    assert result["success"], result.get("error")
    filed = open_folder / "exchange" / COURSE / "feedback"
    page = filed / f"{notebook_hash(secret=SECRET, notebook_id=LAB)}.html"
    assert stat.S_IMODE(page.stat().st_mode) == 0o644 and stat.S_IMODE(filed.stat().st_mode) == 0o711

    def fetch() -> str:
        try:
            os.listdir(filed)
            listed = "listed"
        except PermissionError:
            listed = "not listed"
        return f"{listed}: {page.read_text()}"

    assert _as_uid(UIDS["ada"], fetch) == "not listed: <p>ada's page</p>"


def test_the_course_s_config_plugs_the_strict_collect_into_nbgrader():
    from nbgrader.exchange import ExchangeFactory

    c = Config()
    source = REPO / "nbgrader_config.py"
    exec(compile(source.read_text(), str(source), "exec"), {"get_config": lambda: c, "__file__": str(source)})
    assert ExchangeFactory(config=c).collect is exchange.StrictCollect
    assert ExchangeFactory(config=c).release_feedback is FeedbackRelease
