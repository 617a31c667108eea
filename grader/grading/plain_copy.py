"""A submission's folder copied as its student made it: plain files and folders of theirs, never a link.

Used by grader.grading.exchange (the course's collect), which reads folders that students wrote into
nbgrader's exchange, as the instructor. `PlainCopy` opens each folder with O_DIRECTORY | O_NOFOLLOW
relative to its parent's descriptor, each file with O_NOFOLLOW, checks what it opened with fstat (a
folder or a regular file, the student's, one hard link) and copies from that descriptor: no path is
checked and then used, so a file swapped for a link mid-copy is refused, not followed. Anything else
(a link, a device, a fifo, a socket, another owner's file) is `Refused`, as are more than MAX_ENTRIES
entries, folders more than MAX_DEPTH deep and more bytes than the caps it is given.

Standard library only.
"""
from __future__ import annotations

import errno
import fnmatch
import hashlib
import os
import pwd
import stat
from pathlib import Path

MAX_ENTRIES = 10_000   # files and folders in one submission
MAX_DEPTH = 32         # folders within folders
_KINDS = {stat.S_IFLNK: "symbolic link", stat.S_IFCHR: "character device", stat.S_IFBLK: "block device",
          stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket"}


class Refused(Exception):
    """Why one inbound submission is not collected, in words that follow "refused: "."""


class NotRegular(OSError):
    """What read_regular opened is no regular file (a fifo, a device, a folder)."""


class TooBig(OSError):
    """What read_regular read holds more than its limit."""


def read_regular(path: Path, limit: int) -> bytes:
    """A regular file's bytes, checked on the descriptor they are read from, opened without following a link
    (OSError, ELOOP, where path is one); NotRegular if it is none, TooBig if it holds over limit."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(errno.EINVAL, "not a regular file", str(path))
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise TooBig(errno.EFBIG, f"over {limit} bytes", str(path))
    return data


def quoted_name(name: str) -> str:
    """A name a student chose, quoted with its control characters escaped, cut short."""
    return repr(name) if len(name) <= 120 else repr(name[:120]) + "…"


def owner_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}, which names no user"


def kind_of(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "file of an unknown kind")


class PlainCopy:
    """One submission's copy, descriptor by descriptor, counting what it copied against its caps."""

    def __init__(self, uid: int, coursedir, log, digested: tuple[str, ...] = ()):
        """uid: the student's; coursedir: nbgrader's CourseDirectory (its ignore and include patterns, its
        max_file_size and max_dir_size in kB, groupshared); digested: names of top-level files whose sha256
        `folder` returns."""
        self.uid, self.log, self.digested = uid, log, digested
        self.exclude, self.include = list(coursedir.ignore or []), list(coursedir.include or [])
        self.max_file = 1000 * coursedir.max_file_size if coursedir.max_file_size else None
        self.max_total = 1000 * coursedir.max_dir_size
        self.total = self.entries = 0
        self.folder_mode, self.file_mode = (0o2770, 0o660) if coursedir.groupshared else (0o700, 0o600)
        self.receipts: dict[str, str] = {}

    def folder(self, parent_fd: int, name: str, target: Path, shown: str, depth: int) -> dict[str, str]:
        """Copy the folder `name` of parent_fd into the existing folder target; the receipts' digests."""
        if depth > MAX_DEPTH:
            raise Refused(f"it holds folders more than {MAX_DEPTH} deep ({quoted_name(shown)})")
        fd = self._open(parent_fd, name, os.O_DIRECTORY, shown)
        try:
            self._owned(os.fstat(fd), shown)
            for entry in sorted(os.listdir(fd)):
                self.entries += 1
                if self.entries > MAX_ENTRIES:
                    raise Refused(f"it holds more than {MAX_ENTRIES} files and folders")
                path = f"{shown}/{entry}"
                mode = os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode
                if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                    raise Refused(f"it holds a {kind_of(mode)}, {quoted_name(path)}: only plain files and folders are "
                                  "collected")
                if any(fnmatch.fnmatch(entry, pattern) for pattern in self.exclude):
                    continue  # nbgrader's CourseDirectory.ignore: never opened
                if stat.S_ISDIR(mode):
                    (target / entry).mkdir(mode=0o700)
                    self.folder(fd, entry, target / entry, path, depth + 1)
                    os.chmod(target / entry, self.folder_mode)
                else:
                    self._file(fd, entry, target / entry, path, receipt=depth == 0 and entry in self.digested)
        finally:
            os.close(fd)
        return self.receipts

    def _open(self, parent_fd: int, name: str, kind: int, shown: str) -> int:
        try:
            return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | kind, dir_fd=parent_fd)
        except OSError as error:  # changed since it was listed: a link now (ELOOP), a file now (ENOTDIR)
            what = "a symbolic link" if error.errno == errno.ELOOP else os.strerror(error.errno)
            raise Refused(f"{quoted_name(shown)} could not be opened as it was listed ({what})") from None

    def _owned(self, info: os.stat_result, shown: str) -> None:
        if info.st_uid != self.uid:
            raise Refused(f"{quoted_name(shown)} belongs to {owner_name(info.st_uid)}, not to the student it "
                          f"claims to be from ({owner_name(self.uid)})")

    def _file(self, parent_fd: int, name: str, target: Path, shown: str, receipt: bool) -> None:
        fd = self._open(parent_fd, name, 0, shown)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise Refused(f"{quoted_name(shown)} is a {kind_of(info.st_mode)} now: only plain files are collected")
            self._owned(info, shown)
            if info.st_nlink != 1:
                raise Refused(f"{quoted_name(shown)} has {info.st_nlink} hard links: a file reached by another name is "
                              "not collected")
            if self.include and not any(fnmatch.fnmatch(name, pattern) for pattern in self.include):
                return  # nbgrader's CourseDirectory.include
            if self.max_file is not None and info.st_size > self.max_file:
                self.log.warning("Ignoring file too large %s (see config option CourseDirectory.max_file_size)",
                                 quoted_name(shown))
                return
            digest = hashlib.sha256()
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            copied = 0
            with os.fdopen(out, "wb") as sink:
                while chunk := os.read(fd, 1 << 20):
                    copied += len(chunk)
                    self.total += len(chunk)
                    if self.max_file is not None and copied > self.max_file:
                        raise Refused(f"{quoted_name(shown)} grew past CourseDirectory.max_file_size while it was "
                                      "copied")
                    if self.total > self.max_total:
                        raise Refused(f"it holds more than {self.max_total} bytes (CourseDirectory.max_dir_size)")
                    digest.update(chunk)
                    sink.write(chunk)
            os.chmod(target, self.file_mode)
            if receipt:
                self.receipts[name] = digest.hexdigest()
        finally:
            os.close(fd)
