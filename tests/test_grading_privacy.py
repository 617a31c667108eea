"""Covers: the grading host's privacy, grader.common.private_write.

The grading host's other users are outside the boundary: nothing a grading run makes is theirs to read,
write, connect to or signal.

A process of an unrelated uid (a student with a terminal on the hub, another account on a cluster)
watches a class being graded with `python -m grader grade`, as the red team's did: it lists /tmp for
the jails' folders (`/tmp/grader-*`) and reads every file it knows or finds there (the judge's log and
running cell, the required checks, the gradebook's copy, the kernel's console and the jail's spec),
connects to every judge socket the kernel lists (/proc/net/unix) and sends each hidden check a wrong
value, signals every process of the jails' uids, and reads and writes the work folder (the recorded
reference values and seed, the gradebook, grades, status, logs, feedback pages and receipts). It
tries until the grading has ended; any attempt that succeeds fails the test. The unit tests below hold
the modes that make it so, piece by piece.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import select
import shutil
import signal
import socket
import stat
import tempfile
import time
from pathlib import Path

import pytest

from course import grading
from grader.grading.workspace import NOT_THE_GRADERS, Workspace, lab_infos, private_files, tighten
from grader.jail import bwrap
from grader.jail.uids import BASE_UID, UID_COUNT
from helpers import REPO, needs_jail
from helpers.submissions import grade_class, solved

LAB = "01_single_gpu"
WATCHER_UID = 60917              # no account's, and outside the jails' leased range (grader.jail.uids)
TIMEOUT_S = 900
#: What the jail's folder holds, by name (the watcher also reads whatever it can list).
JAIL_FILES = ("judge.log", "judge-cell", "running-cell/judge-cell", "judge-required.json", "judge.out", "gradebook.db",
              "console.log", "jail.json", "autograde.log", "launcher.pid", "kernel/kernel.json")
#: What the work folder holds, by name ({lab}, {student}: filled in).
WORK_FILES = ("judge/{lab}.json", "judge/{lab}.seed.json", "gradebook.db", "grades.csv", "status.json", "run.json",
              "labs.json", "logs/judges.log", "logs/autograde-0.log", "logs/{student}/{lab}.log",
              "feedback/{student}/{lab}/{lab}.html", "feedback/{student}/{lab}/submission_secret.txt",
              "feedback/{student}/{lab}/timestamp.txt", "autograded/{student}/{lab}/{lab}.ipynb",
              "submitted/{student}/{lab}/{lab}.ipynb")


def _watch(work: Path, students: list[str], keys: list[str], done: int, report) -> None:
    """The watcher's loop, as WATCHER_UID, until `done` (a pipe's read end) reads its end: every
    attempt counted in `tried`, each that succeeded in `succeeded`; written to `report` as JSON."""
    tried: dict[str, int] = {}
    succeeded: list[str] = []
    seen_jails: set[str] = set()
    seen_sockets: set[str] = set()
    saw_work = False
    rounds = 0

    def attempt(what: str, action) -> None:
        tried[what.split(" ")[0]] = tried.get(what.split(" ")[0], 0) + 1
        try:
            action()
        except OSError:
            return
        if what not in succeeded:
            succeeded.append(what)

    def read(path: Path) -> None:
        with open(path, "rb") as f:
            f.read(1 << 16)

    def plant(path: Path) -> None:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))

    def send_wrong_values(path: str) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(5)
            connection.connect(path)   # a connection made is the wall breached, answered or not
            for key in keys[:1]:
                connection.sendall(json.dumps({"op": "check", "lab": LAB, "key": key,
                                               "value": grading.encode(-12345.0)}).encode() + b"\n")

    def listed_everything(folder: Path) -> None:
        for top, _dirs, files in os.walk(folder, onerror=_raise):
            for name in files:
                attempt(f"read {Path(top) / name}", lambda p=Path(top) / name: read(p))

    while True:
        finished = _ended(done)   # read before the round: the last round starts after the grading's end
        rounds += 1
        jails = [Path("/tmp") / name for name in os.listdir("/tmp") if name.startswith("grader-")]
        seen_jails.update(str(j) for j in jails)
        for jail in jails:
            attempt(f"list {jail}", lambda j=jail: os.listdir(j))
            attempt(f"walk {jail}", lambda j=jail: listed_everything(j))
            for name in JAIL_FILES:
                attempt(f"read {jail / name}", lambda p=jail / name: read(p))
            attempt(f"write {jail / 'planted'}", lambda j=jail: plant(j / "planted"))
            attempt(f"connect {jail / 'judge' / 'judge.sock'}",
                    lambda j=jail: send_wrong_values(str(j / "judge" / "judge.sock")))
        for path in _bound_unix_sockets():
            if "judge" in path or path.startswith("/tmp/grader-"):
                seen_sockets.add(path)
                attempt(f"connect {path}", lambda p=path: send_wrong_values(p))
        for pid in _processes_of_jail_uids():
            attempt(f"signal {pid}", lambda p=pid: os.kill(p, 0))
        if work.exists():
            saw_work = True
            attempt(f"list {work}", lambda: os.listdir(work))
            attempt(f"walk {work}", lambda: listed_everything(work))
            for pattern in WORK_FILES:
                for student in students:
                    path = work / pattern.format(lab=LAB, student=student)
                    attempt(f"read {path}", lambda p=path: read(p))
            attempt(f"write {work / 'planted'}", lambda: plant(work / "planted"))
        if finished:
            break
        time.sleep(0.02)
    json.dump({"tried": tried, "succeeded": succeeded, "jails": sorted(seen_jails),
               "sockets": sorted(seen_sockets), "saw_work": saw_work, "rounds": rounds}, report)


def _raise(error: OSError) -> None:
    raise error


def _ended(fd: int) -> bool:
    """Whether the pipe's other end is closed (its write end held by the test until the grading ended)."""
    return bool(select.select([fd], [], [], 0)[0]) and os.read(fd, 1) == b""


