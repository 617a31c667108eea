"""A uid of its own for each jail, held exclusively while the jail lives.

Processes a jail leaves behind are found by its uid, and RLIMIT_NPROC counts
per uid: two jails sharing one (two grading runs at once, each with a slot 0)
would count each other's processes and kill each other's kernels. Each uid of
the range has a lock file in a root-owned folder; a jail holds the flock of
its uid until it ends, and whoever takes a free uid may kill what still runs
as it, since no live jail holds it. A grader that dies releases its locks
with its file descriptors.
"""
from __future__ import annotations

import fcntl
import os
import signal
import stat
import time
from pathlib import Path

BASE_UID = 61000   # far from real users' uids
UID_COUNT = 1000
# In /run, which only root may write: in /run/lock (1777) any local user could make this folder first
# and stop every grading run (it is refused unless root's).
LOCK_DIR = Path("/run/course-grader")


def processes_of(uid: int) -> list[int]:
    """PIDs of the processes running as uid."""
    return _processes_by_uid(uid, 1).get(uid, [])


def _processes_by_uid(first: int, count: int) -> dict[int, list[int]]:
    """{uid: PIDs} of the processes running as a uid of [first, first + count), from one pass over /proc."""
    found: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uid = entry.stat().st_uid
            except FileNotFoundError:
                continue
            if first <= uid < first + count:
                found.setdefault(uid, []).append(int(entry.name))
    return found


def outlived(folder: Path = LOCK_DIR, first: int = BASE_UID, count: int = UID_COUNT) -> dict[int, list[int]]:
    """{uid: PIDs} of the processes running as a jail uid that no live jail holds: what a jail
    left behind. Those of jails still running (another grading run's) are not counted."""
    left = {}
    for uid, pids in _processes_by_uid(first, count).items():
        try:
            fd = os.open(folder / f"uid-{uid}.lock", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:  # no jail ever held it
            left[uid] = pids
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # taken: no jail holds it
            left[uid] = pids
        except BlockingIOError:
            pass
        finally:
            os.close(fd)  # releases it, if taken
    return left


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/pid/stat from the third (state) on; None: no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The name (field 2) may hold spaces and parentheses: the fields after it follow its last ')'.
    return stat[stat.rindex(b")") + 2:].split()


def start_time(pid: int) -> int | None:
    """When pid started, in clock ticks since boot (None: no such process): with the pid, one
    process for good, where a pid alone may be a later process's after the first one ended."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def descendants(pid: int, started: int) -> dict[int, int]:
    """{pid: start time} of pid (if it is still the process that started at `started`) and of
    every process below it, from one pass over /proc; {} once it has ended."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (fields := _stat(entry.name)):
            children.setdefault(int(fields[1]), []).append((int(entry.name), int(fields[19])))
    if start_time(pid) != started:
        return {}
    found, todo = {}, [(pid, started)]
    while todo:
        child, born = todo.pop()
        found[child] = born
        todo += children.get(child, [])
    return found


def kill_until_gone(find, wait_s: float = 10, kill_at_once=None) -> list[int]:
    """SIGKILL the processes find() names until it names none; those still there after wait_s.

    kill_at_once: a call that kills them all in one go (cgroup v2's cgroup.kill), tried first.
    """
    deadline = time.monotonic() + wait_s
    while True:
        pids = find()
        if not pids or time.monotonic() > deadline:
            return pids
        if kill_at_once is None or not kill_at_once():
            # They cannot outrun this loop for long: the jail's process limit bounds them.
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        time.sleep(0.05)


def kill_uid(uid: int | None, wait_s: float = 10) -> list[int]:
    """Kill every process of uid; returns those still there after wait_s (none, normally)."""
    if uid is None:
        return []
    return kill_until_gone(lambda: processes_of(uid), wait_s)


def _lock_dir(folder: Path) -> Path:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(folder)
    # A folder someone else made (a parent writable by others) could hand us their files.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
        raise PermissionError(f"{folder} must be a folder owned by root, writable only by root; "
                              "remove it and grade again")
    return folder


class UidLease:
    """One uid of [BASE_UID, BASE_UID + UID_COUNT), held until `release` (root only)."""

    def __init__(self, folder: Path = LOCK_DIR, first: int = BASE_UID, count: int = UID_COUNT):
        folder = _lock_dir(folder)
        for uid in range(first, first + count):
            fd = os.open(folder / f"uid-{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            kill_uid(uid)  # an earlier grader's leftovers: no live jail holds this uid
            return
        raise RuntimeError(f"all {count} jail uids from {first} are in use; wait for a grading run to end")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
