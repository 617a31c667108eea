"""Covers: grader.feedback.safety, grader.feedback.page.

Feedback pages run nothing of the student's and show no hidden test.

Unit tests render crafted notebooks through grader.feedback.page (without a
gradebook); a student whose notebook does all of it at once is graded in the
shared lab 1 class (helpers.lab1_class) beside an honest one, and its page is
opened in headless Chromium to see that none of its scripts ran.
"""
from __future__ import annotations

import base64
import re

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_output

from grader.common.labs import graded_cells
from grader.feedback.page import CSP, html_page
from grader.feedback.safety import HIDDEN_LINE_NOTE, hidden_lines
from helpers import REPO
from helpers.lab1_class import HONEST, TEST_TIMEOUT_S
from helpers.submissions import released, solved

LAB = "01_single_gpu"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
HIDDEN = "assert secret_check(result, 42), 'the hidden answer'"
LAB_MARKDOWN = "# The lab\nIts own <b>markdown</b> renders."
RESOURCES = {"nbgrader": {"notebook": LAB, "score": 1, "max_score": 2, "late_penalty": 0}}
_TAG = re.compile(r"<[a-zA-Z][^>]*>")
_ACTIVE = re.compile(r"^<(script|svg|iframe|object|embed|math|base|link|meta http-equiv=.refresh)\b"
                     r"|\son\w+\s*=|javascript:|vbscript:|data:text", re.I)


def active_markup(body: str) -> list[str]:
    """The tags in body that could run something or load something: a script, an SVG, a frame, an
    event handler, a javascript: link. Escaped text (&lt;script&gt;) is no tag, so it never counts."""
    return [tag for tag in _TAG.findall(body) if _ACTIVE.search(tag)]


def _page(*cells, verdict=("graded: 1 of 2 points",)) -> str:
    # Not new_notebook: it refuses what a hostile notebook on disk may still hold.
    nb = nbformat.from_dict({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                             "cells": [new_markdown_cell(LAB_MARKDOWN), *cells]})
    return html_page(nb, list(verdict), [HIDDEN], [LAB_MARKDOWN], RESOURCES, grades=False)


def _body(page: str) -> str:
    """The page after its head: the part that shows the notebook."""
    return page.split("</head>", 1)[1]


def _output(**kind) -> nbformat.NotebookNode:
    return new_code_cell("x", outputs=[new_output(**kind)])


def test_a_script_in_an_html_output_becomes_its_text():
    page = _page(_output(output_type="display_data",
                         data={"text/html": "<script>document.title = 'owned'</script>",
                               "text/plain": "<IPython.core.display.HTML object>"}))
    assert active_markup(_body(page)) == []
    assert "&lt;IPython.core.display.HTML object&gt;" in page


def test_an_img_with_an_onerror_attribute_is_not_rendered():
    page = _page(_output(output_type="display_data", data={"text/html": '<img src=x onerror="alert(1)">'}))
    assert active_markup(_body(page)) == []
    assert "text/html output, not shown" in page


def test_javascript_markdown_latex_and_widget_outputs_become_notes():
    data = {"application/javascript": "alert(1)", "text/markdown": "[x](javascript:alert(2))",
            "text/latex": "$\\href{javascript:alert(3)}{x}$",
            "application/vnd.jupyter.widget-view+json": {"model_id": "</script><script>alert(4)</script>"}}
    page = _page(*[_output(output_type="display_data", data={mime: value}) for mime, value in data.items()])
    assert active_markup(_body(page)) == []
    for mime in data:
        assert f"{mime} output, not shown" in page


def test_a_javascript_link_in_the_students_markdown_is_shown_as_text():
    page = _page(new_markdown_cell("[click me](javascript:alert(1)) <a href='javascript:alert(2)'>me too</a>"))
    assert active_markup(_body(page)) == []
    assert "<a href" not in _body(page).split("student-markdown")[1]
    assert "[click me](javascript:alert(1))" in page  # as text, escaped where it must be


