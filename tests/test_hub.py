"""Covers: the hub.

The classroom on a real JupyterHub (deploy/hub/, `make hub`), end to end, each person in their own login.

An instructor and two students are real Unix users, made for the test and removed after it. In
headless Chromium, each logs in to the hub with their password and gets a JupyterLab of their own:
the instructor releases a lab from formgrader; each student fetches it from the Assignment List, one
uploads a finished notebook over it, and both submit; the instructor collects in formgrader, grades
with `python -m grader grade` (the hardened path: jailed, judged) as their own user, and releases the
feedback from formgrader; each student fetches their feedback page. The grades are the work's: full
points for the finished lab, none for the one handed in as released. And the walls hold: a student
reads neither the other's notebook (on disk, or through the other's server) nor the instructor's
solutions, cannot list the submissions in the exchange, and has no formgrader.

Before the collect, the student with nothing done attacks the exchange from a shell, as their own user:
a submission in the other's name dated 2099 with a secret of their choosing, one of their own dated
2099, one whose notebook is a link to the instructor's solution, and one whose notebook is a hard link
(to the solution the kernel refuses: the instructor's home is 0700; to their own file it allows). The
course's collect (grader/grading/exchange.py) refuses each in the log formgrader's Collect dialog shows;
each student's real submission is the one graded, and no feedback is filed under the attacker's secret.

Screenshots of each step are saved under test-artifacts/hub/ (or $COURSE_TEST_ARTIFACTS).
"""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import nbformat
import pytest
from nbgrader.utils import notebook_hash

from helpers import REPO
from helpers.browser import SCREENS, chromium, click_menu
from helpers.hub import classroom
from helpers.submissions import hidden_lines, solved

ARTIFACTS = Path(os.environ.get("COURSE_TEST_ARTIFACTS", REPO / "test-artifacts")) / "hub"
LAB = "08_experts"            # the quickest lab to grade
INSTRUCTOR = "hubtest-teacher"  # names no person on a machine is likely to have: the test makes and removes them
FINISHER, UNTOUCHED = "hubtest-ada", "hubtest-bo"
STEP_S = 120                  # one step in the browser: a server's start, a release, a collect
FORGED_SECRET = "b0" * 64     # the attacker's choice, for the other's feedback to be filed under

pytestmark = [pytest.mark.hub, pytest.mark.timeout(1500)]


def _log_in(browser, hub, name: str):
    """A browser of name's own (its cookies alone), logged in, in their JupyterLab: the instructor's on a
    projector's screen, a student's on a laptop's."""
    context = browser.new_context(viewport=SCREENS["projector" if name == INSTRUCTOR else "laptop"])
    page = context.new_page()
    page.set_default_timeout(STEP_S * 1e3)
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", hub.passwords[name])
    page.click("#login_submit")
    page.wait_for_url(f"**/user/{name}/lab**")  # through the spawn's progress page
    page.wait_for_selector(".lm-MenuBar-itemLabel")
    return page


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def _formgrader(page):
    click_menu(page, "Nbgrader", "Formgrader")
    return page.frame_locator("iframe[src*='formgrader']")


def _formgrader_action(page, column: str, done: str, shot: str) -> str:
    """Click the lab's link in formgrader's column (release, collect, release-feedback), wait for its
    success dialog and return its text (with nbgrader's log)."""
    formgrader = _formgrader(page)
    formgrader.locator("#main-table tr").filter(has_text=LAB).locator(f"td.{column} a").click()
    dialog = formgrader.locator(".modal.in .modal-dialog").filter(has_text=done)  # faded in
    dialog.wait_for()
    for frame in page.frames:  # for the picture: the log's long lines wrapped, the dialog faded in
        if "/formgrader" in frame.url:
            frame.add_style_tag(content=".modal pre { white-space: pre-wrap; }")
            frame.wait_for_function("() => [...document.querySelectorAll('.modal.in')].every("
                                    "m => getComputedStyle(m).opacity === '1')")
    _shot(page, shot)
    shown = dialog.inner_text()
    dialog.get_by_role("button", name="OK").click()
    return shown


