"""nbgrader configuration for the multi-GPU training course.

The nbgrader CLI reads this file only from the course root (run it from the
repository root); `python -m grader` does that for you. Every path is derived
from this file's location, so loading it explicitly works from any cwd.

Layout: solutions/<lab>/<lab>.ipynb (instructor source) -> labs/<lab>/<lab>.ipynb
(student release). Everything nbgrader writes while grading lives under
grader/work/, which .gitignore keeps out of the repository.
"""

import importlib.util
import os
import sys
import sysconfig

c = get_config()  # noqa: F821 -- injected by traitlets when it loads this file

ROOT = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(ROOT, "grader", "work")
# nbgrader creates the gradebook but not its parent folder, and grader/work is
# not in git, so create it on load.
os.makedirs(WORK, exist_ok=True)

# nbgrader makes a new gradebook by running the `alembic` script by name. `make lab`
# starts .venv/bin/jupyter without activating the venv, so formgrader's first page
# failed with "No such file or directory: 'alembic'": find it beside this Python.
# (Not imported from grader.common.nbgrader_cli, which does the same for the grader's own
# subprocesses: this file must load wherever it is copied, with or without grader/.)
_scripts = [os.path.dirname(sys.executable), sysconfig.get_path("scripts")]
os.environ["PATH"] = os.pathsep.join(dict.fromkeys(_scripts + os.environ.get("PATH", "").split(os.pathsep)))
# This course's grader/ for the steps below, also where nothing installed it: an instructor's copy of
# the course on a JupyterHub (deploy/hub/), whose formgrader runs from their home, not from here.
if importlib.util.find_spec("grader") is None and os.path.isfile(os.path.join(ROOT, "grader", "__init__.py")):
    sys.path.append(ROOT)

# --- Course layout ----------------------------------------------------------
c.CourseDirectory.root = ROOT  # not cwd: works however the file is loaded
c.CourseDirectory.course_id = "multi-gpu-course"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "labs"
# Grading work folders and the gradebook hold student data: keep them under
# grader/work/ (git-ignored) instead of nbgrader's defaults at the course root.
# formgrader's Collect (nbgrader collect) copies the exchange's submissions here, as the students
# handed them in, with the receipts nbgrader returns feedback by: `python -m grader grade
# grader/work/collected` grades them (into grader/work/submitted/, autograded/, feedback/), and
# formgrader's Release Feedback (nbgrader release_feedback) then returns its feedback pages.
c.CourseDirectory.submitted_directory = "grader/work/collected"
c.CourseDirectory.autograded_directory = "grader/work/autograded"
c.CourseDirectory.feedback_directory = "grader/work/feedback"
c.CourseDirectory.solution_directory = "grader/work/solution"
c.CourseDirectory.source_with_tests_directory = "grader/work/source_with_tests"
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(WORK, "gradebook.db")
# Editor/OS litter that must never be copied from solutions/ into labs/
# (nbgrader copies every non-notebook file of a lab folder into the release).
c.CourseDirectory.ignore = [
    ".ipynb_checkpoints",
    "*.pyc",
    "__pycache__",
    "feedback",
    ".DS_Store",
    ".virtual_documents",
    ".pytest_cache",
]

# --- Exchange ---------------------------------------------------------------
# Where formgrader's Release/Collect and the students' Assignment List meet.
# nbgrader's default, /usr/local/share/nbgrader/exchange, exists only where an
# administrator made it; without it both panels only say that the exchange is
# missing. On one machine (a laptop, a live demo) it lives here, made on load
# like the gradebook's folder. On a shared JupyterHub it is the hub's, named by $COURSE_EXCHANGE
# (deploy/hub/jupyterhub_config.py sets it for every user's server).
c.Exchange.root = os.environ.get("COURSE_EXCHANGE") or os.path.join(WORK, "exchange")
os.makedirs(c.Exchange.root, exist_ok=True)
# formgrader's Collect (and `nbgrader collect`) refuses, not warns, a submission whose Unix owner is not the
# student it names, one holding a link or anything but plain files, and one dated in the future; it copies
# without following links (grader/grading/exchange.py). Not conditional: where grader/ cannot be imported,
# collect fails saying so, rather than falling back to nbgrader's collect, which follows links.
c.ExchangeFactory.collect = "grader.grading.exchange.StrictCollect"
# Release Feedback: each page readable in the exchange by its student (its name is the student's secret's
# hash), though the grader keeps its own copy private (grader/grading/feedback_release.py).
c.ExchangeFactory.release_feedback = "grader.grading.feedback_release.FeedbackRelease"

