"""Covers: grader.judge, the hostile students.

Attacks on the judge, each a student of a real grading run of lab 1 (`python -m grader grade`: the
class the grading modules share, helpers.lab1_class).

The judge decides every graded test cell's points outside the kernel: a
submission that strips the kernel's asserts, rebinds the course's checks, fakes
the judge's answers, asks it for answers from its own cells, or floods it, gets
what its code earns and no more, and nothing at all pending the instructor's review
where a line of it can rewrite a check (grader.judge.allowed); the kernel never
sees a reference value.
"""
from __future__ import annotations

import html
import json
import re

import pytest
from nbformat.v4 import new_code_cell
from test_hostile_grading import _with_cells

from course import grading
from grader.common.labs import graded_cells, read_notebook
from helpers import REPO, needs_jail, round_trips
from helpers.lab1_class import HONEST, TEST_TIMEOUT_S
from helpers.submissions import solved, without_demonstrations

LAB = "01_single_gpu"
POINTS = graded_cells(read_notebook(REPO / "solutions" / LAB / f"{LAB}.ipynb"))
FULL = sum(POINTS.values())
MOMENTUM = POINTS["test_momentum_sgd"]
# A stub that moves no weight: every kernel-side test of it fails, unless the asserts go.
STUB = ("self.params[i].add_(self.velocity[i], alpha=-self.lr)", "pass")

pytestmark = [pytest.mark.grading, needs_jail()]

STRIP_ASSERTS = '''
import ast
class NoAsserts(ast.NodeTransformer):
    def visit_Assert(self, node):
        return ast.Pass()
get_ipython().ast_transformers.append(NoAsserts())
'''
FAKE_JUDGE = '''
import course.grading
real_ask = course.grading._ask
course.grading._ask = lambda path, request: {"ok": True} if request.get("op") == "check" else real_ask(path, request)
'''
ASK_JUDGE_FROM_A_STUDENT_CELL = '''
import json, os, socket
def ask(request):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(os.environ["COURSE_REFERENCE_JUDGE"])
        s.sendall(json.dumps(request).encode() + b"\\n")
        return s.makefile().readline()
for key in ("momentum_sgd/weights after 6 steps", "train_step/losses of 5 steps"):
    print("ORACLE", ask({"op": "check", "lab": "01_single_gpu", "key": key, "value": {"number": 0}}))
print("ORACLE", ask({"op": "seed", "lab": "01_single_gpu"}))
'''
FLOOD_THE_JUDGE = '''
import os, socket
with socket.socket(socket.AF_UNIX) as s:
    s.connect(os.environ["COURSE_REFERENCE_JUDGE"])
    try:
        for _ in range(200):
            s.sendall(b"x" * (1 << 20))
    except OSError as e:
        print("the judge hung up:", type(e).__name__)
'''

# Issue 33's round: what a submission may send the judge, and what it may write into its own verdict.
FLOOD_WITH_KEYS = '''
import json, os, socket
for _ in range(40):     # refused (no test cell runs), each with a key of 4 MB: the judge's log stays small
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(os.environ["COURSE_REFERENCE_JUDGE"])
        s.sendall(json.dumps({"lab": "01_single_gpu", "op": "check", "key": "k" * (4 << 20),
                              "value": {"number": 0}}).encode() + b"\\n")
        s.makefile().readline()
'''
FORGED_VERDICT = "raise ValueError('no; graded: 19 of 19 points (instructor override)')"
# Python runs it; the scan's recursive walk cannot (a RecursionError in the grader once stopped the class).
# Nested for real: a flat chain as long ("+".join(["1"] * 900)) is read in a loop.
TOO_DEEP_TO_SCAN = "depth = " + "-" * 900 + "1"
WITHHELD = "withheld pending the instructor's review"
# 0.5 % more than the true count, as bf16: inside bf16's own tolerance, but a count is judged exactly.
STEP_FLOPS_IN_BF16 = ("return 3 * forward", "return torch.tensor(3 * forward * 1.005, dtype=torch.bfloat16)")
FORGER = "forges_its_verdict"


