"""What every run of a solution notebook must show, wherever it ran.

A solution runs headless in tests/test_notebooks.py and in JupyterLab in
tests/test_browser.py, each time on the settings of one of torch's instruction
sets and thread counts (helpers/forked_cells.py), and each time as
`python -m grader reference --check` runs it: recording its checked values into
a scratch folder. Whichever ran it, the run must

- create no file in its lab folder (`make release` would ship it to students);
- have run on the settings asked for (a SETTINGS_PROBE cell at the end says);
- record the values grader/reference/ stores for its lab, within the lab's tolerance.

Which run covers which setting (the fairness tests' forked run takes the machine's ISA and
1 thread, for the reference and the answer written differently: helpers/submissions.py):

| lab | "default", 2 threads | machine's ISA, 2 threads |
|---|---|---|
| launches ranks (``course.lab_ranks(``) | the browser, on 4 ranks | |
| launches none, graded | the browser | |
| launches none, grades nothing | the browser | headless |

So each solution runs on both instruction sets and with its kernel on both thread counts (a graded
lab's on the machine's set in its fairness tests), and a lab that launches ranks on 4 of them; a
graded lab's whole run at the default 2 ranks, as graded, is its round trip's recording of the
judge's values (helpers/round_trips.py, helpers/lab1_class.py). One run a setting: the suite has
30 minutes on 2 cores.
"""
from __future__ import annotations

import json
from fnmatch import fnmatch
from pathlib import Path

import nbformat

from grader import reference
from grader.common.labs import graded_cells, ignore_patterns, lab_notebooks

from . import REPO
from .forked_cells import SETTINGS_PROBE, assert_ran_on

SOLUTIONS = lab_notebooks(REPO / "solutions")
# The labs whose ranks $COURSE_RANKS sets.
ON_RANKS = [p for p in SOLUTIONS if "course.lab_ranks(" in p.read_text()]
# The labs the fairness tests do not run on the machine's instruction set: those with nothing graded.
UNGRADED = [p for p in SOLUTIONS if not graded_cells(nbformat.read(p, as_version=4))]

IN_THE_BROWSER = ("default", 2)  # (capability, threads): see the table above
BROWSER_RANKS = 4                # where a lab launches ranks
WITHOUT_RANKS = (None, 2)


def snapshot(folder: Path) -> set[Path]:
    """Paths under folder, except nbgrader-ignored litter (never released)."""
    patterns = ignore_patterns(REPO)
    return {p for p in folder.rglob("*")
            if not any(fnmatch(part, pat) for part in p.relative_to(folder).parts for pat in patterns)}


def assert_created_nothing(name: str, folder: Path, before: set[Path]) -> None:
    new = snapshot(folder) - before
    created = sorted(p for p in new if p.parent not in new)  # top-most only
    assert not created, (
        f"{name}: executing it created {', '.join(str(p.relative_to(folder)) for p in created)} "
        f"in {folder.name}/. `make release` would ship them to students in labs/: "
        "delete them, and make the notebook write to a temporary directory instead.")


def reported_settings(probe_output: str) -> dict:
    """The settings a SETTINGS_PROBE cell printed (its output's last line)."""
    lines = probe_output.strip().splitlines()
    assert lines, "the settings probe printed nothing"
    return json.loads(lines[-1])


def assert_ran_as_asked(name: str, probe_output: str, setting: tuple[str | None, int]) -> None:
    try:
        assert_ran_on(reported_settings(probe_output), *setting)
    except AssertionError as e:
        raise AssertionError(f"{name}: {e}") from None


def assert_recorded_the_reference(name: str, lab: str, recorded: Path) -> None:
    """The values the run recorded into `recorded` agree with grader/reference/ (reference --check)."""
    drift = reference.compare(REPO / reference.REFERENCE_DIR, recorded, [lab])
    assert not drift, (f"{name}: {reference.REFERENCE_DIR}/ has drifted from the solution (run "
                       f"`python -m grader reference {lab}`):\n  " + "\n  ".join(drift))


def with_probe(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """nb with a SETTINGS_PROBE cell at the end (in place)."""
    nb.cells.append(nbformat.v4.new_code_cell(SETTINGS_PROBE))
    return nb
