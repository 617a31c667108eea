"""Covers: the browser.

The course in a real browser: JupyterLab in headless Chromium, driven as a person drives it.

Every lab's solution notebook is opened and run with Run > Run All Cells; each must run clean
(its time is recorded, not asserted: bench/labs.py, run alone, holds the labs' time),
creating no file in its folder and recording the values grader/reference/
stores (this is its lab's run on torch's "default" instruction set and 2 threads, on 4
ranks where it launches ranks: helpers/solution_runs.py), and its figures' controls must respond (a
slider moved with the keyboard redraws the figure and its numbers). The instructor's demo
shows only views that a lab shows, so their controls are tested here; the demo itself runs
headless in tests/test_demo.py, and `make demo` opens it in JupyterLab in test_lab_server.py
(a second run of it here cost 100 s of the suite's 30 minutes). Rank output must
appear in the cell, and a deadlocked launch must end in the cell with the readable error.
The nbgrader extensions load for an instructor (formgrader lists the labs, the Assignment List
finds the one-machine exchange), and Validate tells a student what fails and what passes. A lab's
whole way through nbgrader's exchange (released by formgrader, fetched and submitted from the
Assignment List, collected, graded, its feedback returned) is played on a real JupyterHub, each
person in their own login: tests/test_hub.py.

The server is the one `make lab` starts (its command from `make -n lab`), serving a copy
of the course, so nothing a test does touches the repository. A screenshot of each lab
is saved under test-artifacts/browser/ (or $COURSE_TEST_ARTIFACTS): look at them.
"""
from __future__ import annotations

import html as html_module
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from course.placement import RANKS_VARIABLE
from grader import reference
from grader.common.labs import ignore_patterns
from helpers import REPO, make_environment
from helpers import solution_runs as runs
from helpers.browser import (
    LAB_SETTINGS,
    SCREENS,
    SERVER_ARGS,
    Notebook,
    chromium,
    move_first_slider,
    text_of,
    widget_cells,
)
from helpers.forked_cells import settings_env
from helpers.lab_server import TEST_LAB_ARGS, TOKEN, make_jupyter_command, serve
from helpers.submissions import hidden_lines, solved

ARTIFACTS = Path(os.environ.get("COURSE_TEST_ARTIFACTS", REPO / "test-artifacts")) / "browser"
SOLUTIONS = [p.relative_to(REPO) for p in runs.SOLUTIONS]
DEADLOCK_TIMEOUT_S = 5
# A hung run's limit, not the labs' time (bench/labs.py holds that): the browser, the server, the
# kernel and a second test worker share the same 2 cores.
RUN_LIMIT_S = 300

pytestmark = [pytest.mark.browser, pytest.mark.timeout(RUN_LIMIT_S + 120)]


def _scratch_notebook() -> nbformat.NotebookNode:
    """What a student might type: ranks that print, then a launch whose rank 1 skips a collective."""
    hello = ("import torch, torch.distributed as dist, course\n\n"
             "def hello():\n"
             "    print(f'hello from rank {dist.get_rank()} of {dist.get_world_size()}')\n\n"
             "course.launch(hello, 2);")
    deadlock = ("def rank_1_skips_the_all_reduce():\n"
                "    if dist.get_rank() == 1:\n"
                "        return 'skipped'\n"
                "    dist.all_reduce(torch.ones(4))\n\n"
                f"course.launch(rank_1_skips_the_all_reduce, 2, timeout={DEADLOCK_TIMEOUT_S})")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(hello), nbformat.v4.new_code_cell(deadlock)])
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    return nb


