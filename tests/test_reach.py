"""Covers: tests.helpers.reach.

How far a changed cell reaches (tests/helpers/reach.py): through every way a later cell can
read a name the change binds, and no further. The fairness tests stop a mistake's run there."""
from __future__ import annotations

import pytest

from helpers.reach import last_cell_reached
from helpers.submissions import graded_only, solved


def reach(*sources, changed=1):
    return last_cell_reached(list(sources), {changed})


def test_a_name_carries_the_change_from_cell_to_cell_and_no_further():
    assert reach("x = 1", "f = lambda: 2", "y = f()", "z = y + 1", "print(x)") == 3


def test_a_function_defined_before_the_change_reads_the_changed_name_when_it_runs():
    # g's cell ran before the change, but g reads h when called: whoever calls g is reached.
    assert reach("def g():\n    return h()", "def h():\n    return 1", "print(1)", "g()", "print(2)") == 3


def test_a_name_the_cell_binds_before_reading_it_is_its_own():
    assert reach("pass", "x = 1", "x = 2\nprint(x)") == 1
    assert reach("pass", "x = 1", "print(x)\nx = 2") == 2
    assert reach("pass", "x = 1", "for x in range(3):\n    print(x)") == 1
    assert reach("pass", "x = 1", "for i in range(3):\n    print(x)\n    x = i") == 2   # read before bound
    assert reach("pass", "x = 1", "if True:\n    x = 2\nprint(x)") == 2                  # the branch may not run


def test_a_comprehension_reads_now_and_a_function_or_lambda_whenever_it_runs():
    assert reach("pass", "x = 1", "x = 2\nys = [x + i for i in range(3)]") == 1
    assert reach("pass", "x = 1", "x = 2\ndef f():\n    return x") == 2      # a later cell may rebind x
    assert reach("pass", "x = 1", "x = 2\nk = lambda: x") == 2


def test_a_name_in_a_string_counts_and_a_cell_that_does_not_parse_reaches_everything():
    assert reach("pass", "f = 1", "print(getattr(__main__, 'f'))") == 2
    assert reach("pass", "f = 1", "print(1)", "print(1 +", "print(2)") == 4


def test_a_cell_that_reaches_names_by_their_strings_may_touch_any():
    name = "'f'[::-1]"       # a name no reading of the source can see
    assert reach("pass", "f = 1", "print(1)", f"print(globals()[{name}])", "print(2)") == 4
    assert reach("pass", "f = 1", "print(1)", f"exec('g = ' + {name})", "print(g)") == 4
    # before the change: its function may read the changed name when called, so its caller is reached
    assert reach(f"def peek():\n    return globals()[{name}]", "f = 1", "print(1)", "peek()", "print(2)") == 3


def test_a_cell_with_ipython_magics_may_read_anything():
    # A magic runs code held in a string (%time y = x): no name in it can be told apart.
    assert reach("pass", "x = 1", "%time y = 2", "print(3)") == 3


@pytest.mark.slow
def test_in_lab_5_a_mistake_in_memory_by_kind_stops_at_its_test_and_one_in_zero_1_runs_on():
    # The training loop is written before zero1_step and calls it by name: every ZeRO test reaches
    # it. memory_by_kind is passed to the loop by the demonstrations only (`measure=`), so its
    # test is the last cell it reaches.
    lab = "05_sharded_data_parallel"
    cells = [c for c in graded_only(solved(lab), lab).cells if c.cell_type == "code"]
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in cells]
    sources = [c.source for c in cells]
    assert ids[last_cell_reached(sources, {ids.index("memory_by_kind")})] == "test_memory_by_kind"
    assert ids[last_cell_reached(sources, {ids.index("zero1_step")})] == "test_fsdp_hooks"


def test_a_name_bound_in_one_case_of_a_match_or_in_a_try_is_not_surely_bound():
    assert reach("pass", "x = 1", "match 3:\n    case 3:\n        x = 2\nprint(x)") == 2
    assert reach("pass", "x = 1", "try:\n    x = 2\nexcept ValueError:\n    pass\nprint(x)") == 2