def test_the_labs_own_markdown_still_renders():
    page = _page()
    assert "<b>markdown</b> renders" in page and '<h1 id="The-lab"' in page


def test_an_svg_with_a_script_is_not_rendered():
    svg = "<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script><circle r='5'/></svg>"
    page = _page(_output(output_type="display_data", data={"image/svg+xml": svg, "text/plain": "<Figure>"}))
    assert active_markup(_body(page)) == []
    assert "&lt;Figure&gt;" in page


def test_html_in_an_exception_message_and_a_stream_is_escaped():
    evil = "<img src=x onerror=alert(1)><script>alert(2)</script>"
    page = _page(new_code_cell("x", outputs=[
        new_output("error", ename="ValueError", evalue=evil, traceback=[f"\x1b[31mValueError\x1b[0m: {evil}"]),
        new_output("stream", name="stdout", text=f"\x1b[1;32m{evil}\x1b[0m")]))
    assert active_markup(_body(page)) == []
    assert page.count("&lt;script&gt;alert(2)&lt;/script&gt;") == 2


def test_html_in_a_verdict_line_is_escaped():
    page = _page(verdict=["graded: <b>1</b> of 2 points", "cell 3 raised ValueError: <script>alert(1)</script>"])
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script" not in _body(page)
    assert "graded: &lt;b&gt;1&lt;/b&gt; of 2 points" in page


def test_only_real_png_and_jpeg_data_become_images():
    fake = "\"><script>alert(1)</script>"
    not_png = base64.b64encode(b"GIF89a" + b"\x00" * 8).decode()
    page = _page(*[_output(output_type="display_data", data={"image/png": data}) for data in (fake, not_png)],
                 _output(output_type="display_data", data={"image/png": base64.b64encode(PNG).decode()},
                         metadata={"image/png": {"width": "1 onerror=alert(2)", "height": 20}}))
    body = _body(page)
    assert active_markup(body) == []
    assert body.count("<img") == 1 and f"data:image/png;base64,{base64.b64encode(PNG).decode()}" in body
    assert "height=20" in body.replace('"', "") and "alert(2)" not in body


def test_grade_ids_and_cell_ids_from_the_submission_are_not_markup():
    cell = _output(output_type="stream", name="stdout", text="hi")
    cell.metadata["nbgrader"] = {"grade_id": '"><script>alert(1)</script>', "solution": True, "grade": False}
    cell.id = "x\"><script>alert(2)</script>"
    cell.metadata["tags"] = ['"><script>alert(3)</script>']
    assert active_markup(_body(_page(cell))) == []


def test_hidden_test_lines_are_cut_from_outputs_and_the_verdict():
    in_history = repr(["", f"x = 1\n{HIDDEN}\n"])   # what print(In) shows
    page = _page(new_code_cell("print(In)", outputs=[
        new_output("stream", name="stdout", text=in_history),
        new_output("execute_result", data={"text/plain": f"\x1b[0;31m{HIDDEN}\x1b[0m"}, execution_count=3),
        new_output("error", ename="AssertionError", evalue=HIDDEN, traceback=[HIDDEN])]),
        verdict=["graded: 1 of 2 points", f"cell 3 raised AssertionError: {HIDDEN}"])
    assert "secret_check" not in page
    assert page.count(HIDDEN_LINE_NOTE) >= 4


def test_the_page_forbids_scripts_and_outside_loads():
    page = _page()
    head = page.split("</head>")[0]
    assert head.index("Content-Security-Policy") < head.index("<style")
    assert "script-src 'none'" in CSP and "object-src 'none'" in CSP and "default-src 'none'" in CSP
    assert "<script" not in page   # not even MathJax: a feedback page needs none
    assert "cdnjs" not in page


def test_hidden_lines_are_read_from_the_solution_notebook():
    lines = hidden_lines(nbformat.read(REPO / "solutions" / LAB / f"{LAB}.ipynb", as_version=4))
    assert lines and all(len(line) > 20 and line == line.strip() for line in lines)
    visible = "\n".join(c.source for c in released(LAB).cells)
    assert any(line not in visible for line in lines)


