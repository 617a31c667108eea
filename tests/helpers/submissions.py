"""Building student submissions for grading tests, from the release and the solutions.

A "student" starts from the released notebook (labs/<lab>/<lab>.ipynb, with its
nbgrader metadata) and fills in the solution regions, as a student would:

    nb = solved("01_single_gpu")                                  # every exercise right
    nb = solved("01_single_gpu", edits={"momentum_sgd": [(old, new)]})   # one exercise wrong

and runs it as nbgrader scores it, minus the demonstrations in between
(`graded_only`), to see which test cells fail (`helpers.forked_cells`, which runs a
lab's many variants in one process forked where each first differs).
"""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from grader.common.labs import graded_cells

from . import REPO, session_pid
from .forked_cells import failing_tests_forked
from .rules import problems as rule_table_problems

MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def grade_id(cell) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def released(lab: str) -> nbformat.NotebookNode:
    return nbformat.read(REPO / "labs" / lab / f"{lab}.ipynb", as_version=4)


def solved(lab: str, edits: dict[str, list[tuple[str, str]]] | None = None,
           answers: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """The release with every solution cell filled from solutions/; edits change some answers.

    edits: grade_id -> [(old, new)] replacements in that cell's answer; each
    `old` must occur in it (so a test cannot silently edit nothing).
    answers: grade_id -> a whole answer of the student's own, in place of the solution's.
    """
    source = nbformat.read(REPO / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    own = dict(answers or {})
    answers = {grade_id(c): c.source for c in source.cells if c.metadata.get("nbgrader", {}).get("solution")}
    unknown = set(own) - set(answers)
    assert not unknown, f"answers for cells that are not exercises of {lab}: {sorted(unknown)}"
    answers.update(own)
    nb = released(lab)
    edits = dict(edits or {})
    for cell in nb.cells:
        gid = grade_id(cell)
        if gid not in answers:
            continue
        text = "\n".join(line for line in answers[gid].split("\n") if line.strip() not in MARKERS)
        for old, new in edits.pop(gid, []):
            assert old in text, f"{lab}/{gid}: cannot edit, {old!r} is not in the answer"
            text = text.replace(old, new)
        cell.source = text
    assert not edits, f"edits for cells that are not exercises of {lab}: {list(edits)}"
    return nb


def write(nb, folder: Path, student: str, lab: str) -> Path:
    path = folder / student / f"{lab}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def regions(source: str, kind: str) -> list[str]:
    """The text between each `### BEGIN <kind>` and its `### END <kind>` (kind: SOLUTION, HIDDEN TESTS)."""
    return [part.split(f"### END {kind}")[0] for part in source.split(f"### BEGIN {kind}")[1:]]


def hidden_lines(lab: str) -> list[str]:
    """The distinctive lines (over 30 characters) of the lab's hidden tests: what feedback must not show."""
    source = nbformat.read(REPO / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    lines = []
    for cell in source.cells:
        for region in regions(cell.source, "HIDDEN TESTS"):
            lines += [line.strip() for line in region.split("\n") if len(line.strip()) > 30]
    assert lines, f"{lab} has no hidden tests"
    return lines



def graded_only(nb, lab: str):
    """The setup cell and what nbgrader scores: read-only helpers, answers, tests.

    As nbgrader's autograde does, test and read-only cells get the source
    notebook's text back: the release has no hidden tests.
    """
    source = nbformat.read(REPO / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    locked = {grade_id(c): c.source for c in source.cells if c.metadata.get("nbgrader", {}).get("locked")}
    first_code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells = [c for i, c in enumerate(nb.cells) if i == first_code or grade_id(c)]
    for cell in nb.cells:
        if grade_id(cell) in locked:
            cell.source = locked[grade_id(cell)]
    assert sum("BEGIN HIDDEN TESTS" in c.source for c in nb.cells) == len(graded_cells(source))
    return nb


def without_demonstrations(nb):
    """A submission less its lab's demonstrations: the cells nbgrader neither grades nor locks, after
    the setup cell; its own cells, answers and test cells as they are (graded_only, for a submission).
    For a student of a class whose attack is in its own cells and is caught in test cells, which need no
    demonstration (the fairness tests run every lab so): graded in a fraction of a whole lab's time."""
    first_code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells = [c for i, c in enumerate(nb.cells) if i == first_code or grade_id(c)]
    return nb


def judge_values_folder(session: int) -> Path:
    """Where the judge's values of the test session `session` (helpers.session_pid) are kept."""
    return Path(tempfile.gettempdir()) / f"course-judge-values-{session}"


def session_judge_values() -> Path:
    """The folder of the judge's values this test session's grading runs share: one for the whole
    session, its workers included under pytest-xdist."""
    folder = judge_values_folder(session_pid())
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def judge_values() -> list[str]:
    """The option that has a grading run reuse the judge's values that earlier runs of this test
    session recorded (`keep_judge_values`), as an instructor grading one class in batches does
    (grader.judge_values): each lab's solution is recorded once a session, not once a run."""
    return ["--judge-values", str(session_judge_values())]


def keep_judge_values(work: Path) -> None:
    """Keep the recordings of the grading run in `work` for the session's later runs: the first
    run to finish a lab keeps it (two workers may record the same lab at once), its values
    written before the seed that names them, each whole, so a run that finds a seed finds its values."""
    shared = session_judge_values()
    for about in (work / "judge").glob("*.seed.json"):
        values = about.with_name(about.name.removesuffix(".seed.json") + ".json")
        if not values.is_file():
            continue
        try:
            os.close(os.open(shared / f"{about.name}.kept", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            continue
        for source in (values, about):
            partial = shared / f".{source.name}.partial"
            shutil.copyfile(source, partial)
            partial.replace(shared / source.name)


def grade_class(submissions: Path, work: Path, labs: str | list[str], *options: str, timeout: float = 1500,
                env: dict[str, str] | None = None) -> tuple[dict, str]:
    """`python -m grader grade SUBMISSIONS --lab LAB... --work WORK OPTIONS`, as an instructor runs it,
    with env's variables added to this process's, reusing the session's judge values (`judge_values`);
    (the CSV's rows by student id, what the command printed)."""
    selected = [arg for lab in ([labs] if isinstance(labs, str) else labs) for arg in ("--lab", lab)]
    proc = subprocess.run(
        [sys.executable, "-m", "grader", "grade", str(submissions), *selected, "--work", str(work),
         *judge_values(), *options],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
        env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stdout
    keep_judge_values(work)
    with open(work / "grades.csv", newline="") as f:
        return {row["student_id"]: row for row in csv.DictReader(f)}, proc.stdout


# A line a student may add to a solution cell to silence the visible checks: the hidden tests'
# checks against the stored reference (course.grading) must still cost the exercise its points.
CHECK_REBOUND = 'check = type("NoCheck", (), {"assert_close": staticmethod(lambda *args, **kwargs: None)})()\n\n'


# The settings a correct answer is graded under, each level of each at least once per answer:
# torch's CPU instruction set (None: the machine's own; "default": no vector extensions) and the
# number of threads of the notebook's own computations (the ranks always use one). So a value the
# kernel computes is compared with one the ranks computed under the lab's tolerance, never bit
# for bit. The forked run (machine's, 1 thread: a fork needs one) grades both answers; the
# reference's other settings are the runs of the solution notebook (headless and in the browser),
# whose test cells are these same cells: helpers/solution_runs.py has the table. The answer
# written differently gets its ROUND_TRIP_SETTING in its lab's nbgrader round trip where the lab
# has one (helpers/round_trips.py: the whole notebook, in the jail), else in a run of its own.
FORKED_SETTING = (None, 1)
ROUND_TRIP_SETTING = ("default", 2)
WRITTEN_DIFFERENTLY = "written differently"
CORRECT_SETTINGS = {
    "reference": [FORKED_SETTING],
    WRITTEN_DIFFERENTLY: [FORKED_SETTING, ROUND_TRIP_SETTING],
}


def _setting_id(capability, threads) -> str:
    return f"{capability or 'machine'} ISA, {threads} thread{'s' if threads > 1 else ''}"


_FORKED: dict[str, tuple[dict, dict]] = {}


def forked_failures(lab: str, variants, tmp_path_factory, stop_where_unreached=frozenset()) -> tuple[dict, dict]:
    """(The reference's failing tests, {name: each variant's}), every notebook graded_only,
    in one forked run on the machine's instruction set and one thread (tests/helpers/forked_cells.py);
    run on first use, then kept for the session. variants: name -> a function that builds
    that notebook with `solved`; those named in stop_where_unreached stop after the last cell
    their change can reach (helpers/reach.py)."""
    if lab not in _FORKED:
        base = graded_only(solved(lab), lab)
        built = {name: graded_only(build(), lab) for name, build in variants.items()}
        _FORKED[lab] = failing_tests_forked(base, built, tmp_path_factory.mktemp(f"forked-{lab}"),
                                            stop_where_unreached=frozenset(stop_where_unreached))
    return _FORKED[lab]


def fairness_tests(lab: str, different: dict[str, str], mistakes: dict, rules: dict[str, dict],
                   also_correct: dict | None = None, round_trip: tuple[str, ...] | None = None):
    """The tests that say a lab grades fairly, for a lab's test module to bind to test_* names:

    every exercise is graded and has a classic mistake; every rule its text states is
    listed in `rules` beside the mistakes that break it (helpers/rules.py); the reference and an
    answer written differently (`different`: grade_id -> answer) get every
    point, each on both instruction sets (the machine's, torch's "default") and
    with the kernel on 1 and on 2 threads (CORRECT_SETTINGS, where the reference's
    other settings are the solution notebook's runs); each mistake
    (name -> (edits for `solved`, the test cell it must fail)) fails exactly its
    own test cell; each answer of `also_correct` (name -> {grade_id: answer}),
    if given, gets every point (one more test); and with `round_trip` (names of
    mistakes, perhaps none), the last test is the lab's nbgrader round trip of the
    answer written differently and those mistakes (helpers/round_trips.py), which is
    then that answer's run on ROUND_TRIP_SETTING. A mistake there costs a whole
    notebook's grading: the forked runs hold every mistake. A mistake behind a check rebound
    to a no-op is no round-trip case any more: graded for real, the rebinding withholds every
    test cell from its cell on (grader.judge.allowed; tests/test_hostile_judge.py grades it).

    The mistakes, the correct answers and the reference on FORKED_SETTING run in one
    process, forked at each one's first changed cell (forked_failures). Each exercise's
    first mistake runs to the end of the lab; the other mistakes stop after the last cell
    their change can reach through a name (helpers/reach.py).
    """
    points = graded_cells(nbformat.read(REPO / "solutions" / lab / f"{lab}.ipynb", as_version=4))
    also_correct = dict(also_correct or {})
    variants = {f"mistake: {name}": (lambda edits=edits: solved(lab, edits)) for name, (edits, _) in mistakes.items()}
    variants.update({f"correct: {name}": (lambda answers=answers: solved(lab, answers=answers))
                     for name, answers in {**also_correct, WRITTEN_DIFFERENTLY: different}.items()})
    # Each exercise's first mistake runs the whole rest of the lab, which would catch what a name
    # cannot carry (state its exercise changes in place); the others stop after the last cell their
    # change can reach through a name. The correct answers run to the end.
    first_of_each = {exercise: name for name, (_, exercise) in reversed(mistakes.items())}
    stopping = {f"mistake: {name}" for name in mistakes if name not in first_of_each.values()}

    def forked(tmp_path_factory):
        return forked_failures(lab, variants, tmp_path_factory, stopping)

    def test_every_exercise_is_graded():
        assert set(points) == {f"test_{gid}" for gid in different}, points
        assert {cell for _, cell in mistakes.values()} == set(points), "a mistake for every exercise"

    def test_every_rule_the_text_states_is_tested():
        found = rule_table_problems(lab, rules, mistakes)
        assert not found, "\n".join(found)

    settings = [(student, *setting) for student, each in CORRECT_SETTINGS.items() for setting in each
                if not (round_trip is not None and (student, setting) == (WRITTEN_DIFFERENTLY, ROUND_TRIP_SETTING))]

    @pytest.mark.timeout(900)
    @pytest.mark.parametrize(("student", "capability", "threads"), settings,
                             ids=[f"{student}, {_setting_id(c, t)}" for student, c, t in settings])
    def test_correct_answers_get_every_point(student, capability, threads, tmp_path, tmp_path_factory):
        if (capability, threads) == FORKED_SETTING:
            base, variants = forked(tmp_path_factory)
            failed = base if student == "reference" else variants[f"correct: {WRITTEN_DIFFERENTLY}"]
        else:
            nb = solved(lab) if student == "reference" else solved(lab, answers=different)
            failed = failing_tests_forked(graded_only(nb, lab), {}, tmp_path, threads=threads,
                                          capability=capability)[0]
        assert failed == {}, failed

    @pytest.mark.timeout(900)
    @pytest.mark.parametrize("mistake", list(mistakes))
    def test_each_mistake_costs_exactly_its_exercise(mistake, tmp_path_factory):
        _, exercise = mistakes[mistake]
        failed = forked(tmp_path_factory)[1][f"mistake: {mistake}"]
        assert set(failed) == {exercise}, failed

    tests = (test_every_exercise_is_graded, test_every_rule_the_text_states_is_tested,
             test_correct_answers_get_every_point,
             test_each_mistake_costs_exactly_its_exercise)
    tests_after = ()
    if round_trip is not None:
        from .round_trips import round_trip_test  # here, not at the top: round_trips imports this module
        tests_after = (round_trip_test(lab, different, mistakes, *round_trip),)
    if not also_correct:
        return (*tests, *tests_after)

    @pytest.mark.timeout(900)
    @pytest.mark.parametrize("student", list(also_correct))
    def test_other_correct_answers_get_every_point(student, tmp_path_factory):
        failed = forked(tmp_path_factory)[1][f"correct: {student}"]
        assert failed == {}, failed

    return (*tests, test_other_correct_answers_get_every_point, *tests_after)