def _class() -> dict:
    """student -> (notebook, expected score, words the verdict must have)."""
    return {
        HONEST: (solved(LAB), FULL, [f"graded: {FULL:g} of {FULL:g} points"]),
        # Each of these has a line before every test cell that can rewrite a check: every point is withheld.
        "stub_without_asserts": (_with_cells(STRIP_ASSERTS, edits={"momentum_sgd": [STUB]}), 0,
                                 ["test_momentum_sgd", "AST transformer", WITHHELD]),
        "stub_with_a_fake_judge": (_with_cells(STRIP_ASSERTS, FAKE_JUDGE, edits={"momentum_sgd": [STUB]}),
                                   0, ["never reached the grader", "course.grading"]),
        "stub_with_checks_rebound": (_with_cells(
            "check.assert_close = lambda *args, **kwargs: None\n"
            "course.check.assert_close = lambda *args, **kwargs: None", edits={"momentum_sgd": [STUB]}),
            0, ["test_momentum_sgd", "assert_close", WITHHELD]),
        "asks_the_judge": (_with_cells(ASK_JUDGE_FROM_A_STUDENT_CELL), 0, [WITHHELD, "the judge"]),
        FORGER: (_with_cells(TOO_DEEP_TO_SCAN, STRIP_ASSERTS, FLOOD_WITH_KEYS, FORGED_VERDICT,
                             edits={"step_flops": [STEP_FLOPS_IN_BF16]}),
                 0, ["test_step_flops", "step_flops/", "(a count: exactly)", "AST transformer", "nested too deeply",
                  "raised ValueError: «no; graded: 19 of 19 points (instructor override)»"]),
        "floods_the_judge": (_with_cells(FLOOD_THE_JUDGE), 0, [WITHHELD, "the judge"]),
        # nbgrader trusts a cell's metadata, and failed on the whole notebook for these two.
        "claims_a_test_cell": (_claims_a_test_cell(), FULL,
                               [f"graded: {FULL:g}", "(grade_id «bogus») that is no cell of the lab"]),
        "answer_claims_points": (_answer_claims_points(), FULL,
                                 [f"graded: {FULL:g}", "cell momentum_sgd's grading metadata was changed"]),
    }


def _claims_a_test_cell():
    nb = _with_cells("print('worth 100 points')")
    claim = next(c for c in nb.cells if c.source == "print('worth 100 points')")
    claim.metadata["nbgrader"] = {"grade": True, "grade_id": "bogus", "points": 100, "locked": False,
                                        "solution": False, "schema_version": 3, "task": False}
    return nb


def _answer_claims_points():
    nb = solved(LAB)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "momentum_sgd":
            cell.metadata["nbgrader"].update(grade=True, points=50)
    return nb


def lab1_students(tmp, work) -> dict:
    """This module's students in the shared lab 1 class (helpers.lab1_class), beside its honest one."""
    return {student: nb for student, (nb, _, _) in _class().items() if student != HONEST}


@pytest.fixture(scope="module")
def graded(lab1_class):
    return {**lab1_class, "students": _class()}


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("student", list(_class()))
def test_each_attack_gets_what_its_code_earns(graded, student):
    _, expected, words = graded["students"][student]
    row = graded["csv"][student]
    assert row[f"{LAB} graded"] == "yes", row
    assert float(row[f"{LAB} score"]) == expected, f"{student} scored {row[f'{LAB} score']}: {row[f'{LAB} verdict']}"
    for w in words:
        assert w in row[f"{LAB} verdict"], f"{student}: {w!r} not in the verdict {row[f'{LAB} verdict']!r}"


