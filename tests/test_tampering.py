"""Covers: grader.judge.tampering, grader.judge.scanner, grader.judge.allowed, grader.judge.lab_cells.

grader.judge.tampering and grader.judge.allowed: each way of reaching for the grading machinery is flagged
at its line and withholds, what is only outside the allowlist is flagged and costs nothing, and correct
answers (the solutions, the labs' answers written differently, their honest mistakes) are never flagged."""
from __future__ import annotations

import importlib
import json
import pickle
import re

import pytest
from nbformat.v4 import new_code_cell

from grader.common.quoting import quoted
from grader.grading import verdict
from grader.jail.bwrap import Limits
from grader.judge import allowed, lab_cells, tampering
from grader.judge.tampering import flags, scan
from helpers import REPO, graded_labs
from helpers.submissions import CHECK_REBOUND, released, solved

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
    # the judge's seed decides a hidden case (lab 10's broken programs are drawn from it): read, it answers
    "reads REFERENCE": ("def answer(records):\n    return REFERENCE.seed()", 2, "reads REFERENCE, the judge's"),
    "reads REFERENCE through a name": ("judge = REFERENCE\ns = judge.seed()", 1, "reads REFERENCE, the judge's"),
    "reads a hidden test's variable": ("def answer(records):\n    return judged_seed % 7", 2,
                                       "reads judged_seed, which no cell of the notebook binds"),
    "del": ("del course.check.assert_close", 1, "deletes course.check.assert_close"),
    "global": ("def sneak():\n    global check\n    check = print\nsneak()", 3, "rebinds check"),
    "alias": ("from course import check as c\nc.assert_close = print", 2, "rebinds course.check.assert_close"),
    "dist": ("dist.all_reduce = print", 1, "rebinds torch.distributed.all_reduce"),
    "computed getattr": ("getattr(course, 'gra' + 'ding')", 1, "reads a computed attribute of course"),
    # lab 9's pieces are labs 3 to 8's answers: imported or reached through `course`, in any other lab
    "imports lab 9's pieces": ("from course.gpt_stage import Stage", 1, "the course's own answers"),
    "reaches lab 9's pieces": ("import course.grid_step\nrun = course.grid_step.train", 2,
                               "the course's own answers"),
    "inside a magic": ("%time course.check.assert_close = print", 1, "rebinds course.check.assert_close"),
    "import over a name": ("import numpy as torch", 1, "rebinds torch"),
    "read-only helper": ("def all_reduce_against_sum(*args, **kwargs):\n    return None", 1,
                         "redefines all_reduce_against_sum"),
    "vars": ("vars(course.check)['assert_close'] = print", 1, "rebinds course.check[...]"),
    "string name": ("h = getattr(get_ipython(), 'ast_transformers')", 1, "IPython shell"),
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
    "recorder by name": ("import sys\nr = sys.modules['course.recorder']", 2, "sys.modules"),
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
    protected = lab_cells.LabNames(released(LAB)).protected
    assert {"check", "course", "torch", "dist", "F", "REFERENCE", "all_reduce_against_sum"} <= protected
    assert not {"os", "time", "plt"} & protected   # rebinding those breaks only the student's own run


