"""Covers: tests.helpers.forked_cells.

The fairness tests' runner (tests/helpers/forked_cells.py) reports what a kernel would:
each variant of a notebook runs its own cells from its first change on, in a copy of the
state the shared cells left, its graded cells' errors reported as nbclient reports them;
it runs on the settings asked for, and a variant that crashes or hangs is an error, never
a pass."""
from __future__ import annotations

import nbformat
import pytest

from helpers.forked_cells import CHILDREN_AT_ONCE, failing_tests_forked, first_difference

pytestmark = pytest.mark.slow


def _notebook(*sources, graded=()):
    cells = []
    for i, source in enumerate(sources):
        cell = nbformat.v4.new_code_cell(source)
        if i in graded:
            cell.metadata["nbgrader"] = {"grade_id": f"test_{i}", "grade": True, "points": 1}
        cells.append(cell)
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# prose is skipped"), *cells])


SHARED = ("import pathlib\nRUNS = pathlib.Path('runs.txt')\n"
          "RUNS.write_text(RUNS.read_text() + 'x' if RUNS.exists() else 'x')")
BASE = [SHARED, "answer = 2", "assert answer == 2, f'answer is {answer}'", "total = answer * 10",
        "assert total == 20, 'total'"]


def _variant(**changes):
    sources = list(BASE)
    for index, source in changes.items():
        sources[int(index.removeprefix("cell"))] = source
    return _notebook(*sources, graded=(2, 4))


def test_each_variant_fails_its_own_cells_and_the_shared_cells_run_once(tmp_path):
    base = _notebook(*BASE, graded=(2, 4))
    variants = {"wrong answer": _variant(cell1="answer = 3"),
                "wrong total": _variant(cell3="total = answer * 11"),
                "same as the base": _variant()}
    base_failed, failed = failing_tests_forked(base, variants, tmp_path)
    assert base_failed == {}
    assert failed["wrong answer"] == {"test_2": "AssertionError: answer is 3", "test_4": "AssertionError: total"}
    assert failed["wrong total"] == {"test_4": "AssertionError: total"}
    assert failed["same as the base"] == {}
    # The first cell, shared by all, ran in one process once: the variants forked after it.
    assert (tmp_path / "runs.txt").read_text() == "x"


def test_a_variant_does_not_change_what_the_base_runs_after_it(tmp_path):
    base = _notebook("seen = []", "seen.append('base')", "assert seen == ['base'], seen", graded=(2,))
    variant = _notebook("seen = []", "seen.append('variant'); import torch; torch.manual_seed(1)",
                        "assert seen == ['base'], seen", graded=(2,))
    base_failed, failed = failing_tests_forked(base, {"other": variant}, tmp_path)
    assert base_failed == {}
    assert failed == {"other": {"test_2": "AssertionError: ['variant']"}}


def test_a_syntax_error_fails_its_cell_as_in_a_kernel(tmp_path):
    base = _notebook("x = 1", "assert x == 1", graded=(1,))
    variant = _notebook("x = 1", "assert x == (", graded=(1,))
    _, failed = failing_tests_forked(base, {"broken": variant}, tmp_path)
    assert list(failed["broken"]) == ["test_1"] and failed["broken"]["test_1"].startswith("SyntaxError")


def test_ranks_launched_in_a_variant_come_from_the_forkserver_the_base_started(tmp_path):
    setup = ("import os, course, multiprocessing.forkserver\ncourse.launch(int, 1)\n"
             "SERVER = multiprocessing.forkserver._forkserver._forkserver_pid")
    launch = "parents = list(course.launch(os.getppid, 2))"
    test = "assert parents == [SERVER] * 2, f'{len(parents)} ranks, forked by {set(parents) - {SERVER}}'"
    base = _notebook(setup, launch, test, graded=(2,))
    variant = _notebook(setup, launch.replace(", 2)", ", 3)"), test, graded=(2,))
    base_failed, failed = failing_tests_forked(base, {"three ranks": variant}, tmp_path)
    assert base_failed == {}
    assert failed == {"three ranks": {"test_2": "AssertionError: 3 ranks, forked by set()"}}