def _numbers(value) -> list[float]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return [value] if isinstance(value, float) else []


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_kernel_never_sees_a_reference_value(graded):
    """The run's reference values appear in no student's graded notebook, and the oracle was refused."""
    values = grading.read(graded["work"] / "judge" / f"{LAB}.json")
    secrets = {repr(x)[:10] for key in ("momentum_sgd/weights after 6 steps", "train_step/losses of 5 steps")
               for x in _numbers(grading.encode(values[key])) if abs(x) > 1e-3}
    assert len(secrets) > 10
    for student in graded["students"]:
        notebook = (graded["work"] / "autograded" / student / LAB / f"{LAB}.ipynb").read_text(encoding="utf-8")
        seen = [s for s in secrets if s in notebook]
        assert not seen, f"{student}'s kernel printed reference values {seen[:3]}"
    oracle = (graded["work"] / "autograded" / "asks_the_judge" / LAB / f"{LAB}.ipynb").read_text(encoding="utf-8")
    assert oracle.count("ORACLE") >= 3 and oracle.count("it answers only while a graded test cell runs") == 3, \
        "a student's cell got answers from the judge"


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_feedback_of_a_cheat_says_what_the_judge_found(graded):
    page = html.unescape((graded["work"] / "feedback" / "stub_with_checks_rebound" / LAB / f"{LAB}.html")
                         .read_text(encoding="utf-8"))
    assert "the grader's check" in page and "largest difference" in page, \
        "the feedback names how far the stub was off, for the instructor and the student"


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_judges_seed_is_the_runs_own(graded):
    """Drawn for the run: not the stored values' seed 0, so stored answers are worth nothing."""
    recorded = grading.read(graded["work"] / "judge" / f"{LAB}.json")
    stored = grading.read(REPO / "grader" / "reference" / f"{LAB}.json")
    key = "momentum_sgd/weights after 6 steps"
    assert not all(a.shape == b.shape and bool((a == b).all()) for a, b in zip(recorded[key], stored[key]))


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_forged_verdict_stays_the_students_words_and_no_file_grows_past_its_cap(graded):
    """The forger's exception reads "...; graded: 19 of 19 points": in the CSV and on its page it stays
    between the marks that say it is the submission's; its flood of the judge left no large file."""
    said = graded["csv"][FORGER][f"{LAB} verdict"]
    assert said.startswith(f"graded: 0 of {FULL:g} points"), said
    assert "«no; graded: 19 of 19 points (instructor override)»" in said, said
    assert "19 of 19" not in re.sub("«[^»]*»", "", said), f"the student's words outside their marks: {said}"
    page = html.unescape((graded["work"] / "feedback" / FORGER / LAB / f"{LAB}.html").read_text(encoding="utf-8"))
    assert "«no; graded: 19 of 19 points (instructor override)»" in page
    largest = max((f.stat().st_size, str(f)) for f in graded["work"].rglob("*") if f.is_file())
    assert largest[0] < 8 << 20, f"{largest[1]} is {largest[0] >> 20} MB"


# --- lab 2, graded in the round-trip class (helpers/round_trips.py) ------------------------------------------
LAB_2 = "02_data_parallel"
POINTS_2 = graded_cells(read_notebook(REPO / "solutions" / LAB_2 / f"{LAB_2}.ipynb"))
# Rank 0 is right for free in a broadcast: forward its checks alone, and switch the kernel's own comparisons
# off, each through a name the lab's cells do not bind.
FORWARD_RANK_0_ONLY = '''
_c = check
_c.assert_close = lambda *args, **kwargs: None
R = REFERENCE
_real_check = R.check
def _rank_0_of_the_broadcast(key, value, *, rank=None, **kw):
    if rank in (None, 0) or not key.startswith("broadcast/"):
        _real_check(key, value, rank=rank, **kw)
R.check = _rank_0_of_the_broadcast
'''
# torch's own all-reduce, called where the course's recorder does not look, and the records a ring would
# have left written into the recorder by hand: right sums, a ring's messages on paper.
# The records a ring would have left, written into the recorder by hand (each forger below has one).
RING_RECORDS_BY_HAND = '''
def _ring_records(active, tensor, send):
    n, me = dist.get_world_size(), dist.get_rank()
    chunks = tensor.view(-1).tensor_split(n)
    for step in range(2 * (n - 1)):
        for op, peer in ((send, (me + 1) % n), ("recv", (me - 1) % n)):
            record = active._record(op, {"tensor": chunks[(me - step) % n],
                                         ("dst" if op == send else "src"): peer})
            active._begin(record)
            active._end(record)
'''
RING_BY_HAND = RING_RECORDS_BY_HAND + '''
def ring_all_reduce(tensor):
    import torch.distributed.distributed_c10d as c10d
    from course import recorder
    n, me = dist.get_world_size(), dist.get_rank()
    c10d.all_reduce(tensor)
    active = recorder.active()
    if active is not None and n > 1:
        _ring_records(active, tensor, "send")
    return tensor
'''


# A broadcast that sends the right bytes into copies: every rank keeps its own weights, which only the
# values of ranks 1 and 2 show (the forgers below forward rank 0's in their place).
BROADCAST_INTO_COPIES = """
@torch.no_grad()
def broadcast_parameters(model):
    for tensor in model.state_dict().values():
        dist.broadcast(tensor.clone(), src=0)
"""


