"""Course tooling around nbgrader: build the student release, grade submissions.

Run it as ``python -m grader COMMAND`` from anywhere; see ``python -m grader -h``.
Each command lives in its own module that provides ``add_subcommand(subparsers)``
and is listed in ``grader.__main__.COMMANDS``.

Layout (see ``nbgrader_config.py``): ``solutions/<lab>/<lab>.ipynb`` are the
instructor's nbgrader source notebooks, ``labs/<lab>/<lab>.ipynb`` the generated
student release, ``grader/reference/`` the hidden tests' stored values, and
``grader/work/`` (git-ignored) nbgrader's grading work area.

Student code is hostile, and the jail is the security boundary. No module of this
package runs inside it: a jail holds the student's kernel, the ranks it launches and
a copy of `course/`. Everything here runs outside, as the user who runs the grader
(when that is root, each jail also gets a uid of its own), unless its subsystem says
otherwise.

The subsystems come in six layers, bottom up. A module imports from its own layer and
the layers below, never above (tests/test_architecture.py holds this, and that every
module is in exactly one layer):

- common (grader/common/): labs, quoting, nbgrader_cli, warm_process, execute, solution, compare, stubs, cores,
  private_write, command_line, rubrics.
  What the others use: the labs in solutions/ and their notebooks, one executed in this
  interpreter's kernel or loaded as a module (the instructor's solutions: trusted code),
  nbgrader's command line, a helper process kept warm for a whole grading run, the
  student's text as the grader quotes it, the release's stubs, and how a kernel's threads
  wait where notebooks share the cores, how a file of the grader's is written private, and the
  command line `python -m grader` and `python -m course_tools` share, and each written answer's model answer
  and rubric, put beside it in the autograded notebook that formgrader shows and left out of every feedback page.
- jail (grader/jail/): seccomp, uids, cgroups, bwrap, launcher, host, kernel_manager, kernel.
  The boundary. `bwrap` is the jail's shape (its limits, its spec, its folder, bwrap's command
  line); `host` holds one jail in the grader (its folder, cgroup and uid, what it used).
  `kernel_manager` is nbgrader's kernel manager, in the autograde worker: it starts the
  kernel through the launcher, ``python -m grader.jail.launcher``, which joins the cgroup,
  sets the rlimits and execs bwrap; inside, the kernel runs under the seccomp filter, as
  the jail's uid when the grader is root. What the kernel sends back is capped before the
  grader holds it: each frame by `kernel_manager`'s sockets, each cell's output by `kernel`,
  nbgrader's Execute.
- judge (grader/judge/): server, client, spawner, judged_execute, tampering, scanner, allowed, lab_cells,
  loopback, wire.
  The hidden tests' answers, kept outside the jail. `server` is a process of its own per
  submission (as an unprivileged uid when started by root) that answers the jailed kernel
  pass or fail over a unix socket; `client`, in the grader, starts it and reads what it
  found; `spawner` is a grading run's warm process that forks each judge, its imports
  paid once; `judged_execute`, in the autograde worker, tells the judge which test cell
  runs; `tampering` reads the student's code as text, in the grader, and never runs it
  (`scanner`, its `ast` visitor, reads each cell): against `allowed`, what a student's cell may
  use, and `lab_cells`, what the lab's own bind;
  `loopback` reads what the jail's processes wrote to each other (its network's counters, from
  outside, in the autograde worker), and `wire` compares it with what the ranks' records account for.
- feedback (grader/feedback/): safety, page, worker.
  The feedback page, from a notebook the student's code wrote into: `safety` makes it
  inert (also as autograde's last step, in the autograde worker), `page` renders it in
  the feedback worker, a process of its own that is killed past its time.
- grading (grader/grading/): collect, unzip, receipts, gradebook, workspace, verdict, export, autograde_worker,
  submission, logs, shards, exchange, plain_copy, feedback_release.
  A grading run's parts, in the grader: the submissions collected (`unzip`: from a zip of them;
  `exchange`: nbgrader's collect that refuses a submission handed in as another student or holding
  a link, copied by `plain_copy` without following one, and `feedback_release`, its
  release of feedback pages readable by their students, both run by the instructor's nbgrader;
  `receipts`: nbgrader's, kept beside each feedback page where the exchange vouches for them, so that
  formgrader returns it through the exchange), each graded in a jail
  of its own (`submission`: nbgrader's autograde in the slot's warm autograde worker; `logs`:
  what it leaves for the instructor, and a page where nothing was graded), the verdict in
  plain words, the class gradebook and the CSV; `shards`: a class split into shards graded
  anywhere, and merged.
- commands (grader/): __main__, grade, judge_values, record, merge, release, reference.
  What an instructor types. `grade` grades a class with all of the above (`judge_values`:
  the judge's values of its run, recorded by `reference` or reused from an earlier run; `record`
  records them once for a class's shards, `merge` joins the shards); `release` and
  `reference` work only on the instructor's own solutions (trusted code), with no jail.
  The commands that grade nothing (a lab's training under torchrun, the website, the students'
  handout) are ``python -m course_tools`` (course_tools/): this package does what its name says,
  grading, and the tools that only run the instructor's trusted solutions live apart from the
  jail's and the judge's code; `python -m grader run|site|handout` forwards there for one term
  (``__main__``, the one import of course_tools here).

A subpackage's ``__init__`` holds its docstring and nothing else: the launcher, the judge
and the workers start with ``python -m``, and a package that imported them would load each
twice, once as itself and once as ``__main__``.
"""

from pathlib import Path

#: The repository root, i.e. the nbgrader course root.
COURSE_ROOT = Path(__file__).resolve().parent.parent


class GraderError(Exception):
    """A user-facing error: the CLI prints the message and exits with status 1."""