# --- one grading run -----------------------------------------------------------------

SCRIPT = "document.title = 'owned by the student'; document.body.appendChild(document.createElement('marquee'))"
HOSTILE_CELLS = [
    f"from IPython.display import HTML, Javascript, SVG, Markdown, display\n"
    f"display(HTML(\"<script>{SCRIPT}</script><img src=x onerror=\\\"{SCRIPT}\\\">\"))",
    f"display(Javascript({SCRIPT!r}))",
    f"display(SVG(\"<svg xmlns='http://www.w3.org/2000/svg'><script>{SCRIPT}</script></svg>\"))",
    "display(Markdown('[look](javascript:alert(1))'))",
    "display({'image/png': '<script>alert(1)</script>'}, raw=True)",
    f"raise ValueError(\"<img src=x onerror=\\\"{SCRIPT}\\\">\")",
    "course.check.assert_close = course.check.assert_close   # harmless, and still flagged",
]
# After the last test cell: by then the kernel's history holds every hidden test.
LEAKING_CELLS = ["print(In)\nprint(_ih)\nprint('\\n'.join(In))", "In"]
STUDENT_MARKDOWN = f"My notes <script>{SCRIPT}</script> [see](javascript:alert(1)) <img src=x onerror=alert(2)>"


def _hostile_submission():
    nb = solved(LAB)
    setup = next(i for i, c in enumerate(nb.cells) if "REFERENCE = course.grading.Reference" in c.source)
    nb.cells[setup + 1:setup + 1] = [new_markdown_cell(STUDENT_MARKDOWN), *map(new_code_cell, HOSTILE_CELLS)]
    nb.cells += [new_code_cell(source) for source in LEAKING_CELLS]
    return nb


def lab1_students(tmp, work) -> dict:
    """This module's student in the shared lab 1 class (helpers.lab1_class), beside its honest one."""
    return {"hostile": _hostile_submission()}


@pytest.fixture(scope="module")
def graded(lab1_class):
    work = lab1_class["work"]
    pages = {s: (work / "feedback" / s / LAB / f"{LAB}.html").read_text(encoding="utf-8")
             for s in ("hostile", HONEST)}
    return {"grades": lab1_class["csv"], "pages": pages, "work": work, "log": lab1_class["log"]}


@pytest.mark.grading
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_honest_student_keeps_full_marks(graded):
    full = sum(graded_cells(nbformat.read(REPO / "solutions" / LAB / f"{LAB}.ipynb", as_version=4)).values())
    row = graded["grades"][HONEST]
    assert (row[f"{LAB} graded"], float(row[f"{LAB} score"])) == ("yes", full), (row, graded["log"])


@pytest.mark.grading
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_hostile_page_holds_no_script_no_handler_and_no_hidden_test(graded):
    row = graded["grades"]["hostile"]
    assert row[f"{LAB} graded"] == "yes", (row, graded["log"])
    body = _body(graded["pages"]["hostile"])
    assert "owned by the student" in body, "the student's cells did not run, so this tests nothing"
    assert active_markup(body) == []
    leaked = [line for line in hidden_lines(nbformat.read(REPO / "solutions" / LAB / f"{LAB}.ipynb", as_version=4))
              if line in body or line.replace("'", "\\'") in body]
    assert not leaked, leaked[:3]
    assert HIDDEN_LINE_NOTE in body, "print(In) showed no hidden test: the run did not test the scrubbing"


@pytest.mark.grading
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_tampering_is_flagged_in_the_verdict_and_on_the_page(graded):
    flag = "line 1 rebinds course.check.assert_close: flagged for the instructor"
    assert flag in graded["grades"]["hostile"][f"{LAB} verdict"]
    assert flag in graded["pages"]["hostile"]
    assert "flagged" not in graded["grades"][HONEST][f"{LAB} verdict"]