def _attacking_lab_2(answers: dict[str, str]):
    """Lab 2 solved but for `answers`, less its demonstrations (without_demonstrations): each attack below is in
    its own cells and caught in test cells, and a lab 2 without its demonstrations is graded in about half the
    time. The honest student keeps them all, so the released cells are graded, and pass the scan, in this class."""
    return without_demonstrations(solved(LAB_2, answers=answers))


def _forges_lab_2():
    nb = _attacking_lab_2({"broadcast_parameters": BROADCAST_INTO_COPIES, "ring_all_reduce": RING_BY_HAND})
    setup = next(i for i, c in enumerate(nb.cells) if "REFERENCE = course.grading.Reference" in c.source)
    nb.cells.insert(setup + 1, new_code_cell(FORWARD_RANK_0_ONLY))
    return nb


@pytest.mark.timeout(round_trips.TEST_TIMEOUT_S)
def test_a_kernel_that_sends_rank_0_alone_and_forges_a_ring_earns_nothing_unflagged(round_trip_class):
    """The broadcast received into copies, rank 0's checks forwarded alone: the judge expects every rank's, as the
    solution's recording made them, and gives the cell nothing. The ring made of torch's all-reduce through
    distributed_c10d, with hand-written records beside it, is recorded where it reaches the process group:
    it loses its exercise too, and each line is flagged."""
    scores = round_trips.scores(round_trip_class, LAB_2, ["forges_lab2"])
    # Its cell rebinds check and REFERENCE before every test cell: each one's points are withheld pending review.
    assert scores == {"forges_lab2": 0}
    said = json.loads((round_trip_class["work"] / "status.json").read_text())["forges_lab2"][LAB_2]["verdict"]
    text = " | ".join(said)
    assert ("test cell test_broadcast_parameters gets no points: its hidden check 'broadcast/state of every rank "
            "after the broadcast, 3 ranks' reached the grader for rank 0, the solution's for ranks 0, 1, 2") \
        in text, said
    assert "test_ring_all_reduce" in text and "ring_all_reduce must be built from send/recv/isend/irecv alone" \
        in text and "all_reduce" in text, said
    assert "points withheld pending the instructor's review: cell " in said[1] \
        and "«_c = check» line 2 rebinds course.check.assert_close" in said[1], said
    for words in ("rebinds course.check.assert_close", "rebinds REFERENCE.check", "around the course's recorder",
                  "touches course.recorder"):
        assert words in text, f"{words!r} not flagged: {said}"


round_trips.enrol(test_a_kernel_that_sends_rank_0_alone_and_forges_a_ring_earns_nothing_unflagged, LAB_2,
                  {"forges_lab2": _forges_lab_2})

# The red team's all-reduces by a library collective: one all_gather_object and a sum (19 of 19 before the
# recorder wrapped the process group's own methods), and torch's all-reduce reached by following the
# recorder's wrapper to what it wraps (`inspect.unwrap`, which reads `__wrapped__`).
GATHERED = '''
def {name}(tensor):
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, tensor)
    tensor.copy_(sum(parts))
    return tensor
'''
UNWRAPPED = '''
def ring_all_reduce(tensor):
    import inspect
    inspect.unwrap(dist.all_reduce)(tensor)
    return tensor
'''
WRAPPED_ATTRIBUTE = '''
def naive_all_reduce(tensor):
    dist.all_reduce.__wrapped__(tensor)
    return tensor
'''
LIBRARY_ALL_REDUCES = {
    "gathers_lab2": {name: GATHERED.format(name=name) for name in ("naive_all_reduce", "ring_all_reduce")},
    "unwraps_lab2": {"ring_all_reduce": UNWRAPPED, "naive_all_reduce": WRAPPED_ATTRIBUTE},
}