def test_variants_run_side_by_side(tmp_path):
    # Each variant waits until CHILDREN_AT_ONCE variants have started: run one at a time,
    # the first would wait out its deadline and fail its test cell.
    wait = ("import pathlib, time\npathlib.Path(f'started-{NAME}').touch()\ndeadline = time.monotonic() + 30\n"
            f"while len(list(pathlib.Path().glob('started-*'))) < {CHILDREN_AT_ONCE} and time.monotonic() < deadline:\n"
            "    time.sleep(0.05)")
    check = f"assert len(list(pathlib.Path().glob('started-*'))) >= {CHILDREN_AT_ONCE}, 'variants ran one at a time'"
    base = _notebook("NAME = 'base'\nimport pathlib", "pass", "pass", graded=(2,))
    variants = {f"variant {i}": _notebook(f"NAME = {i}\nimport pathlib", wait, check, graded=(2,))
                for i in range(CHILDREN_AT_ONCE)}
    base_failed, failed = failing_tests_forked(base, variants, tmp_path, case_timeout=60)
    assert (base_failed, failed) == ({}, {name: {} for name in variants})


@pytest.mark.parametrize(("cell", "why"), [("import os; os._exit(3)", "without a result"),
                                           ("import time; time.sleep(60)", "still running after 2 s")])
def test_a_variant_that_crashes_or_hangs_is_an_error_not_a_pass(cell, why, tmp_path):
    base = _notebook("x = 1", "assert x == 1", graded=(1,))
    variant = _notebook("x = 1", cell, graded=(1,))
    with pytest.raises(AssertionError, match=why):
        failing_tests_forked(base, {"bad": variant}, tmp_path, case_timeout=2)


@pytest.mark.parametrize(("capability", "threads"), [(None, 2), ("default", 1)])
def test_it_runs_on_the_settings_asked_for(capability, threads, tmp_path):
    probe = ("import torch\nassert torch.get_num_threads() == THREADS\n"
             "assert CAPABILITY is None or torch.backends.cpu.get_cpu_capability() == CAPABILITY.upper()")
    base = _notebook(f"THREADS, CAPABILITY = {threads}, {capability!r}", probe, graded=(1,))
    assert failing_tests_forked(base, {}, tmp_path, threads=threads, capability=capability) == ({}, {})


def test_a_run_that_forks_stays_on_one_thread(tmp_path):
    nb = _notebook("x = 1")
    with pytest.raises(ValueError, match="one thread"):
        failing_tests_forked(nb, {"same": nb}, tmp_path, threads=2)


def test_variants_must_have_the_bases_cells():
    with pytest.raises(ValueError, match="graded_only"):
        first_difference(_notebook("a", "b"), _notebook("a"))
    assert first_difference(_notebook("a", "b"), _notebook("a", "c")) == 2  # after the markdown and "a"
    assert first_difference(_notebook("a", "b"), _notebook("a", "b")) == 3


def test_a_variant_that_may_stop_runs_only_as_far_as_its_change_reaches(tmp_path):
    # Cell 3 reads nothing that cell 1 binds: the stopping variant skips it, the other runs it.
    counting = ("import pathlib\nLATE = pathlib.Path('late.txt')\n"
                "LATE.write_text(LATE.read_text() + 'x' if LATE.exists() else 'x')")
    base = _notebook("answer = 2", "doubled = answer * 2", "assert doubled == 4, doubled", counting,
                     graded=(2,))
    wrong = _notebook("answer = 2", "doubled = answer * 3", "assert doubled == 4, doubled", counting,
                      graded=(2,))
    base_failed, failed = failing_tests_forked(base, {"stops": wrong, "runs on": wrong}, tmp_path,
                                               stop_where_unreached=frozenset({"stops"}))
    assert base_failed == {}
    assert failed == {"stops": {"test_2": "AssertionError: 6"}, "runs on": {"test_2": "AssertionError: 6"}}
    assert (tmp_path / "late.txt").read_text() == "xx", "the base and the variant that runs on, not the other"
