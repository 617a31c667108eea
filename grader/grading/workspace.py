"""What a grading run works on: its folders (Workspace) and the labs it grades (LabInfo).

The gradebook must know a lab's test cells before nbgrader can autograde it;
`prepare_gradebook` tells it, again only for labs that changed. A submission's
`fingerprint` names the notebook and the lab's version, so a later run knows
what it has graded already.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from grader import GraderError
from grader.common.labs import find_labs, read_notebook, source_text
from grader.common.nbgrader_cli import generate_assignment
from grader.feedback.safety import HIDDEN_BEGIN, hidden_lines
from grader.judge.server import required_checks

from . import collect, gradebook


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

    def flags(self, db: Path | None = None) -> list[str]:
        return [f"--CourseDirectory.submitted_directory={self.submitted}",
                f"--CourseDirectory.autograded_directory={self.autograded}",
                f"--CourseDirectory.feedback_directory={self.feedback}",
                f"--CourseDirectory.db_url={gradebook.db_url(db or self.gradebook)}"]

    def load_status(self) -> dict:
        if self.status_file.is_file():
            return json.loads(self.status_file.read_text(encoding="utf-8"))
        return {}

    def save_status(self, status: dict) -> None:
        tmp = self.status_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(status, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(self.status_file)


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
                                  hidden_lines(source), lab.written, _with_hidden_tests(source, released))
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