def _assignment_list(page):
    click_menu(page, "Nbgrader", "Assignment List")
    page.wait_for_function("() => { const listed = document.querySelector('#released_assignments_list');"
                           " return listed && !listed.innerText.includes('Loading'); }")


def _wait_for_cells(page, path: Path, wanted: list, what: str) -> None:
    """Wait until the notebook at path parses and holds `wanted` cells: it is written when it is written."""
    deadline = time.monotonic() + STEP_S
    while True:
        try:
            if nbformat.read(path, as_version=4).cells == wanted:
                return
        except (OSError, nbformat.reader.NotJSONError):
            pass  # not there yet, or half written
        assert time.monotonic() < deadline, f"{what} after {STEP_S} s: {path}"
        page.wait_for_timeout(500)


def _fetch_and_submit(page, hub, name: str, finished: Path | None) -> None:
    _assignment_list(page)
    page.locator("#released_assignments_list .list_item").filter(has_text=LAB).get_by_role(
        "button", name="Fetch").click()
    fetched = page.locator("#fetched_assignments_list .list_item").filter(has_text=LAB).first
    fetched.wait_for()
    copy = hub.home(name) / LAB / f"{LAB}.ipynb"
    _wait_for_cells(page, copy, nbformat.read(REPO / "labs" / LAB / f"{LAB}.ipynb", as_version=4).cells,
                    "the fetched notebook is not the release")
    if finished is not None:  # upload the finished lab over the fetched one, in the file browser
        page.locator(".jp-DirListing-item").filter(has_text=LAB).first.dblclick()  # into the lab's folder
        page.locator(".jp-BreadCrumbs").get_by_text(LAB).wait_for()
        with page.expect_file_chooser() as chooser:
            page.locator(".jp-FileBrowser-toolbar").get_by_title("Upload Files").click()
        chooser.value.set_files(str(finished))
        page.locator(".jp-Dialog").get_by_role("button", name="Overwrite").click()
        _wait_for_cells(page, copy, nbformat.read(finished, as_version=4).cells,
                        "the upload did not replace the fetched notebook")
        _assignment_list(page)
    page.locator("#fetched_assignments_list .list_item").filter(has_text=LAB).first.get_by_role(
        "button", name="Submit").click()
    page.locator("#submitted_assignments_list .list_item").filter(has_text=LAB).first.wait_for()
    _shot(page, f"{name}-submitted")


def _attack_the_exchange(hub) -> dict[str, str]:
    """UNTOUCHED's hand-ins around the Assignment List, from a shell as their own user; {attack: folder}."""
    inbound = Path(hub.state["exchange"]) / hub.state["course_id"] / "inbound"
    own = hub.home(UNTOUCHED) / LAB / f"{LAB}.ipynb"  # the release, as fetched
    solution = hub.home(INSTRUCTOR) / "course" / "solutions" / LAB / f"{LAB}.ipynb"
    future, now = "2099-01-01 00:00:00.000000 UTC", datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    folders = {"in the other's name": f"{FINISHER}+{LAB}+{future}+forged",
               "from the future": f"{UNTOUCHED}+{LAB}+{future}+future",
               "a symbolic link": f"{UNTOUCHED}+{LAB}+{now}+symlink",
               "a hard link": f"{UNTOUCHED}+{LAB}+{now}+hardlink"}
    script = f"""
import os, shutil
for attack, name in {folders!r}.items():
    folder = os.path.join({str(inbound)!r}, name)
    os.mkdir(folder)
    notebook = os.path.join(folder, {LAB + ".ipynb"!r})
    if attack == "a symbolic link":
        os.symlink({str(solution)!r}, notebook)
    elif attack == "a hard link":
        try:
            os.link({str(solution)!r}, notebook)
            print("linked the solution")
        except OSError as error:
            print("no hard link to the solution:", error.strerror)
            os.link({str(own)!r}, notebook)
    else:
        shutil.copyfile({str(own)!r}, notebook)
    for receipt, text in (("timestamp.txt", name.split("+")[2]), ("submission_secret.txt", {FORGED_SECRET!r})):
        with open(os.path.join(folder, receipt), "w") as f:
            f.write(text)
"""
    done = subprocess.run([f"{hub.state['venv']}/bin/python", "-c", script], capture_output=True, text=True,
                          timeout=60, **hub.as_user(UNTOUCHED))
    assert done.returncode == 0, done.stderr
    assert "no hard link to the solution: Permission denied" in done.stdout, done.stdout  # its home is 0700
    return folders


