"""Covers: grader.grading.receipts, deploy.hub.classroom, deploy.hub.class_environment,
deploy.hub.jupyterhub_config.

The classroom's parts, quickly (tests/test_hub.py runs the whole of it on a real hub, in a browser).

- the grader keeps nbgrader's receipts beside a feedback page, so that formgrader's Release Feedback
  returns it through the exchange, and only receipts that look like nbgrader's and that the course's
  collect vouches for (tests/test_exchange.py holds that collect);
- the grader's own processes import this grader, also where nothing installed it (an instructor's copy);
- deploy/hub/classroom.py refuses what would harm the machine before it installs anything, and its
  environment is the course's dependencies with torch as pinned;
- deploy/hub/jupyterhub_config.py gives a student the students' configuration first on their
  JUPYTER_CONFIG_PATH (no formgrader), and the instructor theirs, in their course.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from traitlets.config import Config

from grader.common.nbgrader_cli import GRADER_PARENT, environment
from grader.grading import collect, exchange, receipts
from helpers import REPO, collecting

sys.path.insert(0, str(REPO / "deploy" / "hub"))
import classroom  # noqa: E402  (deploy/hub/classroom.py: a script, on the path above)

LAB = collecting.LAB
SECRET = "ab12" * 32  # as nbgrader's submit writes it: secrets.token_hex(64)
TIMESTAMP = "2026-11-28 21:20:45.025057 UTC"


def _collected(tmp_path: Path, receipts: dict[str, str]) -> collect.Submission:
    """A submission as formgrader collects it, through the course's collect: <student>/<lab>/<lab>.ipynb and
    nbgrader's receipts beside it, and the collect's manifest beside that folder (ada: the test's own user)."""
    handed_in = tmp_path / "exchange" / collecting.COURSE / "inbound" / f"ada+{LAB}+{TIMESTAMP}+r4nd0m"
    handed_in.mkdir(parents=True)
    (handed_in / f"{LAB}.ipynb").write_text("{}")
    for name, text in receipts.items():
        (handed_in / name).write_text(text)
    (tmp_path / "course").mkdir()
    result, log = collecting.collect(tmp_path / "exchange", tmp_path / "course", {"ada": os.getuid()})
    assert result["success"] and "Refused" not in log, log
    return collect.Submission("ada", LAB, tmp_path / "course" / "collected" / "ada" / LAB / f"{LAB}.ipynb")


def test_the_receipts_of_a_collected_submission_go_beside_its_feedback_page(tmp_path):
    submission = _collected(tmp_path, {"timestamp.txt": TIMESTAMP + "\n", "submission_secret.txt": SECRET})
    page_dir = tmp_path / "feedback" / "ada" / LAB
    page_dir.mkdir(parents=True)
    assert receipts.keep(submission, page_dir) == ["timestamp.txt", "submission_secret.txt"]
    assert (page_dir / "timestamp.txt").read_text() == TIMESTAMP
    assert (page_dir / "submission_secret.txt").read_text() == SECRET


@pytest.mark.parametrize("name, text", [
    ("submission_secret.txt", "../../etc/passwd"),
    ("submission_secret.txt", "<script>alert(1)</script>"),
    ("submission_secret.txt", "a" * 400),
    ("timestamp.txt", "yesterday, honest"),
], ids=["a path", "markup", "too long", "not a time"])
def test_a_receipt_that_is_not_nbgrader_s_gets_a_stand_in(tmp_path, name, text):
    good = {"timestamp.txt": TIMESTAMP, "submission_secret.txt": SECRET}
    submission = _collected(tmp_path, {**good, name: text})
    page_dir = tmp_path / "feedback"
    page_dir.mkdir()
    assert receipts.keep(submission, page_dir) == [n for n in good if n != name]
    written = {n: (page_dir / n).read_text() for n in good}
    assert written[name] != text and receipts.RECEIPTS[name].fullmatch(written[name])
    assert all(written[n] == good[n] for n in good if n != name)


def _no_manifest(submission):  # collected by nbgrader's own collect, or put together by hand
    exchange.manifest_path(submission.path.parent.parent, LAB).unlink()
    return submission


def _another_s_manifest(submission):  # ada's collected folder and manifest, renamed bo's
    bo = submission.path.parent.parent.parent / "bo"
    submission.path.parent.parent.rename(bo)
    return collect.Submission("bo", LAB, bo / LAB / f"{LAB}.ipynb")


def _secret_changed(submission):  # not what the collect copied
    (submission.path.parent / "submission_secret.txt").write_text("cd34" * 32)
    return submission


@pytest.mark.parametrize("change", [_no_manifest, _another_s_manifest, _secret_changed],
                         ids=["no manifest", "another student's manifest", "a secret changed since"])
def test_a_receipt_the_course_s_collect_does_not_vouch_for_gets_a_stand_in(tmp_path, change):
    submission = change(_collected(tmp_path, {"timestamp.txt": TIMESTAMP, "submission_secret.txt": SECRET}))
    page_dir = tmp_path / "feedback"
    page_dir.mkdir()
    kept = receipts.keep(submission, page_dir)
    assert "submission_secret.txt" not in kept
    assert (page_dir / "submission_secret.txt").read_text() not in (SECRET, "cd34" * 32)


def test_a_receipt_that_is_a_link_gets_a_stand_in(tmp_path):
    elsewhere = tmp_path / "secret-of-someone-else.txt"
    elsewhere.write_text(SECRET)
    submission = _collected(tmp_path, {"timestamp.txt": TIMESTAMP})
    (submission.path.parent / "submission_secret.txt").symlink_to(elsewhere)
    page_dir = tmp_path / "feedback"
    page_dir.mkdir()
    assert receipts.keep(submission, page_dir) == ["timestamp.txt"]
    assert (page_dir / "submission_secret.txt").read_text() != SECRET


def test_a_notebook_handed_in_flat_gets_stand_ins_and_one_without_a_page_nothing(tmp_path):
    # release_feedback stops at the first page without both receipts: every page gets them.
    flat = tmp_path / "ada" / f"{LAB}.ipynb"
    flat.parent.mkdir()
    flat.write_text("{}")
    (flat.parent / "timestamp.txt").write_text(TIMESTAMP)  # beside a flat notebook: not nbgrader's layout
    page_dir = tmp_path / "feedback"
    page_dir.mkdir()
    assert receipts.keep(collect.Submission("ada", LAB, flat), page_dir) == []
    assert sorted(p.name for p in page_dir.iterdir()) == sorted(receipts.RECEIPTS)
    collected = _collected(tmp_path, {"timestamp.txt": TIMESTAMP})
    assert receipts.keep(collected, tmp_path / "no-page-written") == []
    assert not (tmp_path / "no-page-written").exists()


def test_the_grader_s_processes_import_this_grader_wherever_it_lies():
    paths = environment({})["PYTHONPATH"].split(os.pathsep)
    assert paths[0] == GRADER_PARENT == str(REPO)
    # From elsewhere, with no site-packages (so no install of the course), a process of the grader's finds it.
    run = [sys.executable, "-S", "-c", "import grader; print(grader.__file__)"]
    assert subprocess.run(run, capture_output=True, cwd="/").returncode != 0  # nothing else would find it
    found = subprocess.run(run, env=environment({}), capture_output=True, text=True, cwd="/")
    assert found.stdout.strip() == str(REPO / "grader" / "__init__.py"), found.stderr


def test_the_class_environment_is_the_course_s_dependencies_with_torch_pinned():
    wanted = classroom.requirements("torch==2.13.0")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [r for r in wanted if r.startswith("torch")] == ["torch==2.13.0"]
    assert set(project) - {d for d in project if re.match(r"torch\b", d)} <= set(wanted)
    assert any(r.startswith("jupyterhub==") for r in wanted)
    assert classroom.course_id() == re.search(r'course_id = "([^"]+)"', (REPO / "nbgrader_config.py").read_text())[1]


@pytest.mark.parametrize("instructor, students, words", [
    ("Teacher", ["ada"], "no usable user name"),
    ("teacher", ["ada", "ada"], "a user of their own"),
    ("teacher", ["ada; rm -rf /"], "no usable user name"),
    ("root", ["ada"], "already exists on this machine and was not made by this classroom"),
], ids=["capitals", "twice", "a shell command", "an existing user"])
def test_the_classroom_refuses_before_it_installs_anything(tmp_path, instructor, students, words):
    if os.geteuid() != 0:
        with pytest.raises(classroom.ClassroomError, match="run as root"):
            classroom.setup(tmp_path / "hub", instructor, students, tmp_path / "home", None, "torch", False)
        return
    with pytest.raises(classroom.ClassroomError, match=re.escape(words)):
        classroom.setup(tmp_path / "hub", instructor, students, tmp_path / "home", None, "torch", False)
    assert not (tmp_path / "hub").exists() and not (tmp_path / "home").exists()


def test_removing_a_folder_that_holds_no_classroom_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("removing a classroom needs root, which the refusal says first")
    with pytest.raises(classroom.ClassroomError, match="holds no classroom"):
        classroom.remove(tmp_path)
    assert tmp_path.exists()


class _Spawner:
    def __init__(self, name: str):
        self.user = type("User", (), {"name": name})()
        self.environment = {"PATH": "/usr/bin"}
        self.notebook_dir = None


def test_the_hub_gives_each_role_its_configuration_and_its_folder(tmp_path, monkeypatch):
    config = {role: str(tmp_path / "config" / role) for role in ("everyone", "students", "instructor")}
    (tmp_path / "hub.json").write_text(json.dumps({
        "instructor": "teacher", "students": ["ada", "bo"], "venv": str(tmp_path / "venv"), "proxy": "chp",
        "exchange": str(tmp_path / "exchange"), "config": config, "made_users": []}))
    monkeypatch.setenv("COURSE_HUB_ROOT", str(tmp_path))
    c = Config()
    source = REPO / "deploy" / "hub" / "jupyterhub_config.py"
    exec(compile(source.read_text(), str(source), "exec"), {"get_config": lambda: c, "__file__": str(source)})
    assert c.Authenticator.allowed_users == {"teacher", "ada", "bo"} and c.Authenticator.admin_users == {"teacher"}
    assert c.JupyterHub.ip == "127.0.0.1"  # this machine only, unless asked
    hook = c.Spawner.pre_spawn_hook
    student, teacher = _Spawner("ada"), _Spawner("teacher")
    hook(student)
    hook(teacher)
    assert student.environment["JUPYTER_CONFIG_PATH"].split(os.pathsep) == [config["students"], config["everyone"]]
    assert teacher.environment["JUPYTER_CONFIG_PATH"].split(os.pathsep) == [config["instructor"], config["everyone"]]
    assert (student.notebook_dir, teacher.notebook_dir) == ("~", "~/course")
    assert student.environment["PATH"] == "/usr/bin"  # the rest of the environment kept