@pytest.mark.timeout(round_trips.TEST_TIMEOUT_S)
def test_an_all_reduce_by_a_library_collective_loses_its_exercises(round_trip_class):
    """Each spelling reaches gloo through the process group's own method, where the recorder records it: the
    kernel's messages_only names the collective, and the judge's check of the collectives called differs
    from the solution's. `__wrapped__` itself is no longer there to follow."""
    students = sorted(LIBRARY_ALL_REDUCES)
    scores = round_trips.scores(round_trip_class, LAB_2, students)
    status = json.loads((round_trip_class["work"] / "status.json").read_text())
    verdicts = {student: status[student][LAB_2]["verdict"] for student in students}
    earned = sum(POINTS_2.values()) - POINTS_2["test_naive_all_reduce"] - POINTS_2["test_ring_all_reduce"]
    assert scores["gathers_lab2"] == earned, verdicts
    # Following `__wrapped__` is flagged as well: the cells after it may be held for review too.
    assert scores["unwraps_lab2"] <= earned, verdicts
    gathered = " | ".join(verdicts["gathers_lab2"])
    for name in ("naive_all_reduce", "ring_all_reduce"):
        assert f"{name} must be built from send/recv/isend/irecv alone" in gathered, gathered
    assert "all_gather" in gathered, gathered
    unwrapped = " | ".join(verdicts["unwraps_lab2"])
    assert "ring_all_reduce must be built from send/recv/isend/irecv alone" in unwrapped, unwrapped
    assert "all_reduce" in unwrapped and "__wrapped__" in unwrapped, unwrapped


round_trips.enrol(test_an_all_reduce_by_a_library_collective_loses_its_exercises, LAB_2,
                  {student: (lambda answers=answers: _attacking_lab_2(answers))
                   for student, answers in LIBRARY_ALL_REDUCES.items()})


# Issue 54: the broadcast left as `pass`, the kernel's checks reached through a frame's globals (no name the
# scan followed): assert_close switched off, and REFERENCE.check wrapped to send rank 0's state again for
# ranks 1 and 2. The judge saw every rank, as often as the solution's checks, every value right: 19 of 19.
THROUGH_A_FRAME = '''
import sys
_g = sys._getframe(0).f_globals
_g["check"].assert_close = lambda *args, **kwargs: None
_real_check, _rank_0 = _g["REFERENCE"].check, {}
def _rank_0_for_every_rank(key, value, *, rank=None, **kw):
    if key.startswith("broadcast/") and rank is not None:
        value = _rank_0.setdefault(key, value) if rank == 0 else _rank_0.get(key, value)
    _real_check(key, value, rank=rank, **kw)
_g["REFERENCE"].check = _rank_0_for_every_rank

@torch.no_grad()
def broadcast_parameters(model):
    for tensor in model.state_dict().values():
        dist.broadcast(tensor.clone(), src=0)
'''
THROUGH_A_FRAME_STUDENT, HONEST_2 = "frames_lab2", "honest_lab2"


@pytest.mark.timeout(round_trips.TEST_TIMEOUT_S)
def test_a_check_rewritten_through_a_frame_withholds_the_points_after_it(round_trip_class):
    """The scan flags the frame (a line outside the allowlist that can rewrite a check), so the broadcast's
    test cell and every one after it score 0 pending the instructor's review, and the verdict says which
    line and how the points come back. An honest student in the same class keeps every point, unflagged."""
    students = [THROUGH_A_FRAME_STUDENT, HONEST_2]
    scores = round_trips.scores(round_trip_class, LAB_2, students)
    tests = list(POINTS_2)
    after = tests[tests.index("test_broadcast_parameters"):]
    assert scores == {THROUGH_A_FRAME_STUDENT: sum(POINTS_2[t] for t in tests if t not in after),
                      HONEST_2: sum(POINTS_2.values())}, scores
    status = json.loads((round_trip_class["work"] / "status.json").read_text())
    said = status[THROUGH_A_FRAME_STUDENT][LAB_2]["verdict"]
    withheld = sum(POINTS_2[t] for t in after)
    assert said[1].startswith(f"{withheld:g} points withheld pending the instructor's review: cell "
                              "broadcast_parameters line "), said
    assert "reaches a frame (" in said[1].split(";")[0], said
    assert "empty their score boxes in formgrader's Manual Grading" in said[1], said
    assert any("rebinds globals()[...].check" in line for line in said), said
    row = round_trip_class["csv"][THROUGH_A_FRAME_STUDENT]
    assert all(float(row[f"{LAB_2} {t}"]) == 0 for t in after), round_trips.lab_columns(row, LAB_2)
    honest = " | ".join(status[HONEST_2][LAB_2]["verdict"])
    assert "flagged" not in honest and "withheld" not in honest, honest


round_trips.enrol(test_a_check_rewritten_through_a_frame_withholds_the_points_after_it, LAB_2,
                  {THROUGH_A_FRAME_STUDENT: lambda: _attacking_lab_2({"broadcast_parameters": THROUGH_A_FRAME}),
                   HONEST_2: lambda: solved(LAB_2)})