def _fails_as(hub, name: str, code: str) -> str:
    """Run Python as `name`; returns the exception it raised by name, '' where it raised none."""
    probe = f"try:\n    {code}\n    print('')\nexcept Exception as error:\n    print(type(error).__name__)"
    result = subprocess.run([f"{hub.state['venv']}/bin/python", "-c", probe], capture_output=True, text=True,
                            timeout=60, **hub.as_user(name))
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_an_instructor_and_two_students_on_the_hub(tmp_path):
    shutil.rmtree(ARTIFACTS, ignore_errors=True)  # this run's pictures alone
    finished = tmp_path / f"{LAB}.ipynb"
    nbformat.write(solved(LAB), finished)
    with classroom(INSTRUCTOR, [FINISHER, UNTOUCHED], ARTIFACTS / "hub.log") as hub, chromium() as browser:
        pages = {}
        try:
            _play(hub, browser, pages, finished)
        except Exception:
            for name, page in pages.items():  # what each person saw when it failed
                _shot(page, f"failed-{name}")
            raise


def _play(hub, browser, pages: dict, finished: Path) -> None:
    """The term, step by step; `pages` gathers each person's browser page as they log in."""
    # every user's JupyterLab starts with the course's defaults: no news prompt over formgrader's links
    overrides = Path(hub.state["venv"]) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    assert overrides.read_bytes() == (REPO / "deploy" / "handout" / "jupyterlab-overrides.json").read_bytes()
    teacher = pages[INSTRUCTOR] = _log_in(browser, hub, INSTRUCTOR)
    assert (hub.home(INSTRUCTOR) / "course" / "solutions" / LAB).is_dir()
    _formgrader_action(teacher, "release", f"Successfully released '{LAB}'", "released")

    students = {name: _log_in(browser, hub, name) for name in (FINISHER, UNTOUCHED)}
    pages.update(students)
    for name, page in students.items():
        _fetch_and_submit(page, hub, name, finished if name == FINISHER else None)

    attacks = _attack_the_exchange(hub)
    shown = _formgrader_action(teacher, "collect", f"Successfully collected submissions of '{LAB}'", "collected")
    refusals = {line for line in shown.splitlines() if line.startswith("[ERROR] Refused")}
    for attack, words in {"in the other's name": f"it claims to be {FINISHER}'s, but its owner is {UNTOUCHED}",
                          "from the future": "is past this machine's clock",
                          "a symbolic link": "symbolic link",
                          "a hard link": "has 2 hard links"}.items():
        assert any(repr(attacks[attack]) in line and words in line for line in refusals), (attack, shown)
    course = hub.home(INSTRUCTOR) / "course"
    for name in students:  # as handed in, with nbgrader's receipts, where the grader reads them
        handed_in = course / "grader" / "work" / "collected" / name / LAB
        assert {f"{LAB}.ipynb", "timestamp.txt", "submission_secret.txt"} <= {p.name for p in handed_in.iterdir()}
        assert (handed_in / "submission_secret.txt").read_text() != FORGED_SECRET
    graded = subprocess.run(
        [f"{hub.state['venv']}/bin/python", "-m", "grader", "grade", "grader/work/collected", "--lab", LAB,
         "--jobs", "2"], capture_output=True, text=True, timeout=900, **hub.as_user(INSTRUCTOR, course))
    (ARTIFACTS / "grading.log").write_text(graded.stdout + graded.stderr)
    assert graded.returncode == 0, graded.stdout[-3000:] + graded.stderr[-3000:]
    assert "WARNING: grading without a jail" not in graded.stdout
    with open(course / "grader" / "work" / "grades.csv", newline="") as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f)}
    finished_row, untouched_row = rows[FINISHER], rows[UNTOUCHED]
    assert float(finished_row[f"{LAB} score"]) == float(finished_row[f"{LAB} max score"]) > 0, finished_row
    assert float(untouched_row[f"{LAB} score"]) == 0, untouched_row
    teacher.reload()
    teacher.wait_for_selector(".lm-MenuBar-itemLabel")
    _formgrader_action(teacher, "release-feedback", f"Successfully released feedback of '{LAB}'",
                       "feedback-released")

    feedback = {}
    for name, page in students.items():
        _assignment_list(page)
        page.locator("#submitted_assignments_list .list_item").filter(has_text=LAB).first.get_by_role(
            "button", name="Fetch Feedback").click()
        view = page.locator("#submitted_assignments_list").get_by_text("(view feedback)").first
        view.wait_for()
        _shot(page, f"{name}-feedback")
        (feedback[name],) = (hub.home(name) / LAB / "feedback").glob(f"*/{LAB}.html")
        shown = feedback[name].read_text()
        assert not any(line in shown for line in hidden_lines(LAB)), f"{name}'s feedback shows a hidden test"
        # The page as the student reads it: (view feedback) shows its folder, a double click opens it.
        view.click()
        page.locator(".jp-DirListing-item").filter(has_text=f"{LAB}.html").dblclick()
        row = rows[name]
        verdict = f"graded: {float(row[f'{LAB} score']):g} of {float(row[f'{LAB} max score']):g} points"
        page.frame_locator(".jp-HTMLViewer iframe").get_by_text(verdict).wait_for()
        _shot(page, f"{name}-feedback-page")
        for screen, size in SCREENS.items():     # read on a laptop, and on a projector: no line runs off the page
            page.set_viewport_size(size)
            wide = page.frame_locator(".jp-HTMLViewer iframe").locator("html").evaluate(
                "html => [html.scrollWidth, html.clientWidth]")
            assert wide[0] <= wide[1], f"{name}'s feedback page is {wide[0]} px wide in {wide[1]} px ({screen})"
        page.set_viewport_size(SCREENS["laptop"])

    # No page was filed under the attacker's secret: each page went to its student's own.
    filed = Path(hub.state["exchange"]) / hub.state["course_id"] / "feedback"
    assert not (filed / f"{notebook_hash(secret=FORGED_SECRET, notebook_id=LAB)}.html").exists()
    assert len(list(filed.glob("*.html"))) == 2

    # The walls: a student reads neither the other's work nor the instructor's course, and has no formgrader.
    other = hub.home(FINISHER) / LAB / f"{LAB}.ipynb"
    solutions = hub.home(INSTRUCTOR) / "course" / "solutions" / LAB / f"{LAB}.ipynb"
    inbound = Path(hub.state["exchange"]) / hub.state["course_id"] / "inbound"
    assert _fails_as(hub, UNTOUCHED, f"open({str(other)!r}).read()") == "PermissionError"
    assert _fails_as(hub, UNTOUCHED, f"open({str(solutions)!r}).read()") == "PermissionError"
    assert _fails_as(hub, UNTOUCHED, f"__import__('os').listdir({str(inbound)!r})") == "PermissionError"
    assert _fails_as(hub, UNTOUCHED, f"open({str(feedback[FINISHER])!r}).read()") == "PermissionError"
    assert _fails_as(hub, FINISHER, f"open({str(feedback[FINISHER])!r}).read()") == ""  # the probe can succeed
    intruder = students[UNTOUCHED]
    response = intruder.request.get(f"{hub.url}/user/{FINISHER}/api/contents/{LAB}/{LAB}.ipynb")
    assert response.status in (403, 404) and '"cells"' not in response.text(), response.status
    assert intruder.request.get(f"{hub.url}/user/{UNTOUCHED}/formgrader").status == 404
    intruder.locator(".lm-MenuBar-itemLabel").get_by_text("Nbgrader", exact=True).click()
    intruder.locator(".lm-Menu-itemLabel").get_by_text("Assignment List", exact=True).wait_for()  # the menu is drawn
    items = intruder.locator(".lm-Menu-itemLabel").all_inner_texts()
    assert "Assignment List" in items and "Formgrader" not in items, items