# --- Release ----------------------------------------------------------------
# Same as nbgrader's default python stub, pinned so the release stays stable
# across nbgrader versions (labs/ is committed and compared in tests).
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
# ... whose raise names the function it stands in (grader/common/stubs.py), wherever grader/ can
# be imported: an untouched exercise says which function to write.
if importlib.util.find_spec("grader") is not None:
    c.GenerateAssignment.preprocessors = [
        "nbgrader.preprocessors.IncludeHeaderFooter",
        "nbgrader.preprocessors.InstantiateTests",
        "nbgrader.preprocessors.LockCells",
        "grader.common.stubs.NamedStubs",
        "nbgrader.preprocessors.ClearOutput",
        "nbgrader.preprocessors.CheckCellMetadata",
        "nbgrader.preprocessors.ComputeChecksums",
        "nbgrader.preprocessors.SaveCells",
        "nbgrader.preprocessors.ClearHiddenTests",
        "nbgrader.preprocessors.ClearMarkScheme",
        "nbgrader.preprocessors.ComputeChecksums",
        "nbgrader.preprocessors.CheckCellMetadata",
    ]
# A written answer (a markdown cell that is an answer and graded, grade_id written_*) is released
# as this text: autograde scores it 0 while it is unchanged, and otherwise leaves it to formgrader.
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# --- Autograding ------------------------------------------------------------
# Labs train small models on CPU: nbgrader's 30 s per-cell default is too short.
c.Execute.timeout = 300
# A hung cell is interrupted and recorded as an error; grading goes on.
c.Execute.interrupt_on_timeout = True
# A late/missing output message must not abort grading of the whole notebook.
c.Execute.raise_on_iopub_timeout = False
# nbclient skips cells tagged "skip-execution" by default: a student could tag a
# test cell and get its points without it running. Only skip this secret tag.
c.Execute.skip_cells_with_tag = "nbgrader-skip-5c1e9a07d3b84f26a9e0b71c4d62f8e3"
# c.Execute.allow_errors is deliberately not set: in nbgrader 0.9.6 it is not
# configurable and is always True, which autograde needs (a failing test cell
# is recorded as 0 points and the remaining cells still run).

# Under `python -m grader grade`, the kernel runs in a jail (grader/jail/bwrap.py),
# and the judge (grader/judge/server.py) must know which test cell runs: the same
# preprocessors as nbgrader's, with Execute swapped for one that tells the judge,
# jailed unless the instructor asked for --unsafe. A jail is asked for by its spec
# alone: a lab whose tests check no reference value has no judge, and still a jail.
# Last, the autograded notebook is made inert (grader/feedback/safety.py): formgrader
# and nbgrader's own generate_feedback render its outputs, its markdown and raw cells
# as they are, and the student's scripts would run in the instructor's browser. That
# step is nbgrader's too wherever grader/ can be imported (formgrader's own autograde).
# GRADER_SANDBOX_SPEC is GRADER_JAIL_SPEC's old name (deprecated): still a jail.
if os.environ.get("GRADER_JAIL_SPEC") or os.environ.get("GRADER_SANDBOX_SPEC"):
    _execute = "grader.judge.judged_execute.JudgedJailedExecute"
elif os.environ.get("GRADER_JUDGE_CELL_FILE"):
    _execute = "grader.judge.judged_execute.JudgedExecute"
else:
    _execute = "nbgrader.preprocessors.Execute"
if _execute != "nbgrader.preprocessors.Execute" or importlib.util.find_spec("grader") is not None:
    c.Autograde.autograde_preprocessors = [
        _execute,
        "nbgrader.preprocessors.IgnorePattern",
        "nbconvert.preprocessors.ClearMetadataPreprocessor",
        "nbgrader.preprocessors.LimitOutput",
        "nbgrader.preprocessors.SaveAutoGrades",
        "nbgrader.preprocessors.AssignLatePenalties",
        "nbgrader.preprocessors.CheckCellMetadata",
        "grader.feedback.safety.InertNotebook",
    ]

# A graded test cell deleted from a submission is restored from the gradebook
# and run, instead of silently dropping out of the grading.
c.OverwriteCells.add_missing_cells = True

# formgrader shows an autograded notebook through an HTMLExporter of this config, and
# nbgrader's generate_feedback through another: each makes it inert first too, which
# covers a notebook autograded before that step existed, or by another tool.
if importlib.util.find_spec("grader") is not None:
    c.HTMLExporter.preprocessors = ["grader.feedback.safety.InertNotebook"]

# --- Feedback ---------------------------------------------------------------
# nbgrader 0.9.6 shows hidden tests in the feedback HTML; grader.feedback.page
# removes them, and the tracebacks that would quote them.
c.GenerateFeedback.preprocessors = [
    "grader.feedback.page.DropRubrics",  # the model answers formgrader shows beside written answers: never a student's
    "nbgrader.preprocessors.GetGrades",
    "grader.feedback.page.HideHiddenTests",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
