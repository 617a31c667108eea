"""Covers: grader.judge_values.

The judge's values of a grading run: recorded on a seed of the run's own, or reused from an
earlier run's judge/ folder only while the lab, its stored values, the course and torch are
unchanged (grader.judge_values). The recording itself is stood in for: executing a solution
is tests/test_notebooks.py's and the grading runs'."""
from __future__ import annotations

import json
import stat

import pytest

from grader import GraderError, grade, judge_values, reference
from grader.common.labs import find_labs
from grader.grading.workspace import Workspace
from helpers import REPO

LAB = next(lab for lab in find_labs(REPO) if lab.name == "01_single_gpu")


@pytest.fixture
def recordings(monkeypatch):
    """Stands in for executing the solution: writes its seed as the values; lists the seeds."""
    seeds = []

    def record(lab, dest, root, *, seed, as_graded):
        assert as_graded and lab.name == LAB.name
        seeds.append(seed)
        dest.mkdir(parents=True, exist_ok=True)
        (dest / f"{lab.name}.json").write_text(json.dumps({"seed": seed}))
        return dest / f"{lab.name}.json"
    monkeypatch.setattr(reference, "record", record)
    return seeds


def _run(tmp_path, name, reuse=None):
    said = []
    (tmp_path / name).mkdir()     # the run's work folder (grade.grade makes it)
    values, seed = judge_values.record_judged_values(Workspace(tmp_path / name), REPO, LAB, said.append,
                                                     reuse=reuse)
    return values, seed, said


def test_a_run_records_on_a_seed_of_its_own_and_keeps_it_beside_the_values(tmp_path, recordings):
    values, seed, said = _run(tmp_path, "first")
    _, other, _ = _run(tmp_path, "second")
    assert recordings == [seed, other] and seed != other and seed > 0
    assert json.loads(values.read_text()) == {"seed": seed}
    assert stat.S_IMODE(values.stat().st_mode) == 0o600     # the judge reads it before it drops root
    assert stat.S_IMODE(values.parent.stat().st_mode) == 0o700 and stat.S_IMODE(
        (values.parent / f"{LAB.name}.seed.json").stat().st_mode) == 0o600
    about = json.loads((values.parent / f"{LAB.name}.seed.json").read_text())
    assert about == {"lab": LAB.name, "seed": seed, "stamp": judge_values.recording_stamp(REPO, LAB)}
    assert said and said[0].startswith(f"recorded {LAB.name}'s reference values")


def test_a_later_run_given_the_judge_folder_reuses_values_and_seed_without_recording(tmp_path, recordings):
    values, seed, _ = _run(tmp_path, "first")
    again, same, said = _run(tmp_path, "second", reuse=values.parent)
    assert recordings == [seed] and same == seed
    assert again == tmp_path / "second" / "judge" / f"{LAB.name}.json" and again.read_text() == values.read_text()
    assert said == [f"reused {LAB.name}'s reference values and seed from {values}"]
    # and a third run, given the second's folder, reuses them too
    assert _run(tmp_path, "third", reuse=again.parent)[1] == seed and recordings == [seed]


def test_a_recording_is_not_reused_once_what_made_it_changed(tmp_path, recordings, monkeypatch):
    values, seed, _ = _run(tmp_path, "first")
    monkeypatch.setattr(judge_values, "recording_stamp", lambda root, lab: "another solution")
    _, fresh, said = _run(tmp_path, "second", reuse=values.parent)
    assert recordings == [seed, fresh] and fresh != seed
    assert said[0].startswith(f"recording {LAB.name}'s reference values again: {LAB.name}'s solution")


@pytest.mark.parametrize("damage, why", [
    (lambda folder: (folder / f"{LAB.name}.seed.json").unlink(), "has no recording of"),
    (lambda folder: (folder / f"{LAB.name}.json").unlink(), "has no recording of"),
    (lambda folder: (folder / f"{LAB.name}.seed.json").write_text("{not json"), "cannot be read (JSONDecodeError)"),
    (lambda folder: (folder / f"{LAB.name}.seed.json").write_text('{"seed": "x", "stamp": 1}'),
     "cannot be read (ValueError)"),
], ids=["no seed", "no values", "not JSON", "not a seed"])
def test_a_folder_without_a_whole_recording_is_recorded_again_and_says_why(tmp_path, recordings, damage, why):
    values, seed, _ = _run(tmp_path, "first")
    damage(values.parent)
    _, fresh, said = _run(tmp_path, "second", reuse=values.parent)
    assert recordings == [seed, fresh]
    assert why in said[0], said


def test_the_stamp_follows_the_course_package(tmp_path):
    """What a recording depends on beyond the lab: a change anywhere in course/ changes the stamp."""
    root = tmp_path / "root"
    (root / "course").mkdir(parents=True)
    (root / "course" / "a.py").write_text("x = 1\n")
    before = judge_values.recording_stamp(root, LAB)
    (root / "course" / "a.py").write_text("x = 2\n")
    assert judge_values.recording_stamp(root, LAB) != before


def test_a_judge_values_folder_that_does_not_exist_stops_the_run(tmp_path):
    with pytest.raises(GraderError, match="no such folder"):
        grade.grade(tmp_path, labs=[LAB.name], work=tmp_path / "work", judge_values=tmp_path / "nowhere")