# Issue 54: what the red team's fourth round used unflagged, each reaching past what the scan read before.
ATTACKS.update({
    "frames": ("import sys\n_g = sys._getframe(0).f_globals\n_g['check'].assert_close = print", 2,
               "reaches a frame ("),
    "through a frame's globals": ("import sys\n_g = sys._getframe(0).f_globals\n_g['check'].assert_close = print", 3,
                                  "rebinds globals()[...].assert_close"),
    "f_globals of a function": ("g = course.launch.__globals__", 1, "__globals__"),
    "a frame's caller": ("def up(frame):\n    return frame.f_back", 2, "reaches a frame (f_back)"),
    "__wrapped__": ("def ring_all_reduce(t):\n    dist.all_to_all_single.__wrapped__(t, t)", 2, "__wrapped__"),
    "inspect.unwrap": ("import inspect\nraw = inspect.unwrap(dist.all_reduce)", 2, "uses inspect.unwrap"),
    "inspect imported": ("import inspect", 1, "imports inspect, a module no lab uses"),
    "torch.ops": ("def ring_all_reduce(t):\n    torch.ops.c10d.allreduce_([t])", 2, "torch.ops"),
    "functional collectives": ("import torch.distributed._functional_collectives as fc", 1,
                               "imports torch.distributed._functional_collectives"),
    "functional collectives by attribute": ("y = torch.distributed._functional_collectives.all_reduce", 1,
                                            "torch.distributed._functional_collectives"),
    "course.__dict__": ("r = course.__dict__['rec' + 'order']", 1, "__dict__"),
    "sys.modules by a computed name": ("import sys\nr = sys.modules['course.' + 'rec' + 'order']", 2, "sys.modules"),
    "sys.modules.get": ("import sys\nc = sys.modules.get('ctyp' + 'es')", 2, "sys.modules"),
    "object.__getattribute__": ("raw = object.__getattribute__(dist.all_reduce, '_orig' + 'inal')", 1,
                                "__getattribute__"),
    "attrgetter by a computed name": ("import operator\nf = operator.attrgetter('all_' + 'reduce')(dist)", 2,
                                      "operator.attrgetter with a computed name"),
    "attrgetter of a dunder": ("import operator\nf = operator.attrgetter('__wrapped__')(dist.all_reduce)", 2,
                               "__wrapped__"),
    "pickle": ("import pickle\npickle.loads(b'')", 1, "imports pickle"),
    "marshal": ("from marshal import loads", 1, "imports marshal"),
    "builtins.exec": ("import builtins\nbuiltins.exec('check.assert' + '_close = print')", 2,
                      "calls exec on computed text"),
    "a Tensor subclass's __eq__": ("class Same(torch.Tensor):\n    def __eq__(self, other):\n        return True", 1,
                                   "subclasses torch.Tensor and redefines __eq__"),
    "__torch_function__": ("class Spy:\n    @classmethod\n    def __torch_function__(cls, *a, **k):\n        pass", 1,
                           "__torch_function__"),
    "getattr by a computed name": ("name = 'all_' + 'reduce'\nf = getattr(dist, name)", 2,
                                   "reads a computed attribute of torch.distributed"),
    "getattr of an import by a computed name": ("import math\nf = getattr(math, 'fl' + 'oor')", 2,
                                                "reads an attribute by a computed name"),
    "setattr by a computed name": ("setattr(model, 'we' + 'ight', None)", 1, "sets an attribute by a computed name"),
    "globals() read": ("g = globals()", 1, "globals()"),
    "vars() of a layer": ("state = vars(torch.nn.Linear(2, 2))", 1, "vars()"),
    "exec taken as a value": ("run = exec", 1, "takes exec as a value"),
    "a private part of torch": ("torch._C._set_grad_enabled(True)", 1, "torch._C"),
    "a private part of the course": ("course.check._tolerance = 1", 1, "course.check._tolerance"),
    "the judge by its variable": ("import os\npath = os.environ['COURSE_REFERENCE_JUDGE']", 2, "the judge"),
    "a module of one's own": ("import my_helpers", 1, "a module no lab uses, which the scan cannot read"),
    "a cell too deep to scan": ("x = " + "-" * 50_000 + "1", None, "nested too deeply"),
    "sys through another module": ("import os\nm = os.sys.modules", 2, "os.sys.modules"),
    "setattr as a value": ("from functools import partial\noff = partial(setattr, check, 'assert_close')", 2,
                           "takes setattr as a value"),
    "a unix socket": ("import socket\ns = socket.socket(socket.AF_UNIX)", 2, "AF_UNIX, a unix socket"),
    "numpy's ctypes": ("import numpy as np\np = np.ctypeslib.as_ctypes", 2, "numpy.ctypeslib"),
    "one import line, the worst named": ("import subprocess, pickle", 1, "imports pickle, a module no lab uses"),
})