def _prediction_notebook() -> nbformat.NotebookNode:
    """A drawing of the ring, a prediction cell as the labs have them, and the cell that sets it beside the value."""
    cells = ["from course import drawings\n\ndrawings.draw_ring(4);",
             "PREDICTED = None      # tensors",
             "from course import predict\n\n"
             "predict.against(PREDICTED, 3, \"the naive root's bytes, 4 ranks\", unit=\"tensors\")"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    return nb


def _recording_cell(folder: Path) -> nbformat.NotebookNode:
    """A first cell that makes the run record its checked values into folder, as
    `python -m grader reference --check` runs a solution (set in the kernel, not the server:
    the other notebooks here run as a student's do)."""
    return nbformat.v4.new_code_cell(
        "# Added by tests/test_browser.py: this run also records the lab's checked values.\n"
        f"import os\nos.environ.update({reference.recording_env(folder)!r})")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """Where each solution's run records its checked values: one folder per lab."""
    return tmp_path_factory.mktemp("recorded")


@pytest.fixture(scope="module")
def course_copy(tmp_path_factory, recorded) -> Path:
    """The course as an instructor's and a student's server sees it: solutions (each with a first
    cell that records its values and a last that reports its settings), release, nbgrader config,
    a student's finished lab 1 and a scratch notebook."""
    root = tmp_path_factory.mktemp("course")
    for folder in ("solutions", "labs"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns(*ignore_patterns(REPO)))
    for path in SOLUTIONS:
        nb = runs.with_probe(nbformat.read(root / path, as_version=4))
        nb.cells.insert(0, _recording_cell(recorded / path.parent.name))
        nbformat.write(nb, root / path)
    shutil.copy(REPO / "nbgrader_config.py", root)
    (root / "student").mkdir()
    nbformat.write(solved("01_single_gpu"), root / "student" / "01_single_gpu.ipynb")
    nbformat.write(_scratch_notebook(), root / "student" / "scratch.ipynb")
    nbformat.write(_prediction_notebook(), root / "student" / "predict.ipynb")
    return root


@pytest.fixture(scope="module")
def server(course_copy, tmp_path_factory):
    # `make lab`'s command, serving the copy instead of the repository.
    argv = make_jupyter_command("lab", [*TEST_LAB_ARGS, *SERVER_ARGS])
    root_dir = [i for i, arg in enumerate(argv) if arg.startswith("--ServerApp.root_dir=")]
    assert len(root_dir) == 1, f"`make lab` should set --ServerApp.root_dir once: {argv}"
    argv[root_dir[0]] = f"--ServerApp.root_dir={course_copy}"
    # Each lab's run on torch's "default" instruction set, on 4 ranks where it launches ranks
    # (helpers/solution_runs.py has why).
    env = {RANKS_VARIABLE: str(runs.BROWSER_RANKS), **settings_env(*runs.IN_THE_BROWSER)}
    with serve(argv, tmp_path_factory.mktemp("jupyter"), cwd=course_copy, settings=LAB_SETTINGS, env=env) as lab:
        yield lab


@pytest.fixture(scope="module")
def browser():
    with chromium() as running:
        yield running


@pytest.fixture(params=list(SCREENS))
def page(browser, request):
    """A page on each screen the course is looked at on (a test that names one, by indirect parametrizing,
    on that one alone)."""
    context = browser.new_context(viewport=SCREENS[request.param])
    yield context.new_page()
    context.close()


# Each lab on one screen, the two screens in turn: both looked at on every run, no lab run twice.
LAB_SCREENS = [list(SCREENS)[i % len(SCREENS)] for i in range(len(SOLUTIONS))]


def test_the_server_serves_the_copy_with_the_tests_settings(server, course_copy):
    info = [json.loads(f.read_text()) for f in server.runtime_dir.glob("jpserver-*.json")]
    assert [Path(i["root_dir"]) for i in info] == [course_copy]


@pytest.fixture(scope="module")
def executed_labs(tmp_path_factory) -> Path:
    """Each lab's notebook as its run in JupyterLab left it (outputs and all): the site's figures
    (test_the_site_shows_every_lab_as_released_with_its_figures), with no second run of the labs."""
    return tmp_path_factory.mktemp("executed")


@pytest.mark.parametrize("path, page", list(zip(SOLUTIONS, LAB_SCREENS)), indirect=["page"],
                         ids=[f"{p.stem}-{screen}" for p, screen in zip(SOLUTIONS, LAB_SCREENS)])
def test_every_lab_runs_in_jupyterlab_and_its_figures_respond(server, page, path, record_property, course_copy,
                                                              recorded, executed_labs):
    notebook = Notebook(page, server, str(path))
    before = runs.snapshot((course_copy / path).parent)
    notebook.open()
    seconds = notebook.run_all(RUN_LIMIT_S)
    record_property("browser_run_s", round(seconds, 1))
    errors = notebook.errors()
    assert not errors, f"{path} in JupyterLab:\n" + "\n".join(errors)
    if path.parent.name == path.stem:     # a lab, not the demo: its run as it stands, before a slider moves
        run = page.evaluate("() => window.jupyterapp.shell.currentWidget.context.model.toJSON()")
        for cell in run["cells"]:           # JupyterLab's model gives a markdown cell `attachments: null`
            if cell.get("attachments", {}) is None:
                del cell["attachments"]
        (executed_labs / f"{path.stem}.ipynb").write_text(json.dumps(run), encoding="utf-8")

    cells = notebook.code_cells()
    # its lab's run on 4 ranks where it launches ranks (helpers/solution_runs.py)
    name = f"{path} in JupyterLab"
    runs.assert_created_nothing(name, (course_copy / path).parent, before)
    runs.assert_ran_as_asked(name, "".join(text_of(o) for o in cells[-1]["outputs"]), runs.IN_THE_BROWSER)
    runs.assert_recorded_the_reference(name, path.parent.name, recorded / path.parent.name)
    with_controls = widget_cells(cells)
    if "_view.show(" in (REPO / path).read_text():
        assert with_controls, f"{path} shows a view, but no figure with live controls rendered in JupyterLab"
    for index in with_controls:
        moved = move_first_slider(notebook, index)
        before, after = moved["before"], moved["after"]
        where = f"{path}, cell {index}, slider {moved['label']!r}"
        assert after["value"] != before["value"], f"{where}: the arrow key did not move the slider"
        assert after["figure"] != before["figure"], f"{where}: moved to {after['value']}, the figure stayed"
        assert after["numbers"] != before["numbers"], f"{where}: moved to {after['value']}, the numbers stayed"
        assert re.search(r"\d", after["numbers"]), f"{where}: no numbers under the figure: {after['numbers']!r}"

    showcase = next(iter(with_controls), None)
    if showcase is None:   # no widget: the cell where the ranks speak, else the last figure
        showcase = next((c["index"] for c in cells if any("[rank 1]" in text_of(o) for o in c["outputs"])),
                        max(c["index"] for c in cells if any("image/png" in o.get("data", {}) for o in c["outputs"])))
    notebook.screenshot(showcase, ARTIFACTS / f"{path.stem}.png")
    print(f"{path}: ran in JupyterLab in {seconds:.1f} s; screenshot {ARTIFACTS / path.stem}.png")
    notebook.close()


def test_rank_output_and_a_deadlock_reach_the_cell_readably(server, page):
    notebook = Notebook(page, server, "student/scratch.ipynb")
    notebook.open()
    started = time.monotonic()
    notebook.run_all(60)
    elapsed = time.monotonic() - started
    hello, deadlock = notebook.code_cells()
    shown = notebook.output_text(hello["index"], "[rank 1]")
    for rank in (0, 1):
        assert f"[rank {rank}] hello from rank {rank} of 2" in shown, shown

    errors = [o for o in deadlock["outputs"] if o["output_type"] == "error"]
    assert [e["ename"] for e in errors] == ["RankTimeout"], deadlock["outputs"]
    shown = notebook.output_text(deadlock["index"], "did not finish rank_1_skips_the_all_reduce")
    assert f"did not finish rank_1_skips_the_all_reduce within {DEADLOCK_TIMEOUT_S} s" in shown, shown
    assert "dist.all_reduce(torch.ones(4))" in shown, f"the page does not show where rank 0 waits:\n{shown}"
    assert "rank 1" in shown and "returned" in shown, f"the page does not say that rank 1 returned:\n{shown}"
    assert elapsed < DEADLOCK_TIMEOUT_S + 45, f"the deadlocked cell took {elapsed:.0f} s to end"
    notebook.screenshot(deadlock["index"], ARTIFACTS / "deadlock.png")
    notebook.close()


def test_a_drawing_shows_and_a_prediction_typed_in_the_page_comes_back_against_the_value(server, page):
    notebook = Notebook(page, server, "student/predict.ipynb")
    notebook.open()
    notebook.run_all(120)
    assert not notebook.errors(), notebook.errors()
    drawing, prediction, verdict = notebook.code_cells()
    ring = notebook.cell(drawing["index"]).locator(".jp-RenderedImage img")
    ring.first.wait_for(timeout=60_000)      # rendered after the run's end
    assert ring.count() == 1, "the ring is drawn more than once"
    notebook.output_text(verdict["index"], "You wrote no prediction")
    # A student types a number in place of None, as the labs' prediction cells ask, and runs all again.
    editor = notebook.cell(prediction["index"]).locator(".cm-content")
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("PREDICTED = 2")
    notebook.run_all(120)
    shown = notebook.output_text(verdict["index"], "you predicted 2")
    assert "you predicted 2 tensors, measured 3 tensors: 33% too low" in shown, shown
    notebook.screenshot(verdict["index"], ARTIFACTS / "prediction.png")
    notebook.close()


@pytest.mark.parametrize("page", ["projector"], indirect=True)
def test_nbgrader_extensions_load_for_an_instructor(server, page):
    notebook = Notebook(page, server, "labs/index.ipynb")
    page.goto(f"{server.url}/lab?reset&token={TOKEN}")
    page.wait_for_selector(".lm-MenuBar-itemLabel")
    page.locator(".lm-MenuBar-itemLabel").get_by_text("Nbgrader", exact=True).click()
    formgrader_item = page.locator(".lm-Menu-itemLabel").get_by_text("Formgrader", exact=True)
    formgrader_item.wait_for()  # the menu is drawn after the click returns
    items = page.locator(".lm-Menu-itemLabel").all_inner_texts()
    assert {"Assignment List", "Course List", "Formgrader", "Create assignment"} <= set(items), items
    # From the menu already open: closing it and clicking the menu bar again raced on a loaded machine
    # (a click that came before the close toggled the menu shut, and Formgrader never showed).
    formgrader_item.click()
    formgrader = page.frame_locator("iframe[src*='formgrader']")
    labs = formgrader.locator("#main-table td.name")
    labs.first.wait_for(timeout=30_000)
    listed = labs.all_inner_texts()
    assert listed == sorted(p.parent.name for p in SOLUTIONS if p.parent.name[:2].isdigit()), listed
    assert "exchange directory" not in formgrader.locator("body").inner_text()
    page.screenshot(path=str(ARTIFACTS / "formgrader.png"))

    notebook.menu("Nbgrader", "Assignment List")
    released = page.locator("#released_assignments_list")
    released.wait_for(timeout=30_000)
    page.wait_for_function("() => !document.querySelector('#released_assignments_list')"
                           ".innerText.includes('Loading')", timeout=30_000)
    listing = page.locator(".jp-LabShell").inner_text()
    assert "exchange directory does not exist" not in listing, listing[:2000]
    assert "Error fetching courses" not in listing, listing[:2000]
    page.screenshot(path=str(ARTIFACTS / "assignment-list.png"))


@pytest.mark.parametrize("path, verdict", [
    ("labs/01_single_gpu/01_single_gpu.ipynb", "failed"),
    ("student/01_single_gpu.ipynb", "passes"),
], ids=["the release as handed out", "a finished lab"])
@pytest.mark.parametrize("page", ["laptop"], indirect=True)
def test_validate_tells_a_student_what_fails_and_passes_a_finished_lab(server, page, path, verdict):
    notebook = Notebook(page, server, path)
    notebook.open()
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-NotebookPanel-toolbar").get_by_role(
        "button", name="Validate").click()
    dialog = page.locator(".jp-Dialog").filter(has_text="Validation Results")   # the results, not "Validating"
    dialog.wait_for(timeout=RUN_LIMIT_S * 1e3)
    text = dialog.inner_text()
    assert "Validation Results" in text, text[:2000]
    if verdict == "passes":
        assert "Success! Your notebook passes all the tests." in text, text[:2000]
    else:
        assert "The following cell failed" in text and "NotImplementedError" in text, text[:2000]
        assert "check_sleeps(PhaseTimer" in text, f"the dialog does not show which cell failed:\n{text[:2000]}"
        # the untouched stub says what to write (grader/common/stubs.py), not a bare NotImplementedError
        assert "NotImplementedError: PhaseTimer." in text and "is yours to write" in text, text[:2000]
    page.screenshot(path=str(ARTIFACTS / f"validate-{verdict}.png"))
    dialog.locator("button").last.click()
    notebook.close()



