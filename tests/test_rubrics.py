"""Covers: grader.common.rubrics.

Each written answer's model answer and rubric, from solutions/, put after the student's answer in the
autograded notebook that formgrader shows, and left out of every feedback page: the course's own
(grader.feedback.safety, grader.feedback.page) and nbgrader's generate_feedback (`DropRubrics`, named in
nbgrader_config.py). The grading run's hook (grader.grading.submission) and a real class's notebooks and
pages are tests/test_grading_round_trip.py's.
"""
from __future__ import annotations

import copy
import html
import re
import stat
from types import SimpleNamespace

import nbformat
import pytest
from nbformat.v4 import new_markdown_cell

from grader.common import rubrics
from grader.common.labs import course_config, find_labs, written_cells
from grader.feedback.page import DropRubrics, html_page
from grader.feedback.safety import make_inert, make_notebook_inert, unsafe_markdown
from grader.grading.submission import SubmissionGrader
from grader.grading.workspace import lab_infos
from helpers import REPO
from helpers.submissions import released

LAB = "08_experts"
GRADED = [lab for lab in find_labs(REPO) if lab.written]


def shown_text(text: str) -> str:
    """The words of markdown or of an HTML page as a reader sees them, rendered or not: without tags, emphasis
    and code marks, whitespace made single (a model answer is found in a page whichever way it was shown)."""
    return " ".join(re.sub(r"<[^>]*>|[*`_$\\]", "", html.unescape(text)).split())


def leaked(page: str, answers: dict[str, str]) -> list[str]:
    """The grade_ids whose model answer's opening (its first 80 characters as shown) is in the page."""
    shown = shown_text(page)
    return [gid for gid, answer in answers.items() if shown_text(answer)[:80] in shown]


def solution(lab: str) -> dict:
    return nbformat.read(REPO / "solutions" / lab / f"{lab}.ipynb", as_version=4)


def answered(lab: str) -> nbformat.NotebookNode:
    """The release with every written answer the student's own words (not the model answer)."""
    nb = released(lab)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        if gid.startswith("written_"):
            cell.source = f"My own answer to {gid}, <b>bold</b> and **Rubric (9 points).** forged"
    return nb


@pytest.mark.parametrize("lab", GRADED, ids=lambda lab: lab.name)
def test_every_written_answer_has_its_model_answer_and_rubric_from_the_solution(lab):
    answers = rubrics.model_answers(solution(lab.name))
    assert set(answers) == set(written_cells(solution(lab.name))), lab.name
    for gid, text in answers.items():
        assert "**Rubric (" in text and "### BEGIN SOLUTION" not in text and "### END SOLUTION" not in text, gid


@pytest.mark.parametrize("lab", GRADED, ids=lambda lab: lab.name)
def test_formgrader_renders_each_rubric_as_markdown(lab):
    """formgrader's HTMLExporter runs grader.feedback.safety's InertNotebook, which shows as text a markdown
    cell whose HTML could run: no rubric may look so, or the grader reads it as a code block."""
    for gid, text in rubrics.model_answers(solution(lab.name)).items():
        cell = nbformat.from_dict(rubrics.rubric_cell(gid, text))
        assert unsafe_markdown(cell.source) == [], (lab.name, gid, unsafe_markdown(cell.source))
        nb = make_notebook_inert(nbformat.v4.new_notebook(cells=[cell]))
        assert nb.cells[0].source == cell.source and rubrics.is_rubric(nb.cells[0]), (lab.name, gid)


def test_formgrader_s_page_shows_the_rubric_under_the_answer(tmp_path):
    """The page formgrader's Manual Grading serves: its HTMLExporter, its formgrade template and the course's
    configuration (InertNotebook), on an autograded notebook as the grader leaves it."""
    from nbconvert import HTMLExporter
    from nbgrader.server_extensions.formgrader import handlers

    answers, nb = rubrics.model_answers(solution(LAB)), answered(LAB)
    rubrics.show_beside_answers(nb, answers)
    nbformat.write(nb, tmp_path / f"{LAB}.ipynb")
    config = course_config(REPO)
    config.HTMLExporter.template_name = "formgrade"        # what formgrader's extension adds to the config
    config.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    resources = {"assignment_id": LAB, "notebook_id": LAB, "submission_id": "s", "index": 0, "total": 1,
                 "base_url": "", "student": "ada", "last_name": "", "first_name": "", "notebook_path": LAB}
    page, _ = HTMLExporter(config=config).from_filename(str(tmp_path / f"{LAB}.ipynb"), resources=resources)
    shown = shown_text(page)
    places = sorted((shown.index(shown_text(f"My own answer to {gid}")), gid) for gid in answers)
    for (at, gid), (following, _) in zip(places, [*places[1:], (len(shown), None)]):
        assert at < shown.index(shown_text(answers[gid])[:80]) < following, f"{gid}'s rubric is not under it"


def test_the_release_holds_none_of_them():
    """The student's copy has no model answer: the rubric can only come from solutions/."""
    answers, nb = rubrics.model_answers(solution(LAB)), released(LAB)
    assert answers and rubrics.model_answers(nb) == {}
    text = nbformat.writes(nb)
    assert not leaked(text, answers)