# Outside the allowlist, but nothing in them can rewrite what the checks read: flagged, never withholding.
LISTED = {
    "a subprocess": ("import subprocess\nsubprocess.run(['true'])", 1, "imports subprocess"),
    "os.system": ("import os\nos.system('true')", 2, "runs another program"),
    "a socket": ("import socket", 1, "imports socket"),
    "two on one line": ("import subprocess, socket", 1, "imports subprocess, socket, outside"),
    "threads": ("import threading", 1, "imports threading"),
    "open": ("open('notes.txt', 'w').write('hi')", 1, "the builtin open"),
    "exec of plain text": ("exec('print(1)')", 1, "calls exec"),
    "a collective the labs do not use": ("def f(x):\n    dist.all_gather_object([None, None], x)", 2,
                                         "torch.distributed.all_gather_object"),
    "sys.version": ("import sys\nprint(sys.version)", 1, "imports sys"),
    "a dunder the labs do not use": ("n = torch.Tensor.__hash__", 1, "uses __hash__"),
    "computed hasattr": ("ok = hasattr(dist, 'all_' + 'reduce')", 1, "looks for an attribute by a computed name"),
    # a read of the student's own object by a computed name (a module's layers by name, say) rewrites nothing
    "getattr of one's own by a computed name": ("f = getattr(model, 'we' + 'ight')", 1,
                                                "reads an attribute by a computed name"),
}


def _cell_flags(source: str):
    nb, index = _with_cell(LAB, source)
    return [f for f in scan(nb, released(LAB)) if f.index == index], \
        f"cell {index + 1} {quoted(source.splitlines()[0], 40)}"


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_each_attack_is_flagged_at_its_line_and_withholds(attack):
    source, line, words = ATTACKS[attack]
    found, cell = _cell_flags(source)
    at = [f for f in found if f.startswith(f"{cell} line {line} " if line else f"{cell} ")]
    assert len(at) == 1, found
    assert words in at[0] and at[0].endswith(": flagged for the instructor"), at
    assert at[0].withholds, f"{attack} is flagged but does not withhold: {at[0]}"


@pytest.mark.parametrize("case", list(LISTED))
def test_what_is_only_outside_the_allowlist_is_flagged_and_costs_nothing(case):
    source, line, words = LISTED[case]
    found, cell = _cell_flags(source)
    at = [f for f in found if f.startswith(f"{cell} line {line} ")]
    assert len(at) == 1 and words in at[0], found
    assert not any(f.withholds for f in found), f"{case} withholds: {found}"


def test_the_course_s_answers_are_allowed_only_in_a_lab_whose_own_cells_import_them():
    for module in allowed.ANSWER_MODULES:
        assert allowed.answers_tier(f"{module}.Stage", {"torch", module}) is None
        finding = allowed.answers_tier(f"{module}.Stage", {"torch", "course.gpt"})
        assert finding.withholds and module in finding.what
    assert allowed.answers_tier("course.gpt.GPT", {"torch"}) is None     # the model itself answers nothing


def test_the_allowlist_never_lists_a_module_twice():
    assert not allowed.ALLOWED_MODULES & allowed.LISTED_MODULES
    assert not allowed.ALLOWED_DUNDERS & allowed.REACHING_DUNDERS
    assert not allowed.ALLOWED_BUILTINS & set(allowed.REACHING_BUILTINS)


def test_an_attack_inside_a_solution_cell_names_the_exercise():
    nb = solved(LAB)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "shard")
    cell.source += "\ncheck.assert_close = lambda *a, **k: None"
    line = len(cell.source.splitlines())
    assert flags(nb, released(LAB)) == [
        f"cell shard line {line} rebinds course.check.assert_close: flagged for the instructor"]


def test_the_flags_that_withhold_come_first_so_the_cap_never_hides_one():
    """Six lines outside the allowlist, then one that reaches a frame: the verdict's lines keep it."""
    nb, index = _with_cell(LAB, "\n".join(["import socket"] * 8 + ["import sys", "g = sys._getframe(0)"]))
    found = flags(nb, released(LAB))
    assert len(found) == tampering.MAX_FLAGS and found[0].withholds and "_getframe" in found[0], found
    assert found[-1].startswith("… and")