def _bound_unix_sockets() -> list[str]:
    """The paths of the unix sockets bound on this machine, as any user may read them (/proc/net/unix)."""
    with open("/proc/net/unix") as table:
        return [line.split()[-1] for line in table.read().splitlines()[1:] if len(line.split()) >= 8]


def _processes_of_jail_uids() -> list[int]:
    """The processes running as a uid of the jails' leased range: the kernels, their ranks, the judges."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                uid = entry.stat().st_uid
            except OSError:
                continue
            if BASE_UID <= uid < BASE_UID + UID_COUNT:
                found.append(int(entry.name))
    return found


def _start_watcher(work: Path, students: list[str], keys: list[str], report: Path) -> tuple[int, int]:
    """(pid, the write end that ends it) of the watcher, a fork of this process as WATCHER_UID."""
    done_read, done_write = os.pipe()
    out = os.open(report, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # root's: opened before the drop
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(done_write)
            os.setgroups([])
            os.setgid(WATCHER_UID)
            os.setuid(WATCHER_UID)
            with os.fdopen(out, "w") as report_file:
                _watch(work, students, keys, done_read, report_file)
            code = 0
        finally:
            os._exit(code)
    os.close(out)
    os.close(done_read)
    return pid, done_write


def _wait_for_watcher(pid: int, deadline_s: float = 120) -> int:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"the watcher did not end within {deadline_s:.0f} s of the grading's end")


def _unused(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return True
    return False


@pytest.mark.grading
@needs_jail()
@pytest.mark.skipif(os.geteuid() != 0, reason="another uid can only be played by root (fork and setuid)")
@pytest.mark.timeout(TIMEOUT_S)
def test_another_user_of_the_machine_reads_writes_and_reaches_nothing_of_a_grading_run(tmp_path):
    assert _unused(WATCHER_UID), f"uid {WATCHER_UID} belongs to an account here: pick an unused one"
    students = ["honest", "receipted"]
    submissions = tmp_path / "class"                    # the students' own files: not the grader's to guard
    for student in students:
        # nbgrader's layout, with its receipts, for the second: receipts land beside its feedback page
        place = submissions / student / LAB if student == "receipted" else submissions / student
        place.mkdir(parents=True)
        (place / f"{LAB}.ipynb").write_text(json.dumps(solved(LAB)), encoding="utf-8")
    (submissions / "receipted" / LAB / "timestamp.txt").write_text("2026-12-01 10:00:00.000000 UTC")
    (submissions / "receipted" / LAB / "submission_secret.txt").write_text("ab12" * 32)
    # The work folder where the watcher may walk up to it (the test's own tmp_path is root's alone).
    course = Path(tempfile.mkdtemp(prefix="course-privacy-"))
    os.chmod(course, 0o755)
    work = course / "work"
    keys = sorted({key for keys in lab_infos(REPO, [LAB])[LAB].required.values() for key in keys})
    assert keys, f"{LAB}'s hidden tests check no reference value: nothing for a stranger to send the judge"
    report = tmp_path / "watcher.json"
    pid, done = _start_watcher(work, students, keys, report)
    try:
        grades, log = grade_class(submissions, work, LAB, "--jobs", "2", timeout=TIMEOUT_S - 120)
    finally:
        os.close(done)                                  # the grading has ended: one last round, then the report
        code = _wait_for_watcher(pid)
    try:
        assert code == 0, f"the watcher failed (exit {code}); what it wrote: {report.read_text()[:2000]}"
        watched = json.loads(report.read_text())
        assert not watched["succeeded"], f"another uid got through: {_by_kind(watched['succeeded'])}"
        assert watched["jails"], f"the watcher never saw a jail's folder in /tmp ({watched['rounds']} rounds)"
        assert any(p.endswith("/judge/judge.sock") for p in watched["sockets"]), \
            f"the watcher never saw a judge's socket bound: {watched['sockets']}"
        assert watched["saw_work"] and watched["tried"].get("read", 0) > 0 and watched["tried"].get("connect", 0) > 0
        assert watched["tried"].get("signal", 0) > 0, "the watcher never found a jail's or judge's process"
        for student in students:
            row = grades[student]
            assert row[f"{LAB} graded"] == "yes" and float(row[f"{LAB} score"]) == float(row[f"{LAB} max score"]) > 0, \
                (row, log)
        assert not list(Path("/tmp").glob("grader-*/planted")) and not (work / "planted").exists()
        loose = [str(p) for p in _everything(work) if p.stat(follow_symlinks=False).st_mode & 0o077]
        assert not loose, f"left open to others in the work folder: {loose[:20]}"
    finally:
        shutil.rmtree(course, ignore_errors=True)


def _by_kind(attempts: list[str]) -> dict[str, list[str]]:
    """{verb: how many, and the first three} of the attempts that succeeded (read, connect, signal, ...)."""
    kinds: dict[str, list[str]] = {}
    for what in attempts:
        kinds.setdefault(what.split(" ")[0], []).append(what)
    return {kind: [f"{len(all_)} times", *all_[:3]] for kind, all_ in kinds.items()}


def _everything(folder: Path) -> list[Path]:
    """Every folder and file under folder (itself included) but nbgrader's exchange, without following links."""
    found = [folder]
    for top, dirs, files in os.walk(folder):
        if Path(top) == folder:
            dirs[:] = [d for d in dirs if d not in NOT_THE_GRADERS]
        found += [Path(top) / name for name in dirs + files if not (Path(top) / name).is_symlink()]
    return found


