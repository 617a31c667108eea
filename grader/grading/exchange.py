"""nbgrader's Collect, refusing a submission handed in as another student or reaching past its folder.

On a JupyterHub (deploy/hub/) every student may write into the exchange's inbound/ folder: nbgrader's
Submit needs it. nbgrader 0.9.6's collect only warns when a folder's Unix owner is not the student its
name claims, takes each student's latest timestamp whoever made it, and copies as the instructor with
shutil.copytree, following links: a student handed in as another (a folder in their name, dated 2099)
and handed in the instructor's solution (a notebook that is a link to it).

`StrictCollect`, nbgrader's collect for this course (`c.ExchangeFactory.collect` in nbgrader_config.py,
so formgrader's Collect and `nbgrader collect` both use it), refuses, with an error line that
formgrader's Collect dialog shows, any inbound folder:

- whose name is not nbgrader's (student+lab+timestamp[+random]), or names no Unix user;
- that is not a folder owned by the Unix user it names;
- dated more than CLOCK_ALLOWANCE past this machine's clock (one dated more than that before its folder
  was last changed is collected, with a warning: a date is the student's claim);
- holding anything but plain files and folders (a link, a device, a fifo, a socket), a file with
  more than one hard link, or a file or folder of another owner;
- past nbgrader's max_dir_size (kB, whole submission), or MAX_ENTRIES entries, or MAX_DEPTH deep.

nbgrader's check_owner is not consulted: the owner is always checked, and a mismatch always refused.
Each student's latest accepted submission is collected; a refused one never hides it. The copy opens
each folder with O_DIRECTORY | O_NOFOLLOW relative to its parent's descriptor (from the inbound
folder's), each file with O_NOFOLLOW, checks what it opened with fstat and copies from that
descriptor: no path is checked and then used. It goes into a hidden folder beside the collected one
and is renamed into place when whole. nbgrader's other behaviour is kept: --update, --before-duedate,
the submitted/ layout, CourseDirectory.ignore and include, a file past max_file_size left out with
a warning.

Beside each collected folder it writes `<lab>.collected.json` (MANIFEST_SUFFIX): whose it was and the
digests of nbgrader's receipts as copied. grader/grading/receipts.py keeps a receipt only where that
manifest vouches for it: nbgrader's own collect never writes one, and a student's folder cannot hold it.

Standard library and nbgrader only: the instructor's formgrader imports it from their copy of the course.
"""
from __future__ import annotations

import datetime
import errno
import fnmatch
import hashlib
import json
import os
import pwd
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.utils import check_mode, parse_utc

