"""grader.judge.tampering: each way of reaching for the grading machinery is flagged at its line, and
correct answers (the solutions, the labs' answers written differently) are never flagged."""
from __future__ import annotations

import importlib

import pytest
from nbformat.v4 import new_code_cell

from grader.common.quoting import quoted
from grader.grading import verdict
from grader.judge import tampering
from grader.judge.tampering import flags
from helpers import REPO, graded_labs
from helpers.submissions import released, solved

LAB = "02_data_parallel"   # it imports torch.distributed as dist and has read-only helper cells
GRADED_LABS = [lab.name for lab in graded_labs()]   # every lab with graded cells, found in solutions/

# (the student's cell, the line flagged, words of its verdict line)
ATTACKS = {
    "rebinds a check": ("course.check.assert_close = lambda *a, **k: None", 1, "rebinds course.check.assert_close"),
    "rebinds the lab's name": ("x = 1\ncheck = lambda *a, **k: None", 2,
                               "rebinds check, which the lab's own cells define"),
    "rebinds torch": ("torch.allclose = lambda *a, **k: True", 1, "rebinds torch.allclose"),
    "setattr on grading": ("setattr(course.grading, 'under_grader', lambda: False)", 1,
                           "calls setattr on course.grading"),
    "builtins import": ("import builtins\nbuiltins.__import__ = None", 2, "rebinds builtins.__import__"),
    "ast transformer": ("get_ipython().ast_transformers.append(object())", 1, "installs an IPython AST transformer"),
    "input transformer": ("ip = get_ipython()\nip.input_transformers_post.append(str)", 2,
                          "installs an IPython input transformer"),
    "transformer manager": ("get_ipython().input_transformer_manager.cleanup_transforms = []", 1,
                            "input_transformer_manager"),
    "custom exc": ("get_ipython().set_custom_exc((AssertionError,), print)", 1, "installs a custom exception handler"),
    "event callback": ("get_ipython().events.register('post_run_cell', print)", 1,
                       "registers an IPython event callback"),
    "reads grading": ("honest = course.grading.under_grader()", 1, "touches course.grading"),
    "imports grading": ("import os\nfrom course import grading as g", 2, "imports course.grading"),
    "exec": ("exec(''.join(['print', '(1)']))", 1, "calls exec on computed text"),
    "dynamic import": ("m = __import__('cour' + 'se')", 1, "calls __import__ on computed text"),
    "importlib": ("import importlib\nimportlib.reload(course)", 2, "calls importlib.reload on computed text"),
    "settrace": ("import sys\nsys.settrace(print)", 2, "installs a trace hook"),
    "sys.modules": ("import sys\nsys.modules['course'].check = None", 2, "rebinds sys.modules[...].check"),
    "ctypes": ("import ctypes", 1, "uses ctypes"),
    "referrers": ("import gc\ngc.get_referrers(check)", 2, "uses gc.get_referrers"),
    "numpy": ("np.testing.assert_allclose = print", 1, "rebinds np.testing.assert_allclose"),
    "REFERENCE": ("REFERENCE = None", 1, "rebinds REFERENCE"),
    "del": ("del course.check.assert_close", 1, "deletes course.check.assert_close"),
    "global": ("def sneak():\n    global check\n    check = print\nsneak()", 3, "rebinds check"),
    "alias": ("from course import check as c\nc.assert_close = print", 2, "rebinds course.check.assert_close"),
    "dist": ("dist.all_reduce = print", 1, "rebinds torch.distributed.all_reduce"),
    "computed getattr": ("getattr(course, 'gra' + 'ding')", 1, "reads a computed attribute of course"),
    "inside a magic": ("%time course.check.assert_close = print", 1, "rebinds course.check.assert_close"),
    "import over a name": ("import numpy as torch", 1, "rebinds torch"),
    "read-only helper": ("def all_reduce_against_sum(*args, **kwargs):\n    return None", 1,
                         "redefines all_reduce_against_sum"),
    "vars": ("vars(course.check)['assert_close'] = print", 1, "rebinds course.check[...]"),
    "string name": ("h = getattr(get_ipython(), 'ast_transformers')", 1, "ast_transformers"),
}
# Indirection: each form a second red team used to switch the checks off unseen (issue 33).
ATTACKS.update({
    "alias of check": ("_c = check\n_c.assert_close = print", 2, "rebinds course.check.assert_close"),
    "alias of REFERENCE": ("R = REFERENCE\nreal = R.check\nR.check = lambda *a, **k: real(*a, **k)", 3,
                           "rebinds REFERENCE.check"),
    "alias of an alias": ("a = check\nb = a\nb.assert_close = print", 3, "rebinds course.check.assert_close"),
    "alias in a tuple": ("x, c = 1, check\nc.assert_close = print", 2, "rebinds course.check.assert_close"),
    "alias in a loop": ("for m in (check, course.check):\n    m.assert_close = print", 2,
                        "rebinds course.check.assert_close"),
    "alias in a function": ("def off():\n    c = REFERENCE\n    c.check = print\noff()", 3,
                            "rebinds REFERENCE.check"),
    "walrus alias": ("(c := check).assert_close = print", 1, "rebinds course.check.assert_close"),
    "type()": ("type(REFERENCE).check = print", 1, "rebinds REFERENCE.check"),
    "type() alias": ("T = type(REFERENCE)\nT.check = print", 2, "rebinds REFERENCE.check"),
    "__dict__.update": ("REFERENCE.__dict__.update(check=print)", 1, "changes REFERENCE.__dict__ in place"),
    "vars().update": ("vars(check).update(assert_close=print)", 1, "changes vars(course.check) in place"),
    "setattr alias": ("s = setattr\ns(check, 'assert_close', print)", 2, "calls setattr on course.check"),
    "setattr on an alias": ("c = check\nsetattr(c, 'assert_close', print)", 2, "calls setattr on course.check"),
    "object.__setattr__": ("object.__setattr__(REFERENCE, 'check', print)", 1, "calls __setattr__ on REFERENCE"),
    "__setattr__ method": ("REFERENCE.__setattr__('check', print)", 1, "calls __setattr__ on REFERENCE"),
    "sys.modules alias": ("import sys\nm = sys.modules['course.check']\nm.assert_close = print", 3,
                          "rebinds sys.modules[...].assert_close"),
    "sys.modules update": ("import sys\nsys.modules.update(course=None)", 2, "changes sys.modules in place"),
    "importlib by name": ("import importlib\nimportlib.import_module('course.check').assert_close = print", 2,
                          "rebinds course.check.assert_close"),
    "import_module alias": ("import importlib\nm = importlib.import_module('course.check')\nm.assert_close = print",
                            3, "rebinds course.check.assert_close"),
    "__import__ alias": ("m = __import__('course')\nm.check.assert_close = print", 2,
                         "rebinds course.check.assert_close"),
    "__code__ swap": ("f = check.assert_close\nf.__code__ = (lambda *a, **k: None).__code__", 2,
                      "replaces the __code__ of course.check.assert_close"),
    "__code__ by setattr": ("setattr(len, '__code__', None)", 1, "replaces the __code__ of len"),
    "exec alias": ("e = exec\ne(''.join(['check.assert_close', ' = print']))", 2, "calls exec on computed text"),
    "exec of constant text": ("exec('check.assert_close = print')", 1, "rebinds course.check.assert_close"),
    "globals()": ("globals()['check'].assert_close = print", 1, "rebinds globals()[...].assert_close"),
    "user_ns": ("get_ipython().user_ns['REFERENCE'].check = print", 1, "rebinds get_ipython().user_ns[...].check"),
    "gc walk": ("import gc\nfound = gc.get_objects()", 2, "uses gc.get_objects"),
    "distributed_c10d": ("import torch.distributed.distributed_c10d as c10d", 1, "around the course's recorder"),
    "c10d attribute": ("def ring_all_reduce(t):\n    torch.distributed.distributed_c10d.all_reduce(t)", 2,
                       "around the course's recorder"),
    "process group method": ("def ring_all_reduce(t):\n    dist.group.WORLD.allreduce([t]).wait()", 2,
                             "a process group's own allreduce"),
    "recorder by hand": ("def ring_all_reduce(t):\n    course.recorder.active()._begin(None)", 2,
                         "touches course.recorder"),
    "recorder imported": ("from course.recorder import active", 1, "touches course.recorder"),
    "recorder by name": ("import sys\nr = sys.modules['course.recorder']", 2, "names course.recorder in a string"),
    "records made": ("record = course.comm.CommRecord(0, 'send', (1,), 'float32', 4, 2, 1, False, 'p2p', 4)", 1,
                     "around the course's recorder"),
    "private part of dist": ("g = dist._get_default_group()", 1, "around the course's recorder"),
})