@pytest.mark.grading
@pytest.mark.browser
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_opening_the_hostile_page_in_a_browser_runs_nothing_of_the_students(graded):
    from helpers.browser import chromium

    page_file = graded["work"] / "feedback" / "hostile" / LAB / f"{LAB}.html"
    with chromium() as browser:
        page = browser.new_page()
        page.goto(page_file.as_uri(), wait_until="load")   # the page and all it loads: what it will ever run
        assert page.title() == LAB
        assert page.locator("marquee").count() == 0
        assert "owned by the student" in page.locator("body").inner_text()   # shown, as text
        # Every markdown cell of the student's (the hostile one, the written answers) is shown as text.
        shown = page.locator(".student-markdown")
        assert shown.count() >= 1 and page.locator("pre.student-markdown").count() == shown.count()


# --- the autograded notebook itself: formgrader and nbgrader's generate_feedback render it -------

def _nbgrader_html(nb, template: str, course_config: bool = False) -> str:
    """nb as formgrader ('formgrade') or nbgrader's generate_feedback ('feedback') renders it,
    with the course's nbgrader_config.py where course_config (as both do), else without."""
    import os

    from nbconvert import HTMLExporter
    from nbgrader.server_extensions.formgrader import handlers
    from traitlets.config import Config

    from grader.common.labs import course_config as load

    c = load() if course_config else Config()
    c.HTMLExporter.template_name = template
    c.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    c.HTMLExporter.extra_template_paths = [os.path.join(os.path.dirname(handlers.__file__), "static", "node_modules",
                                                        "bootstrap", "dist", "css")]
    resources = {"base_url": "/", "assignment_id": LAB, "notebook_id": LAB, "submission_id": "s", "index": 0,
                 "total": 1, "student": "s", "last_name": "l", "first_name": "f", "notebook_path": "p",
                 "nbgrader": {"notebook": LAB, "score": 0, "max_score": 1, "late_penalty": 0}}
    nb = nbformat.from_dict(nb)
    for cell in nb.cells:  # what nbgrader's GetGrades adds before the feedback template
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.metadata.nbgrader.setdefault("score", 0)
    return HTMLExporter(config=c).from_notebook_node(nb, resources=resources)[0]


def _students_markup(nb, template: str) -> list[str]:
    """The active markup of nb's page that an empty notebook's page (the template's own scripts) lacks."""
    own = active_markup(_nbgrader_html(nbformat.v4.new_notebook(), template))
    return [tag for tag in active_markup(_nbgrader_html(nb, template)) if tag not in own]