def test_each_written_answer_is_followed_by_its_rubric_and_nothing_else_moves():
    answers, nb = rubrics.model_answers(solution(LAB)), answered(LAB)
    before = copy.deepcopy(nb.cells)
    shown = rubrics.show_beside_answers(nb, answers)
    assert sorted(shown) == sorted(answers)
    assert rubrics.without_rubrics(nb.cells) == before, "the student's cells are as they were, in their order"
    for i, cell in enumerate(nb.cells):
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            after = nb.cells[i + 1]
            assert rubrics.is_rubric(after) and after.metadata[rubrics.MARK] == {"rubric_of": gid}
            assert after.cell_type == "markdown" and answers[gid] in after.source
            assert rubrics.RUBRIC_HEADING in after.source and "My own answer" not in after.source
            assert after.metadata["editable"] is False and "nbgrader" not in after.metadata
    nbformat.validate(nb)   # formgrader reads it: ids and metadata as nbformat wants them
    again = copy.deepcopy(nb)
    rubrics.show_beside_answers(again, answers)
    assert again.cells == nb.cells, "grading a notebook twice gives one rubric an answer"


def test_a_submission_s_own_marked_or_forged_cell_is_not_taken_for_the_grader_s():
    answers, nb = rubrics.model_answers(solution(LAB)), answered(LAB)
    planted = new_markdown_cell("Full marks for this student.")
    planted.metadata[rubrics.MARK] = {"rubric_of": "written_experts"}
    forged_text = f"{rubrics.RUBRIC_HEADING} for `written_experts`: give every point"
    forged = new_markdown_cell(forged_text)
    nb.cells[3:3] = [planted, forged]
    rubrics.show_beside_answers(nb, answers)
    sources = [cell.source for cell in nb.cells]
    assert "Full marks for this student." not in sources
    assert sum(rubrics.is_rubric(cell) for cell in nb.cells) == len(answers)
    assert f"{rubrics.FORGED_NOTE}\n\n{forged_text}" in sources and forged_text not in sources


def test_a_written_answer_the_student_marked_as_the_grader_s_stays_before_the_grader_without_the_mark():
    answers, nb = rubrics.model_answers(solution(LAB)), answered(LAB)
    answer = next(cell for cell in nb.cells if cell.metadata.get("nbgrader", {}).get("grade_id") == "written_experts")
    answer.metadata[rubrics.MARK] = {"rubric_of": "written_experts"}
    rubrics.show_beside_answers(nb, answers)
    kept = [cell for cell in nb.cells if cell.metadata.get("nbgrader", {}).get("grade_id") == "written_experts"]
    assert len(kept) == 1 and kept[0].source == answer.source and not rubrics.is_rubric(kept[0])
    following = nb.cells[nb.cells.index(kept[0]) + 1]
    assert following.metadata[rubrics.MARK] == {"rubric_of": "written_experts"}


def test_no_feedback_page_shows_a_rubric():
    answers, nb = rubrics.model_answers(solution(LAB)), answered(LAB)
    rubrics.show_beside_answers(nb, answers)
    assert not any(rubrics.RUBRIC_HEADING in cell.source for cell in make_inert(nb, [], []).cells)  # the page's
    for cell in nb.cells:   # and the page itself, rendered without the gradebook its scores would need
        cell.metadata.pop("nbgrader", None)
    resources = {"unique_key": LAB, "output_files_dir": "files"}
    page = html_page(nb, ["graded"], [], [], resources, grades=False)
    assert "My own answer to written_experts" in page           # the student's answer is there
    assert rubrics.RUBRIC_TITLE not in shown_text(page) and not leaked(page, answers)
    # nbgrader's own generate_feedback: its first preprocessor, as nbgrader_config.py lists them
    kept, _ = DropRubrics().preprocess(copy.deepcopy(nb), {})
    assert not any(rubrics.is_rubric(cell) for cell in kept.cells) and len(kept.cells) == len(nb.cells) - len(answers)
    listed = course_config(REPO).GenerateFeedback.preprocessors
    assert listed[0] == "grader.feedback.page.DropRubrics", listed


def test_the_grading_run_writes_them_private_and_its_failure_costs_no_grade(tmp_path):
    lab = lab_infos(REPO, [LAB])[LAB]
    assert lab.rubrics == rubrics.model_answers(solution(LAB))
    path = tmp_path / "autograded.ipynb"
    nbformat.write(answered(LAB), path)
    path.chmod(0o644)
    at = SimpleNamespace(autograded=path, lab=lab, submission="ada")
    failures = []
    grader = SimpleNamespace(_failed=lambda submission, step, error: failures.append(step) or f"{step}: {error}")
    lines = ["graded: 10 of 10 points"]
    SubmissionGrader._rubrics(grader, at, lines)
    assert lines == ["graded: 10 of 10 points"] and not failures
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sum(rubrics.is_rubric(c) for c in nbformat.read(path, as_version=4).cells) == len(lab.rubrics)
    path.write_text("{ not a notebook")
    SubmissionGrader._rubrics(grader, at, lines)
    assert lines[0] == "graded: 10 of 10 points" and len(lines) == 2
    assert lines[1].startswith("no rubric beside the written answers in formgrader: add the rubrics")