def _with_cell(lab: str, source: str):
    nb = solved(lab)
    setup = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells.insert(setup + 1, new_code_cell(source))
    return nb, setup + 1


def test_the_read_only_helpers_of_the_lab_are_protected():
    protected = tampering.LabNames(released(LAB)).protected
    assert {"check", "course", "torch", "dist", "F", "REFERENCE", "all_reduce_against_sum"} <= protected
    assert not {"os", "time", "plt"} & protected   # rebinding those breaks only the student's own run


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_each_attack_is_flagged_at_its_line(attack):
    source, line, words = ATTACKS[attack]
    nb, index = _with_cell(LAB, source)
    found = flags(nb, released(LAB))
    assert len(found) == 1, found
    assert found[0].startswith(f"cell {index + 1} {quoted(source.splitlines()[0], 40)} line {line} "), found
    assert words in found[0] and found[0].endswith(": flagged for the instructor"), found


def test_an_attack_inside_a_solution_cell_names_the_exercise():
    nb = solved(LAB)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "shard")
    cell.source += "\ncheck.assert_close = lambda *a, **k: None"
    line = len(cell.source.splitlines())
    assert flags(nb, released(LAB)) == [
        f"cell shard line {line} rebinds course.check.assert_close: flagged for the instructor"]


def test_a_syntax_error_is_not_tampering():
    nb, _ = _with_cell(LAB, "check = (\n")
    assert flags(nb, released(LAB)) == []