# --- the pieces, each on its own -------------------------------------------------------------------------

@pytest.mark.parametrize("uid", [None, 61987], ids=["grader not root", "root, the jail's uid"])
def test_the_jails_folder_is_the_graders_and_the_jail_may_only_search_the_judges(tmp_path, uid):
    if uid is not None and os.geteuid() != 0:
        pytest.skip("only root gives the jail's folders to a uid")
    root = Path(tempfile.mkdtemp(prefix="grader-", dir=tmp_path))
    os.chmod(root, 0o755)   # however it was made
    spec = bwrap.prepare(root, uid, bwrap.Limits())

    def mode(path: Path) -> tuple[int, int, int]:
        info = path.stat()
        return stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid

    me, group = os.geteuid(), os.getegid()
    assert mode(root) == (0o700, me, group)
    assert mode(spec.spec_file)[0] == 0o600
    if uid is None:
        assert mode(spec.judge_dir) == (0o700, me, group)
    else:
        assert mode(spec.judge_dir) == (0o750, 0, uid)
        assert mode(spec.kernel_dir) == (0o770, 0, uid)  # until the kernel answers (kernel_manager seals it)


def test_no_host_path_names_where_stored_values_are_not():
    """COURSE_REFERENCE_DIR in the kernel says where no stored values are: a path that names no host folder."""
    assert not os.path.lexists(bwrap.NO_REFERENCE_DIR) and not bwrap.NO_REFERENCE_DIR.startswith("/tmp")
    spec = bwrap.Spec("/tmp/grader-x", None)
    env = bwrap.jail_environment(spec, {grading.DIR_ENV: bwrap.NO_REFERENCE_DIR})
    assert env[grading.DIR_ENV] == bwrap.NO_REFERENCE_DIR


