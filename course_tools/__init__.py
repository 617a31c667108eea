"""The course's own tools that grade nothing: train a lab under torchrun, build the website, make the handout.

Run them as ``python -m course_tools COMMAND`` from anywhere, as ``python -m grader`` (``-h`` lists them).
Each command lives in its own module that provides ``add_subcommand(subparsers)`` and is listed
in ``course_tools.__main__.COMMANDS``.

They were commands of ``python -m grader`` until the grader was named for its one job: grading
(see grader/__init__.py). ``python -m grader run|site|handout`` still forwards here for one term,
saying the new name. The map, one line a module:

- `__main__`: the command line; `run` starts on every rank under torchrun, so it goes straight to
  its module, and nothing else is imported there.
- `run`: a lab's reference training as a script, under torchrun (one node or many) or on
  ``--ranks N`` started here: the runner, which parses, starts and reports.
- `trainings`: what `run` runs, lab by lab (`LABS`): the solution notebook's function, its options,
  how its notebook calls it, and where its parameters and losses are.
- `site`: the course as a website (Jupyter Book): each lab as released, with its demonstrations'
  figures from a run of its solution.
- `handout`: the students' copy of the course: the release, the `course` package and how to open
  them, without a solution, hidden test or stored value.

Imports run one way (tests/test_architecture.py holds it): these modules import `course` and, of
the grader, its root (``COURSE_ROOT``, ``GraderError``) and `grader.common` (the labs, a solution
loaded or executed); neither `course` nor `grader` imports them, except that one deprecated
forward of ``grader.__main__``. Like `grader`'s commands, `run` and `site` run the instructor's
own solutions (trusted code), with no jail.
"""