def test_the_students_own_names_attributes_and_imports_are_theirs():
    nb, _ = _with_cell(LAB, "import torch\nimport torch.distributed as dist\nfrom course import check\n"
                            "import numpy as np\nmodel = torch.nn.Linear(2, 2)\nmodel.weight.data[0] = 1\n"
                            "def shard(x):\n    check = 3\n    return x\nexec('print(1)')\n"
                            "setattr(model, 'bias', None)\n"
                            # names bound to what the course or torch return, not to the course itself
                            "group = dist.group.WORLD\nrank = dist.get_rank()\nlayer = torch.nn.Linear(2, 2)\n"
                            "layer.weight = torch.nn.Parameter(torch.zeros(2, 2))\nstate = vars(layer)\n"
                            "kind = type(layer)\nfor t in (layer.weight, layer.bias):\n    t.grad = None\n"
                            "results = course.launch\nd = dict(a=1)\nd.update(b=2)\n")
    assert flags(nb, released(LAB)) == []


def test_many_flags_are_capped_and_kept_by_the_verdict():
    nb, _ = _with_cell(LAB, "\n".join(f"course.check.f{i} = None" for i in range(20)))
    found = flags(nb, released(LAB))
    assert len(found) == tampering.MAX_FLAGS and found[-1].startswith("… and 15 more")
    lines = verdict.lines(graded=True, score=1, max_score=2, tampered=found,
                          ran=[f"cell {i} raised ValueError" for i in range(20)])
    assert lines[1:1 + len(found)] == found


@pytest.mark.parametrize("lab", GRADED_LABS)
def test_the_solutions_are_not_flagged(lab):
    assert flags(solved(lab), released(lab)) == []


def fairness_module(lab: str) -> str:
    """The lab's fairness tests, tests/test_labN_grading.py (N: the lab's number)."""
    return f"test_lab{int(lab[:2])}_grading"


@pytest.mark.parametrize("lab", GRADED_LABS)
def test_answers_written_differently_are_not_flagged(lab):
    module = fairness_module(lab)
    assert (REPO / "tests" / f"{module}.py").is_file(), \
        f"{lab} has graded cells but no fairness tests: write tests/{module}.py (CONTRIBUTING, step 8)"
    lab_tests = importlib.import_module(module)
    assert lab_tests.LAB == lab, f"tests/{module}.py tests {lab_tests.LAB}, not {lab}"
    assert flags(solved(lab, answers=lab_tests.DIFFERENT), released(lab)) == []


@pytest.mark.parametrize("lab", GRADED_LABS)
def test_the_labs_own_cells_edited_by_the_student_are_not_flagged(lab):
    # A student may change the sizes of the setup cell or rerun a demo: the lab's own lines are no tampering.
    nb = solved(lab)
    for cell in nb.cells:
        if cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get("locked"):
            cell.source += "\nprint('changed')"
    assert flags(nb, released(lab)) == []


@pytest.mark.parametrize("source", ["x = " + "+".join(["1"] * 20_000), "x = " + "-" * 50_000 + "1",
                                    "x = " + "[" * 190 + "]" * 190, "def f():\n" + "".join(
                                        "    " * (i + 1) + "if x:\n" for i in range(95)) + "    " * 96 + "pass"])
def test_a_cell_too_deep_to_scan_is_flagged_and_never_stops_the_run(source):
    """A deeply nested expression once raised RecursionError in the grader itself, ending the class's run."""
    nb, index = _with_cell(LAB, source + "\ncheck.assert_close = print")
    found = flags(nb, released(LAB))
    assert found and all(line.endswith("flagged for the instructor") for line in found), found