#: How far past this machine's clock a submission's timestamp may be (clocks of a hub's machines drift).
CLOCK_ALLOWANCE = datetime.timedelta(minutes=5)
MAX_ENTRIES = 10_000   # files and folders in one submission
MAX_DEPTH = 32         # folders within folders
LISTED_REFUSALS = 50   # refusals logged one by one in one collect; the rest are counted
MANIFEST_SUFFIX = ".collected.json"
#: nbgrader's receipts that release_feedback reads beside a feedback page: the manifest records their digests.
RECEIPT_NAMES = ("timestamp.txt", "submission_secret.txt")
#: A student id that is also a safe folder name (a Unix user name is one, unless a directory service says otherwise).
STUDENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,99}")
_KINDS = {stat.S_IFLNK: "symbolic link", stat.S_IFCHR: "character device", stat.S_IFBLK: "block device",
          stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket"}


class Refused(Exception):
    """Why one inbound submission is not collected, in words that follow "refused: "."""


@dataclass(frozen=True)
class Candidate:
    folder: str                     # its name in inbound/
    student: str
    timestamp: datetime.datetime    # from its name, naive UTC (nbgrader's parse_utc)
    uid: int                        # its owner, the student's


def manifest_path(student_dir: Path, lab: str) -> Path:
    """Where the manifest of a student's collected lab lies: beside <student>/<lab>/, never in it."""
    return Path(student_dir) / f"{lab}{MANIFEST_SUFFIX}"


def read_manifest(path: Path, limit: int = 64 << 10) -> dict | None:
    """The manifest at path, or None where it is missing, a link, not a small regular file or not one."""
    try:
        raw = read_regular(path, limit)
        manifest = json.loads(raw)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def read_regular(path: Path, limit: int) -> bytes:
    """A regular file's bytes, opened without following a link; OSError if it is none or holds over limit."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"over {limit} bytes", str(path))
    return data


def _shown(name: str) -> str:
    """A name a student chose, quoted with its control characters escaped, cut short."""
    return repr(name) if len(name) <= 120 else repr(name[:120]) + "…"


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}, which names no user"


class StrictCollect(ExchangeCollect):
    """nbgrader's collect that refuses, not warns (the module's docstring says what, and why)."""

    def uid_of(self, student: str) -> int | None:
        """The Unix uid of the user named `student`; None where there is none."""
        try:
            return pwd.getpwnam(student).pw_uid
        except KeyError:
            return None

    # --- which submissions -----------------------------------------------------------------------

    def init_src(self):
        if self.coursedir.course_id == "":
            self.fail("No course id specified. Re-run with --course flag.")
        self.course_path = os.path.join(self.root, self.coursedir.course_id)
        self.inbound_path = os.path.join(self.course_path, "inbound")
        if not os.path.isdir(self.inbound_path):
            self.fail(f"Course not found: {self.inbound_path}")
        if not check_mode(self.inbound_path, read=True, execute=True):
            self.fail(f"You don't have read permissions for the directory: {self.inbound_path}")
        self.refusals = 0
        self.now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
        pattern = f"{self.coursedir.student_id or '*'}+{self.coursedir.assignment_id}+*"
        accepted: dict[str, list[Candidate]] = {}
        for name in sorted(os.listdir(self.inbound_path)):
            if name.startswith(".") or not fnmatch.fnmatchcase(name, pattern):  # as nbgrader's glob
                continue
            try:
                candidate = self._candidate(name)
            except Refused as why:
                self.refuse(name, why)
                continue
            accepted.setdefault(candidate.student, []).append(candidate)
        with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gb:
            try:
                self.duedate = gb.find_assignment(self.coursedir.assignment_id).duedate
            except MissingEntry:
                self.duedate = None
        self.candidates = {student: self._in_order(found) for student, found in sorted(accepted.items())}
        self.src_records = [{"username": s, "filename": c[0].folder, "timestamp": c[0].timestamp}
                            for s, c in self.candidates.items()]

    def _candidate(self, name: str) -> Candidate:
        """What the inbound folder `name` claims, checked against who made it; Refused says why not."""
        parts = name.rsplit("+", 3)
        if len(parts) < 3 or parts[1] != self.coursedir.assignment_id:
            raise Refused("its name is not nbgrader's <student>+<lab>+<timestamp>+<random>")
        student = parts[0]
        try:
            timestamp = parse_utc(parts[2])
        except (ValueError, OverflowError, TypeError):
            raise Refused(f"its timestamp {_shown(parts[2])} is no time") from None
        if not STUDENT_RE.fullmatch(student):
            raise Refused(f"it claims the student id {_shown(student)}, which is no usable user name")
        uid = self.uid_of(student)
        if uid is None:
            raise Refused(f"it claims to be {student}'s, and no Unix user of this machine is named {student}")
        info = os.stat(name, dir_fd=self._inbound_fd(), follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode):
            raise Refused(f"it claims to be {student}'s, and is a {_kind(info.st_mode)}, not a folder")
        if info.st_uid != uid:
            raise Refused(f"it claims to be {student}'s, but its owner is {_user(info.st_uid)}")
        if timestamp > self.now + CLOCK_ALLOWANCE:
            raise Refused(f"its timestamp, {timestamp:%Y-%m-%d %H:%M:%S} UTC, is past this machine's clock "
                          f"({self.now:%Y-%m-%d %H:%M:%S} UTC) by more than "
                          f"{CLOCK_ALLOWANCE.total_seconds() / 60:g} minutes")
        written = datetime.datetime.fromtimestamp(info.st_ctime, datetime.UTC).replace(tzinfo=None)
        if timestamp < written - CLOCK_ALLOWANCE:  # nbgrader's Submit names the folder as it makes it
            self.log.warning("%s in %s is dated %s UTC, but its folder was last changed at %s UTC: its date is "
                             "the student's claim (nbgrader's late penalty and --before-duedate read it); check it "
                             "before trusting it", _shown(name), self.inbound_path,
                             f"{timestamp:%Y-%m-%d %H:%M:%S}", f"{written:%Y-%m-%d %H:%M:%S}")
        return Candidate(name, student, timestamp, uid)

    def _inbound_fd(self) -> int:
        if getattr(self, "inbound_fd", None) is None:
            self.inbound_fd = os.open(self.inbound_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return self.inbound_fd

    def _in_order(self, found: list[Candidate]) -> list[Candidate]:
        """A student's accepted submissions, the one nbgrader would choose first, then the next if it fails."""
        newest_first = sorted(found, key=lambda c: c.timestamp, reverse=True)
        if self.duedate is None or not self.before_duedate:
            return newest_first
        on_time = [c for c in newest_first if c.timestamp <= self.duedate]
        return on_time + [c for c in newest_first if c.timestamp > self.duedate]

    def refuse(self, folder: str, why: Exception) -> None:
        self.refusals += 1
        if self.refusals <= LISTED_REFUSALS:
            claimed = folder.split("+")[0]
            self.log.error("Refused %s: %s. Not collected (their latest submission that passes is, if any): ask %s "
                           "to submit again if theirs is missing.", _shown(folder), why,
                           claimed if STUDENT_RE.fullmatch(claimed) else "the student it names")
        elif self.refusals == LISTED_REFUSALS + 1:
            self.log.error("More submissions refused in %s; not listed one by one", self.inbound_path)

    # --- the copy ---------------------------------------------------------------------------------

    def copy_files(self):
        try:
            self._copy_all()
            if self.refusals:
                self.log.error("%d submissions refused (above): a folder that is not its student's own Submit can "
                               "be removed from %s once you know who made it (its owner).", self.refusals,
                               self.inbound_path)
        finally:
            if getattr(self, "inbound_fd", None) is not None:
                os.close(self.inbound_fd)
                self.inbound_fd = None

    def _copy_all(self):
        assignment = self.coursedir.assignment_id
        if not self.candidates:
            self.log.warning("No submissions of '%s' for course '%s' to collect", assignment,
                             self.coursedir.course_id)
        else:
            self.log.info("Processing %d submissions of '%s' for course '%s'", len(self.candidates), assignment,
                          self.coursedir.course_id)
        for student, candidates in self.candidates.items():
            dest = Path(self.coursedir.format_path(self.coursedir.submitted_directory, student, assignment))
            existing = self._existing_timestamp(dest) if dest.is_dir() else None
            for candidate in candidates:
                if dest.is_dir() and not self._newer(existing, candidate.timestamp):
                    if self.update:
                        self.log.info("No newer submission to collect: %s %s", student, assignment)
                    else:
                        self.log.info("Submission already exists, use --update to update: %s %s", student,
                                      assignment)
                    break
                try:
                    self._collect(candidate, dest)
                except Refused as why:
                    self.refuse(candidate.folder, why)
                    continue
                break
            else:
                self.log.error("Nothing of %s collected for '%s': each submission in their name was refused "
                               "(above).", student, assignment)

    def _newer(self, existing: datetime.datetime | None, timestamp: datetime.datetime) -> bool:
        """nbgrader's rule: whether a submission replaces the one collected before."""
        if self.update and (existing is None or timestamp > existing):
            return True
        return bool(self.before_duedate and existing != timestamp)

    def _existing_timestamp(self, dest: Path) -> datetime.datetime | None:
        """When the collected copy was handed in: from its manifest, else from its timestamp.txt as nbgrader
        reads it (a student wrote that file: one that does not parse counts as none, not as a failed collect)."""
        manifest = read_manifest(manifest_path(dest.parent, self.coursedir.assignment_id))
        try:
            if manifest and manifest.get("student") == dest.parent.name:
                return parse_utc(manifest["timestamp"])
            return self.coursedir.get_existing_timestamp(str(dest))
        except Exception:
            return None

    def _collect(self, candidate: Candidate, dest: Path) -> None:
        """Copy one submission into dest (replacing it), then write its manifest; Refused leaves dest as it was."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.collecting-", dir=dest.parent))
        try:
            copier = _Copier(candidate.uid, self.coursedir, self.log)
            digests = copier.folder(self._inbound_fd(), candidate.folder, staging, candidate.folder, 0)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if dest.is_dir():
            self.log.info("Updating submission: %s %s", candidate.student, self.coursedir.assignment_id)
            shutil.rmtree(dest)
        else:
            self.log.info("Collecting submission: %s %s", candidate.student, self.coursedir.assignment_id)
        os.chmod(staging, copier.folder_mode)
        os.rename(staging, dest)
        manifest = {"student": candidate.student, "lab": self.coursedir.assignment_id,
                    "course": self.coursedir.course_id, "inbound": candidate.folder, "owner_uid": candidate.uid,
                    "timestamp": candidate.timestamp.isoformat(), "collected": self.now.isoformat(),
                    "receipts": digests}
        target = manifest_path(dest.parent, self.coursedir.assignment_id)
        fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=dest.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(manifest, f, indent=1)
        os.replace(temporary, target)


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "file of an unknown kind")


class _Copier:
    """One submission's copy, descriptor by descriptor, counting what it copied against its caps."""

    def __init__(self, uid: int, coursedir, log):
        self.uid, self.log = uid, log
        self.exclude, self.include = list(coursedir.ignore or []), list(coursedir.include or [])
        self.max_file = 1000 * coursedir.max_file_size if coursedir.max_file_size else None
        self.max_total = 1000 * coursedir.max_dir_size
        self.total = self.entries = 0
        self.folder_mode, self.file_mode = (0o2770, 0o660) if coursedir.groupshared else (0o700, 0o600)
        self.receipts: dict[str, str] = {}

    def folder(self, parent_fd: int, name: str, target: Path, shown: str, depth: int) -> dict[str, str]:
        """Copy the folder `name` of parent_fd into the existing folder target; the receipts' digests."""
        if depth > MAX_DEPTH:
            raise Refused(f"it holds folders more than {MAX_DEPTH} deep ({_shown(shown)})")
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
                    raise Refused(f"it holds a {_kind(mode)}, {_shown(path)}: only plain files and folders are "
                                  "collected")
                if any(fnmatch.fnmatch(entry, pattern) for pattern in self.exclude):
                    continue  # nbgrader's CourseDirectory.ignore: never opened
                if stat.S_ISDIR(mode):
                    (target / entry).mkdir(mode=0o700)
                    self.folder(fd, entry, target / entry, path, depth + 1)
                    os.chmod(target / entry, self.folder_mode)
                else:
                    self._file(fd, entry, target / entry, path, receipt=depth == 0 and entry in RECEIPT_NAMES)
        finally:
            os.close(fd)
        return self.receipts

    def _open(self, parent_fd: int, name: str, kind: int, shown: str) -> int:
        try:
            return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | kind, dir_fd=parent_fd)
        except OSError as error:  # changed since it was listed: a link now (ELOOP), a file now (ENOTDIR)
            what = "a symbolic link" if error.errno == errno.ELOOP else os.strerror(error.errno)
            raise Refused(f"{_shown(shown)} could not be opened as it was listed ({what})") from None

    def _owned(self, info: os.stat_result, shown: str) -> None:
        if info.st_uid != self.uid:
            raise Refused(f"{_shown(shown)} belongs to {_user(info.st_uid)}, not to the student it claims to be "
                          f"from ({_user(self.uid)})")

    def _file(self, parent_fd: int, name: str, target: Path, shown: str, receipt: bool) -> None:
        fd = self._open(parent_fd, name, 0, shown)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise Refused(f"{_shown(shown)} is a {_kind(info.st_mode)} now: only plain files are collected")
            self._owned(info, shown)
            if info.st_nlink != 1:
                raise Refused(f"{_shown(shown)} has {info.st_nlink} hard links: a file reached by another name is "
                              "not collected")
            if self.include and not any(fnmatch.fnmatch(name, pattern) for pattern in self.include):
                return  # nbgrader's CourseDirectory.include
            if self.max_file is not None and info.st_size > self.max_file:
                self.log.warning("Ignoring file too large %s (see config option CourseDirectory.max_file_size)",
                                 _shown(shown))
                return
            digest = hashlib.sha256()
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            copied = 0
            with os.fdopen(out, "wb") as sink:
                while chunk := os.read(fd, 1 << 20):
                    copied += len(chunk)
                    self.total += len(chunk)
                    if self.max_file is not None and copied > self.max_file:
                        raise Refused(f"{_shown(shown)} grew past CourseDirectory.max_file_size while it was copied")
                    if self.total > self.max_total:
                        raise Refused(f"it holds more than {self.max_total} bytes (CourseDirectory.max_dir_size)")
                    digest.update(chunk)
                    sink.write(chunk)
            os.chmod(target, self.file_mode)
            if receipt:
                self.receipts[name] = digest.hexdigest()
        finally:
            os.close(fd)