# --- the records checked against the wire (grader.judge.wire) ---------------------------------------------
# A ring made of one all_gather_object and a sum: the gather's records taken out of the recorder, a ring's
# messages written in. The records say "ring", and every kernel-side check of them passes; the jail's
# loopback, read from outside, carries (N-1) pickled tensors a rank where a ring carries 2(N-1)/N of one.
RING_BY_GATHER = RING_RECORDS_BY_HAND + '''
def ring_all_reduce(tensor):
    from course import recorder
    n, me = dist.get_world_size(), dist.get_rank()
    active = recorder.active()
    kept = len(active.log) if active is not None else 0
    gathered = [None] * n
    dist.all_gather_object(gathered, tensor.cpu())
    tensor.copy_(sum(gathered))
    if active is not None:
        del active.log[kept:]
        if n > 1:
            _ring_records(active, tensor, "isend")
    return tensor
'''


# The same gather over sockets of the ranks' own (their ports exchanged through the process group's store, a
# file): no record at all for the tensors they carry.
RING_BY_SOCKETS = RING_RECORDS_BY_HAND + '''
_CALLS = [0]

def ring_all_reduce(tensor):
    import socket, struct, threading
    from course import recorder
    n, me = dist.get_world_size(), dist.get_rank()
    if n == 1:
        return tensor
    flat = tensor.detach().reshape(-1).contiguous().cpu()
    mine = flat.numpy().tobytes()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(n)
    store = dist.distributed_c10d._get_default_store()
    _CALLS[0] += 1
    store.set(f"sock/{_CALLS[0]}/{me}", str(server.getsockname()[1]))
    ports = [int(store.get(f"sock/{_CALLS[0]}/{r}")) for r in range(n)]
    got = {me: mine}

    def receive():
        for _ in range(n - 1):
            peer, _ = server.accept()
            with peer:
                head = b""
                while len(head) < 12:
                    head += peer.recv(12 - len(head))
                rank, size = struct.unpack("!iQ", head)
                body = b""
                while len(body) < size:
                    body += peer.recv(size - len(body))
                got[rank] = body

    reader = threading.Thread(target=receive)
    reader.start()
    for r in range(n):
        if r != me:
            with socket.create_connection(("127.0.0.1", ports[r])) as out:
                out.sendall(struct.pack("!iQ", me, len(mine)) + mine)
    reader.join()
    server.close()
    total = sum(torch.frombuffer(bytearray(got[r]), dtype=flat.dtype) for r in range(n))
    tensor.copy_(total.reshape(tensor.shape))
    active = recorder.active()
    if active is not None:
        _ring_records(active, tensor, "isend")
    return tensor
'''
WIRE_CHEATS = {"gathers_behind_records_lab2": RING_BY_GATHER, "sockets_behind_records_lab2": RING_BY_SOCKETS}


@pytest.mark.timeout(round_trips.TEST_TIMEOUT_S)
def test_a_gather_behind_a_rings_forged_records_loses_the_exercise_to_the_wire(round_trip_class):
    """Whatever the scan says of them (its lines withhold the points of the cells after them), the grader's own
    count of what the ranks wrote to each other exceeds what their records account for: the exercise gets
    nothing, and the verdict says why in those words."""
    scores = round_trips.scores(round_trip_class, LAB_2, sorted(WIRE_CHEATS))
    status = json.loads((round_trip_class["work"] / "status.json").read_text())
    for student in WIRE_CHEATS:
        assert scores[student] <= sum(POINTS_2.values()) - POINTS_2["test_ring_all_reduce"], scores
        assert float(round_trip_class["csv"][student][f"{LAB_2} test_ring_all_reduce"]) == 0
        said = " | ".join(status[student][LAB_2]["verdict"])
        assert re.search(r"test cell test_ring_all_reduce gets no points: its ranks wrote [\d.]+ MB to each other, "
                         r"of which their records account for [\d.]+ MB \(allowance [\d.]+ MB\): not all of its "
                         r"work went through recorded calls", said), (student, said)


round_trips.enrol(test_a_gather_behind_a_rings_forged_records_loses_the_exercise_to_the_wire, LAB_2,
                  {student: (lambda answer=answer: _attacking_lab_2({"ring_all_reduce": answer}))
                   for student, answer in WIRE_CHEATS.items()})
