"""What a grading run works on: its folders (Workspace) and the labs it grades (LabInfo).

The gradebook must know a lab's test cells before nbgrader can autograde it;
`prepare_gradebook` tells it, again only for labs that changed. A submission's
`fingerprint` names the notebook and the lab's version, so a later run knows
what it has graded already.

A work folder is the grading account's alone: the reference values and seeds,
the gradebook, grades, status, logs, feedback and receipts. `private_files`
makes whatever a grading command and the processes it starts create readable by
its owner alone (umask 0o077), and `Workspace.make_private` makes the folder so,
tightening one that an earlier run, or a copy, left open to others.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from grader import GraderError
from grader.common import rubrics
from grader.common.labs import find_labs, read_notebook, source_text
from grader.common.nbgrader_cli import generate_assignment
from grader.common.private_write import write_private
from grader.feedback.safety import HIDDEN_BEGIN, hidden_lines
from grader.judge.server import required_checks

from . import collect, gradebook

#: What a grading command creates may be read and written by its owner alone.
PRIVATE_UMASK = 0o077
#: A work folder's entries that are not the grader's to tighten: nbgrader's exchange for one machine
#: (nbgrader_config.py puts it here when no other is configured), whose modes nbgrader sets itself.
NOT_THE_GRADERS = ("exchange",)


def privately(command):
    """A grading command (grade, record, merge) run within `private_files`."""
    @functools.wraps(command)
    def run(*args, **kwargs):
        with private_files():
            return command(*args, **kwargs)
    return run


@contextlib.contextmanager
def private_files():
    """Within it, every file and folder this process or a process it starts creates is its owner's
    alone (0600, 0700), whatever the code that creates it asks for, unless that code sets a mode itself."""
    before = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(before)


def tighten(folder: Path, skip: tuple[str, ...] = ()) -> int:
    """Take every permission of group and others from folder and from each folder and file below it
    (never through a link: links are left alone), but the entries of folder named in skip; how many
    it changed."""
    changed = _tighten_at(None, str(folder), str(folder))
    for seen, (top, dirs, files, at) in enumerate(os.fwalk(folder, follow_symlinks=False)):
        if seen == 0:  # folder itself comes first
            dirs[:] = [d for d in dirs if d not in skip]
            files = [f for f in files if f not in skip]
        changed += sum(_tighten_at(at, name, os.path.join(top, name)) for name in [*dirs, *files])
    return changed


def _tighten_at(folder_fd: int | None, name: str, shown: str) -> int:
    # An O_PATH descriptor of the entry itself (not what a link there names), changed through /proc.
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd)
    try:
        info = os.fstat(fd)
        if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)) or not info.st_mode & 0o077:
            return 0
        try:
            os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(info.st_mode) & 0o700)
        except PermissionError:
            raise GraderError(f"{shown} is open to other users and belongs to uid {info.st_uid}, not to this "
                              "account, which cannot close it: remove it, or make it this account's (chown), and "
                              "run again") from None
        return 1
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Workspace:
    """The folders and files one grading run writes, and the nbgrader flags that point there."""
    root: Path

    @property
    def submitted(self) -> Path: return self.root / "submitted"
    @property
    def autograded(self) -> Path: return self.root / "autograded"
    @property
    def feedback(self) -> Path: return self.root / "feedback"
    @property
    def gradebook(self) -> Path: return self.root / "gradebook.db"
    @property
    def status_file(self) -> Path: return self.root / "status.json"

    def make_private(self, say=print) -> None:
        """The work folder, made its owner's alone (0700), or tightened with everything the grader keeps
        in it where an earlier run, a copy or an unzip left it open to others (said once)."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        changed = tighten(self.root, skip=NOT_THE_GRADERS)
        if changed:
            say(f"made {changed} files and folders of {self.root} private to this account (0700 folders, "
                "0600 files): other users of this machine could read them")

    def flags(self, db: Path | None = None) -> list[str]:
        return [f"--CourseDirectory.submitted_directory={self.submitted}",
                f"--CourseDirectory.autograded_directory={self.autograded}",
                f"--CourseDirectory.feedback_directory={self.feedback}",
                f"--CourseDirectory.db_url={gradebook.db_url(db or self.gradebook)}",
                # what autograde writes is 444, read by all, unless told (octal digits, as nbgrader reads them)
                "--Autograde.permissions=600"]

    def load_status(self) -> dict:
        if self.status_file.is_file():
            return json.loads(self.status_file.read_text(encoding="utf-8"))
        return {}

    def save_status(self, status: dict) -> None:
        write_private(self.status_file, json.dumps(status, indent=1, sort_keys=True) + "\n")