def test_the_test_cells_after_a_flagged_cell_are_those_it_withholds():
    nb = solved(LAB)
    tests = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    where = {c.metadata.get("nbgrader", {}).get("grade_id"): i for i, c in enumerate(nb.cells)}
    assert lab_cells.tests_after(nb, tests, 0) == tests
    second = where[tests[1]]
    assert lab_cells.tests_after(nb, tests, second) == tests[1:]
    assert lab_cells.tests_after(nb, tests, second - 1) == tests[1:]   # the answer cell before it
    assert lab_cells.tests_after(nb, tests, len(nb.cells)) == []
    del nb.cells[where[tests[0]]]          # deleted by the student, put back by nbgrader: counted as after
    assert lab_cells.tests_after(nb, tests, len(nb.cells)) == [tests[0]]


def test_a_flag_is_a_verdict_line_that_keeps_its_class_through_a_pickle():
    nb, _ = _with_cell(LAB, "import sys\ng = sys._getframe(0)")
    flag = next(f for f in scan(nb, released(LAB)) if f.withholds)
    again = pickle.loads(pickle.dumps(flag))
    assert (again, again.said, again.index, again.withholds) == (flag, flag.said, flag.index, True)
    assert json.loads(json.dumps([flag])) == [str(flag)]


def test_a_long_flat_sum_is_not_nesting():
    """A 600-term string concatenation is honest code: once flagged "nested too deeply"."""
    nb, _ = _with_cell(LAB, "banner = " + " + ".join(['"ab"'] * 600) + "\nprint(len(banner))")
    assert flags(nb, released(LAB)) == []


def test_a_syntax_error_is_not_tampering():
    nb, _ = _with_cell(LAB, "check = (\n")
    assert flags(nb, released(LAB)) == []


def test_the_students_own_names_attributes_and_imports_are_theirs():
    nb, _ = _with_cell(LAB, "import torch\nimport torch.distributed as dist\nfrom course import check\n"
                            "import numpy as np\nmodel = torch.nn.Linear(2, 2)\nmodel.weight.data[0] = 1\n"
                            "def shard(x):\n    check = 3\n    return x\n"
                            "setattr(model, 'bias', None)\n"
                            # names bound to what the course or torch return, not to the course itself
                            "group = dist.group.WORLD\nrank = dist.get_rank()\nlayer = torch.nn.Linear(2, 2)\n"
                            "layer.weight = torch.nn.Parameter(torch.zeros(2, 2))\n"
                            "kind = type(layer)\nfor t in (layer.weight, layer.bias):\n    t.grad = None\n"
                            "results = course.launch\nd = dict(a=1)\nd.update(b=2)\n"
                            # the allowlist's plain tools, and a name of the student's own that shadows a builtin
                            "import math, itertools, functools, collections, dataclasses, typing, time\n"
                            "from functools import partial, reduce\nfrom torch.utils.checkpoint import checkpoint\n"
                            "import torch.nn.functional as F\nclass Box:\n    def __init__(self):\n"
                            "        self._inner = getattr(dist, 'all_reduce')\n"
                            "    def __len__(self):\n        return super().__len__()\n"
                            "def open(x):\n    return x\nopen(1)\ntime.sleep(0)\n")
    assert flags(nb, released(LAB)) == []


def test_many_flags_are_capped_and_kept_by_the_verdict():
    nb, _ = _with_cell(LAB, "\n".join(f"course.check.f{i} = None" for i in range(20)))
    found = flags(nb, released(LAB))
    assert len(found) == tampering.MAX_FLAGS and found[-1].startswith(f"… and {21 - tampering.MAX_FLAGS} more")
    lines = verdict.lines(graded=True, score=1, max_score=2, tampered=found,
                          ran=[f"cell {i} raised ValueError" for i in range(20)])
    assert lines[1:1 + len(found)] == found
    assert found[-1].withholds, "the cut lines rebind the course: their summary withholds too"


