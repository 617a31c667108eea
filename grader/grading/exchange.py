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
- past nbgrader's max_dir_size (kB, whole submission), or plain_copy.MAX_ENTRIES entries, or
  plain_copy.MAX_DEPTH deep.

nbgrader's check_owner is not consulted: the owner is always checked, and a mismatch always refused.
Each student's latest accepted submission is collected; a refused one never hides it. The copy
(grader.grading.plain_copy) opens each folder and file without following a link, from the inbound
folder's descriptor down, checks what it opened and copies from that descriptor: no path is checked
and then used. It goes into a hidden folder beside the collected one
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
import fnmatch
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

from .plain_copy import PlainCopy, Refused, kind_of, owner_name, quoted_name, read_regular

#: How far past this machine's clock a submission's timestamp may be (clocks of a hub's machines drift).
CLOCK_ALLOWANCE = datetime.timedelta(minutes=5)
LISTED_REFUSALS = 50   # refusals logged one by one in one collect; the rest are counted
MANIFEST_SUFFIX = ".collected.json"
#: nbgrader's receipts that release_feedback reads beside a feedback page: the manifest records their digests.
RECEIPT_NAMES = ("timestamp.txt", "submission_secret.txt")
#: A student id that is also a safe folder name (a Unix user name is one, unless a directory service says otherwise).
STUDENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,99}")



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
            raise Refused(f"its timestamp {quoted_name(parts[2])} is no time") from None
        if not STUDENT_RE.fullmatch(student):
            raise Refused(f"it claims the student id {quoted_name(student)}, which is no usable user name")
        uid = self.uid_of(student)
        if uid is None:
            raise Refused(f"it claims to be {student}'s, and no Unix user of this machine is named {student}")
        info = os.stat(name, dir_fd=self._inbound_fd(), follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode):
            raise Refused(f"it claims to be {student}'s, and is a {kind_of(info.st_mode)}, not a folder")
        if info.st_uid != uid:
            raise Refused(f"it claims to be {student}'s, but its owner is {owner_name(info.st_uid)}")
        if timestamp > self.now + CLOCK_ALLOWANCE:
            raise Refused(f"its timestamp, {timestamp:%Y-%m-%d %H:%M:%S} UTC, is past this machine's clock "
                          f"({self.now:%Y-%m-%d %H:%M:%S} UTC) by more than "
                          f"{CLOCK_ALLOWANCE.total_seconds() / 60:g} minutes")
        written = datetime.datetime.fromtimestamp(info.st_ctime, datetime.UTC).replace(tzinfo=None)
        if timestamp < written - CLOCK_ALLOWANCE:  # nbgrader's Submit names the folder as it makes it
            self.log.warning("%s in %s is dated %s UTC, but its folder was last changed at %s UTC: its date is "
                             "the student's claim (nbgrader's late penalty and --before-duedate read it); check it "
                             "before trusting it", quoted_name(name), self.inbound_path,
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
                           "to submit again if theirs is missing.", quoted_name(folder), why,
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
            copier = PlainCopy(candidate.uid, self.coursedir, self.log, RECEIPT_NAMES)
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