@dataclass(frozen=True)
class LabInfo:
    """What grading a lab needs to know about it, read once per run."""
    name: str
    points: dict[str, float]          # grade_id -> points of the test cells
    released: dict                    # the student release, to see what a student changed
    required: dict[str, list[str]]    # grade_id -> reference keys its hidden tests check
    version: str                      # changes when the lab or its reference answers do
    hidden_lines: list[str] = ()      # the hidden tests' lines, which no feedback page may show
    written: dict[str, float] = field(default_factory=dict)  # grade_id -> points of the answers graded by hand
    # grade_id -> (its source as released, as the gradebook holds it): the test cells with hidden tests
    with_hidden_tests: dict[str, tuple[str, str]] = field(default_factory=dict)
    # grade_id -> the solution's model answer and rubric of each written answer, for formgrader (grader.common.rubrics)
    rubrics: dict[str, str] = field(default_factory=dict)

    @property
    def max_score(self) -> float:
        """The autograded points: the written answers' are reported apart (grader.grading.export)."""
        return sum(self.points.values())

    @property
    def markdown(self) -> list[str]:
        """The released lab's markdown cells: the only ones a feedback page renders as markdown."""
        return [source_text(c) for c in self.released.get("cells", []) if c.get("cell_type") == "markdown"]


def lab_infos(root: Path, labs: list[str] | None = None) -> dict[str, LabInfo]:
    """The labs that have graded test cells; given `labs`, those alone, in that order (one that is not
    such a lab refused, naming the labs there are)."""
    graded = {lab.name: lab for lab in find_labs(root) if lab.points}
    unknown = [lab for lab in labs or [] if lab not in graded]
    if unknown:
        raise GraderError(f"no graded lab(s) {', '.join(unknown)}; graded labs are: {', '.join(graded)}")
    infos = {}
    for lab in (graded[name] for name in labs) if labs else graded.values():
        source = read_notebook(lab.notebook, root)
        reference = root / "grader" / "reference" / f"{lab.name}.json"
        digest = hashlib.sha256(lab.notebook.read_bytes())
        digest.update(reference.read_bytes() if reference.is_file() else b"")
        released_path = root / "labs" / lab.name / f"{lab.name}.ipynb"
        released = read_notebook(released_path, root) if released_path.is_file() else source
        infos[lab.name] = LabInfo(lab.name, lab.points, released, required_checks(source), digest.hexdigest()[:16],
                                  hidden_lines(source), lab.written, _with_hidden_tests(source, released),
                                  rubrics.model_answers(source))
    return infos


def _with_hidden_tests(source: dict, released: dict) -> dict[str, tuple[str, str]]:
    """{grade_id: (released source, solution source)} of the cells whose hidden tests the release cut."""
    def by_id(nb):
        return {c["metadata"]["nbgrader"]["grade_id"]: source_text(c) for c in nb.get("cells", [])
                if c.get("metadata", {}).get("nbgrader", {}).get("grade_id")}
    handed_out = by_id(released)
    return {gid: (handed_out[gid], text) for gid, text in by_id(source).items()
            if gid in handed_out and handed_out[gid] != text and HIDDEN_BEGIN in text}


def gradable_labs(root: Path) -> dict[str, float]:
    """{lab: total points} for the labs that have graded test cells."""
    return {lab.name: sum(lab.points.values()) for lab in find_labs(root) if lab.points}


def prepare_gradebook(ws: Workspace, root: Path, infos: dict[str, LabInfo]) -> None:
    """The gradebook must know each lab's test cells before autograde can use it.

    nbgrader takes seconds per lab for that, so it is done again only for a lab
    that changed since (labs.json records the versions the gradebook holds).
    """
    marker = ws.root / "labs.json"
    known = json.loads(marker.read_text(encoding="utf-8")) if marker.is_file() and ws.gradebook.is_file() else {}
    with tempfile.TemporaryDirectory(prefix="grader-grade-") as tmp:
        for lab, info in infos.items():
            if known.get(lab) != info.version:
                generate_assignment(lab, root, Path(tmp), gradebook.db_url(ws.gradebook))
                known[lab] = info.version
                marker.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def fingerprint(submission: collect.Submission, lab: LabInfo) -> str:
    return hashlib.sha256(submission.path.read_bytes()).hexdigest()[:16] + "/" + lab.version