def test_what_the_jail_saw_comes_before_the_lines_that_cost_nothing():
    """Past the verdict's cap, a read of the solutions the jail stopped outranks `open` outside the allowlist."""
    nb, _ = _with_cell(LAB, "\n".join(f"print(open('/tmp/f{i}').read())" for i in range(8)))
    found = flags(nb, released(LAB))
    assert found and not any(f.withholds for f in found), found
    ran = [f"cell {i} tried to read the course's solutions, which graded code cannot see" for i in range(5)]
    lines = verdict.lines(graded=True, score=1, max_score=2, tampered=found, ran=ran)
    assert lines[1:1 + len(ran)] == ran, lines
    assert lines[-1].startswith("… and "), lines


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
    for name, answers in _other_correct_answers(lab, lab_tests).items():
        assert flags(solved(lab, answers=answers), released(lab)) == [], name


def _other_correct_answers(lab: str, lab_tests) -> dict[str, dict[str, str]]:
    """The fairness module's other correct answers (its `also_correct` dicts: name -> {grade_id: answer}),
    found by their shape, whatever the module calls them."""
    exercises = {c.metadata["nbgrader"]["grade_id"] for c in released(lab).cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    found = {}
    for name, value in vars(lab_tests).items():
        if name != "DIFFERENT" and isinstance(value, dict) and value and all(
                isinstance(answers, dict) and answers and set(answers) <= exercises
                and all(isinstance(a, str) for a in answers.values()) for answers in value.values()):
            found.update(value)
    return found


# A planted mistake that silences the kernel's checks rebinds `check` (or its assert_close) to do it.
SILENCED = re.compile(r"^\s*check\s*=|check\.assert_close\s*=", re.M)
# The red team's ways around the course's recorder that some labs plant as mistakes: outside the allowlist.
TRICKS = ("_functional_collectives", "all_gather_object", "__wrapped__", "torch.ops", "distributed_c10d")


@pytest.mark.parametrize("lab", GRADED_LABS)
def test_honest_mistakes_are_not_flagged(lab):
    """A wrong answer is no tampering: only the mistakes planted behind a rebound check are flagged."""
    lab_tests = importlib.import_module(fairness_module(lab))
    for name, (edits, _) in lab_tests.MISTAKES.items():
        found = flags(solved(lab, edits), released(lab))
        planted = [new for changes in edits.values() for _, new in changes]
        rebound = any(CHECK_REBOUND in new or SILENCED.search(new) for new in planted)
        trick = any(word in new for word in TRICKS for new in planted)
        assert (found == []) != (rebound or trick), (name, found)
        assert not rebound or found[0].withholds, found


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
    assert found and all(line.endswith("flagged for the instructor") and line.withholds for line in found), found


def test_a_name_the_student_gave_an_exception_is_quoted():
    """`raise type("graded_19_of_19", (Exception,), {})()`: identifier-shaped, but the student's words."""
    said = lambda ename: verdict.explain_error({"ename": ename, "evalue": ""}, Limits(), 10)  # noqa: E731
    assert said("ValueError") == "raised ValueError"
    assert said("graded_19_of_19_points") == "raised «graded_19_of_19_points»"
    assert said("RankError") == "raised «RankError»"   # the course's own name is one a student can give too


def test_the_withheld_line_names_the_flag_the_cells_and_how_to_give_the_points_back():
    line = verdict.withheld_line(7, ["test_b", "test_c"], "cell 3 «import sys» line 2 reaches a frame (f_globals)")
    assert line.startswith("7 points withheld pending the instructor's review: cell 3 «import sys» line 2 ")
    assert "test_b, test_c" in line and "Manual Grading" in line
    lines = verdict.lines(graded=True, score=3, max_score=10, withheld=line, tampered=["x: flagged for the instructor"])
    assert lines[1] == verdict.fitted(line), lines
    assert verdict.withheld_line(0, [], "cell 3") is None