def test_a_work_folder_left_open_is_tightened_once_and_nbgraders_exchange_left_alone(tmp_path):
    work = tmp_path / "work"
    (work / "feedback" / "ada").mkdir(parents=True)
    (work / "exchange" / "course").mkdir(parents=True)
    outside = tmp_path / "outside.txt"
    for path, mode in ((work, 0o755), (work / "feedback", 0o775), (work / "feedback" / "ada", 0o755),
                       (work / "exchange", 0o1777), (work / "exchange" / "course", 0o755)):
        os.chmod(path, mode)
    for path in (work / "grades.csv", work / "feedback" / "ada" / "submission_secret.txt", outside):
        path.write_text("secret")
        os.chmod(path, 0o644)
    (work / "link").symlink_to(outside)
    said = []
    Workspace(work).make_private(said.append)
    assert len(said) == 1 and re.match(rf"made 5 files and folders of {re.escape(str(work))} private", said[0]), said
    for path in (work, work / "feedback", work / "feedback" / "ada"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for path in (work / "grades.csv", work / "feedback" / "ada" / "submission_secret.txt"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644, "a link was followed"
    assert stat.S_IMODE((work / "exchange").stat().st_mode) == 0o1777   # nbgrader's, as nbgrader made it
    said.clear()
    Workspace(work).make_private(said.append)
    assert said == [] and tighten(work, NOT_THE_GRADERS) == 0


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


def test_within_a_grading_command_what_anything_creates_is_its_owners_alone(tmp_path):
    before = _umask()
    with private_files():
        (tmp_path / "made.txt").write_text("x")
        (tmp_path / "made").mkdir()
    assert stat.S_IMODE((tmp_path / "made.txt").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "made").stat().st_mode) == 0o700
    assert _umask() == before, "the grading command's umask outlived it"


def test_the_jails_uid_locks_are_where_no_other_user_can_make_their_folder_first(tmp_path):
    """Another user who made the lock folder first (in a folder writable by all) would stop every grading
    run, which refuses a lock folder that is not root's: it lives where only root may create it."""
    from grader.jail import uids
    parent = os.stat(uids.LOCK_DIR.parent)
    assert parent.st_uid == 0 and not parent.st_mode & 0o022, f"{uids.LOCK_DIR.parent} is writable by others"
    if os.geteuid() != 0:
        pytest.skip("uids are leased only by a grader running as root")
    made_by_another = tmp_path / "locks"
    made_by_another.mkdir(mode=0o755)
    os.chown(made_by_another, WATCHER_UID, WATCHER_UID)
    with pytest.raises(PermissionError, match="must be a folder owned by root"):
        uids.UidLease(made_by_another, first=62500, count=1)


@pytest.mark.skipif(os.geteuid() != 0, reason="another account's file is played by root (chown, fork and setuid)")
def test_a_file_of_another_account_left_open_in_the_work_folder_stops_the_run_saying_what_to_do():
    """A grader not root cannot close what it does not own: it says so, naming the file, rather than
    grade into a folder it cannot keep private."""
    work = Path(tempfile.mkdtemp(prefix="course-privacy-"))
    try:
        os.chown(work, WATCHER_UID, WATCHER_UID)
        os.chmod(work, 0o755)
        (work / "grades.csv").write_text("root's")
        os.chmod(work / "grades.csv", 0o644)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the grading account, not root
            said = "no error"
            try:
                os.close(read)
                os.setgroups([])
                os.setgid(WATCHER_UID)
                os.setuid(WATCHER_UID)
                Workspace(work).make_private(lambda *_: None)
            except Exception as error:  # noqa: BLE001 -- reported to the test whatever it is
                said = f"{type(error).__name__}: {error}"
            finally:
                os.write(write, said.encode())
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as answer:
            said = answer.read().decode()
        os.waitpid(pid, 0)
        assert said.startswith(f"GraderError: {work / 'grades.csv'} is open to other users and belongs to uid 0"), said
        assert "chown" in said
    finally:
        shutil.rmtree(work, ignore_errors=True)