def test_make_test_installs_the_browser_before_the_tests_run():
    env = make_environment()
    dry_run = subprocess.run(["make", "--no-print-directory", "-n", "test"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=60)
    assert dry_run.returncode == 0, dry_run.stderr
    commands = dry_run.stdout.splitlines()
    browser = next(i for i, c in enumerate(commands) if c == "sh tests/browser-tools.sh")
    pytest_run = next(i for i, c in enumerate(commands) if "-m pytest" in c)
    assert browser < pytest_run, commands


@pytest.mark.parametrize("page", ["projector"], indirect=True)
def test_an_instructor_grades_a_written_answer_by_hand_in_formgrader(server, page, course_copy):
    """A lab 4 submission whose written answer autograde left pending (as `grader grade` leaves it in
    the class gradebook): formgrader's manual grading page shows the student's markup as text, the
    instructor types 1.5 of 2 points, the gradebook holds them and the export counts them apart
    from the autograded score, nothing pending any more; the model answer and rubric are under the answer."""
    from nbgrader.api import Gradebook, MissingEntry

    from grader.common import rubrics
    from grader.grading import export
    from grader.grading.gradebook import written_points

    lab, student, gid = "04_hybrid", "written_student", "written_averaging_groups"
    source = nbformat.read(REPO / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    model_answers = rubrics.model_answers(source)   # before the answer below takes the cell's place
    at = next(i for i, c in enumerate(source.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == gid)
    question, answer = source.cells[at - 1], source.cells[at]
    answer.source = "Only the same position holds the same shard. <img src=x onerror=\"document.title='ran'\">"
    autograded = course_copy / "grader" / "work" / "autograded" / student / lab / f"{lab}.ipynb"
    autograded.parent.mkdir(parents=True, exist_ok=True)
    graded = nbformat.v4.new_notebook(cells=[question, answer], metadata=source.metadata)
    assert rubrics.show_beside_answers(graded, model_answers) == [gid]   # as `grader grade` leaves it
    nbformat.write(graded, autograded)
    db = f"sqlite:///{course_copy / 'grader' / 'work' / 'gradebook.db'}"
    with Gradebook(db, course_id="multi-gpu-course") as gb:
        gb.update_or_create_assignment(lab)
        try:
            gb.find_notebook(lab, lab)
        except MissingEntry:
            gb.add_notebook(lab, lab)
        gb.add_grade_cell(gid, lab, lab, max_score=2, cell_type="markdown")
        gb.add_solution_cell(gid, lab, lab)
        gb.update_or_create_student(student)
        submission = gb.add_submission(lab, student)
        grade = gb.find_grade(gid, lab, lab, student)
        grade.needs_manual_grade = True  # autograde's mark for a changed answer: no score either way
        gb.db.commit()
        notebook_id = submission.notebooks[0].id
        assert written_points(gb, lab, student, {gid: 2.0}).pending == 2.0

    page.goto(f"{server.url}/lab?token={TOKEN}", wait_until="domcontentloaded")  # logs in: formgrader's API calls too
    page.goto(f"{server.url}/formgrader/submissions/{notebook_id}/?index=0")
    score = page.locator(f"input.score#{gid}")
    score.wait_for(timeout=30_000)
    # The input is in the page's HTML; formgrader saves it only once its grades have loaded (a second
    # request): typed before that, on a loaded machine, the score went nowhere.
    page.wait_for_function("() => window.formgrader && formgrader.grades && formgrader.grades.loaded",
                           timeout=30_000)
    shown = page.locator("body").inner_text()
    assert "onerror=" in shown  # the student's markup, as text
    # the model answer and rubric from solutions/, rendered under the answer, for whoever marks it
    assert rubrics.RUBRIC_TITLE in shown and "Rubric (2 points)." in shown
    assert shown.index("Only the same position holds") < shown.index(rubrics.RUBRIC_TITLE)
    score.fill("1.5")
    with page.expect_response(lambda r: "/formgrader/api/grade/" in r.url and r.request.method == "PUT",
                              timeout=30_000) as put:
        score.press("Tab")  # formgrader saves on change
    assert put.value.ok, f"formgrader's save answered {put.value.status}: {put.value.text()[:500]}"
    page.screenshot(path=str(ARTIFACTS / "formgrader-written-answer.png"))
    deadline = time.monotonic() + 30
    while True:
        with Gradebook(db, course_id="multi-gpu-course") as gb:
            saved = gb.find_grade(gid, lab, lab, student).manual_score
        if saved is not None or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert saved == 1.5
    assert page.title() != "ran"
    status = {student: {lab: {"graded": True, "verdict": ["graded: 0 of 13 points"]}}}
    row = export.rows([student], {lab: 13.0}, status, db, course_copy, {lab: {gid: 2.0}})[0]
    assert (row[f"{lab} written score"], row[f"{lab} pending manual"], row["total score"]) == (1.5, 0.0, 1.5)
    assert "written answers: 1.5 of 2 points, graded by hand" in row[f"{lab} verdict"]


# --- the course as a website (course_tools/site.py) -------------------------------------------------

@pytest.mark.parametrize("page", ["laptop"], indirect=True)
def test_the_site_shows_every_lab_as_released_with_its_figures(page, executed_labs, tmp_path):
    """`python -m course_tools site` from the runs above: a page per lab, the release's cells (no answer, no hidden
    test) with each demonstration's figures, a launch button to a JupyterHub; looked at in Chromium."""
    from course_tools.site import with_figures
    from grader.common.labs import find_labs

    hub, repository = "https://hub.example.edu", "https://github.com/example/multi-gpu-course"
    built = subprocess.run([sys.executable, "-m", "course_tools", "site", "--out", str(tmp_path / "site"), "--executed",
                            str(executed_labs), "--hub-url", hub, "--repository", repository, "--branch", "fall"],
                           cwd=REPO, capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    html = tmp_path / "site" / "_build" / "html"
    for lab in find_labs(REPO):
        page_path = html / "labs" / lab.name / f"{lab.name}.html"
        assert page_path.is_file(), f"the site has no page for {lab.name}:\n{built.stdout[-2000:]}"
        text = page_path.read_text(encoding="utf-8")
        released = nbformat.read(REPO / "labs" / lab.name / f"{lab.name}.ipynb", as_version=4)
        executed = executed_labs / f"{lab.name}.ipynb"
        if executed.is_file():     # its run above; else the site ran it, and its figures are counted on the page
            shown = with_figures(released, nbformat.read(executed, as_version=4))
            figures = sum("image/png" in o.get("data", {}) for c in shown.cells if c.cell_type == "code"
                          for o in c.outputs)
            assert figures > 0 and text.count("<img") >= figures, (lab.name, figures, text.count("<img"))
        assert text.count("<img") > 0, f"{lab.name}'s page shows no figure"
        assert f"{hub}/hub/user-redirect/git-pull?repo=" in text, f"{lab.name}'s page has no launch button to the hub"
        assert "branch%3Dfall" in text or "branch=fall" in text, f"{lab.name}'s launch button ignores --branch"
        assert "VBox(" not in html_module.unescape(text), f"{lab.name}'s page prints a widget's repr"
        page_text = html_module.unescape(text)
        leaked = [line for line in (hidden_lines(lab.name) if lab.points else []) if line in page_text]
        assert not leaked, f"{lab.name}'s page shows hidden test lines: {leaked[:3]}"
        assert "### BEGIN SOLUTION" not in page_text
    assert f"{hub}/hub/user-redirect/git-pull?repo=" in (html / "labs" / "index.html").read_text(encoding="utf-8"), \
        "the index page has no launch button to the hub"
    page.goto((html / "index.html").as_uri())
    page.get_by_role("link", name=re.compile("08 · Experts")).first.click()
    page.wait_for_load_state("load")
    images = page.evaluate("() => [...document.images].map(i => [i.complete, i.naturalWidth])")
    assert images and all(done and width > 0 for done, width in images), images
    page.screenshot(path=str(ARTIFACTS / "site-08_experts.png"))