def _autograded_with_scripts() -> nbformat.NotebookNode:
    from nbformat.v4 import new_raw_cell

    return nbformat.from_dict({"nbformat": 4, "nbformat_minor": 5, "metadata": {"widgets": {
        "application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2, "version_minor": 0}}}, "cells": [
        new_code_cell("x", outputs=[
            new_output("display_data", data={"text/html": "<script>alert(1)</script>", "text/plain": "<HTML>"}),
            new_output("display_data", data={"application/javascript": "alert(2)"}),
            new_output("display_data", data={"text/markdown": "<img src=x onerror=alert(3)>"}),
            new_output("execute_result", data={"image/svg+xml": "<svg onload=alert(4)></svg>"}, execution_count=1),
            new_output("stream", name="stderr", text="warned"),
            new_output("error", ename="ValueError", evalue="<b>no</b>", traceback=["ValueError"])],
            metadata={"nbgrader": {"grade": True, "grade_id": "test_a", "points": 1, "solution": False,
                                   "locked": True, "schema_version": 3}}),
        new_markdown_cell(f"{STUDENT_MARKDOWN}\n\n```\nhis code\n```"),
        new_markdown_cell("$\\href{javascript:alert(5)}{click}$"),
        new_raw_cell("<script>alert(6)</script>"),
        new_markdown_cell(LAB_MARKDOWN)]})


@pytest.mark.parametrize("template", ["formgrade", "feedback"])
def test_the_autograded_notebook_runs_nothing_of_the_students_in_formgrader_or_nbgrader_feedback(template):
    from grader.feedback.safety import SHOWN_AS_TEXT, InertNotebook

    nb = _autograded_with_scripts()
    assert _students_markup(nb, template), "nbgrader's page runs these as they are: this tests nothing"
    inert, _ = InertNotebook()(nb, {})
    assert _students_markup(inert, template) == []
    page = _nbgrader_html(inert, template)
    assert "alert(" not in page.replace("&lt;", "<").split(SHOWN_AS_TEXT)[0], "an output kept a script's text"
    assert "widgets" not in inert.metadata
    code = inert.cells[0]
    # What grading reads stays: the error and the stderr output (nbgrader's score), the cell's metadata.
    assert [o.output_type for o in code.outputs][-2:] == ["stream", "error"]
    assert code.outputs[-2].name == "stderr" and code.outputs[-1].evalue == "<b>no</b>"
    assert code.metadata.nbgrader.grade_id == "test_a"
    assert [c.source.startswith(SHOWN_AS_TEXT) for c in inert.cells[1:]] == [True, True, True, False]
    assert "<b>markdown</b> renders" in page  # the lab's own markdown is left as it was


@pytest.mark.parametrize("template", ["formgrade", "feedback"])
def test_formgrader_and_nbgrader_feedback_make_a_notebook_autograded_before_inert_too(template):
    nb = _autograded_with_scripts()
    assert _students_markup(nb, template)
    own = active_markup(_nbgrader_html(nbformat.v4.new_notebook(), template, course_config=True))
    assert [t for t in active_markup(_nbgrader_html(nb, template, course_config=True)) if t not in own] == []


def test_the_course_ends_every_autograde_with_the_inert_step_and_jails_on_a_spec_alone(monkeypatch):
    from grader.common.labs import course_config
    from grader.jail.kernel_manager import OLD_SPEC_ENV, SPEC_ENV

    for name in (SPEC_ENV, OLD_SPEC_ENV, "GRADER_JUDGE_CELL_FILE"):
        monkeypatch.delenv(name, raising=False)
    steps = list(course_config().Autograde.autograde_preprocessors)
    assert steps[0] == "nbgrader.preprocessors.Execute" and steps[-1] == "grader.feedback.safety.InertNotebook"
    monkeypatch.setenv(SPEC_ENV, "/nowhere/jail.json")  # no judge: a lab that records no value
    steps = list(course_config().Autograde.autograde_preprocessors)
    assert steps[0] == "grader.judge.judged_execute.JudgedJailedExecute", steps
    assert steps[-1] == "grader.feedback.safety.InertNotebook"
    monkeypatch.delenv(SPEC_ENV)
    monkeypatch.setenv(OLD_SPEC_ENV, "/nowhere/jail.json")  # its old name, in an instructor's script: still jailed
    assert list(course_config().Autograde.autograde_preprocessors) == steps


@pytest.mark.grading
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_hostile_autograded_notebook_runs_nothing_in_formgrader(graded):
    autograded = graded["work"] / "autograded" / "hostile" / LAB / f"{LAB}.ipynb"
    nb = nbformat.read(autograded, as_version=4)
    assert "IPython.core.display.HTML object" in autograded.read_text(), "the student's cells did not run"
    for template in ("formgrade", "feedback"):
        assert _students_markup(nb, template) == [], template


def test_every_class_the_config_names_imports_in_a_course_folder_that_holds_grader_work(tmp_path):
    """formgrader and generate_feedback import the config's classes with the instructor's course folder first on
    the path: where it holds grader/work/ and not the package, `grader` is a namespace package without its
    __init__ there, and a class whose imports reach `from grader import ...` fails (formgrader failed to load)."""
    import subprocess
    import sys

    named = sorted(set(re.findall(r'"(grader\.[\w.]+)"', (REPO / "nbgrader_config.py").read_text())))
    assert named, "nbgrader_config.py names no class of the grader"
    (tmp_path / "grader" / "work").mkdir(parents=True)
    script = ("import importlib, sys\n"
              "for name in sys.argv[1:]:\n"
              "    module, _, attribute = name.rpartition('.')\n"
              "    getattr(importlib.import_module(module), attribute)\n")
    done = subprocess.run([sys.executable, "-c", script, *named], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
