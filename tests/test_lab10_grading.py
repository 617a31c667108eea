"""Covers: the fairness of lab 10.

Lab 10's tests grade fairly: each classic wrong diagnosis (the last collective reported instead of the first
mismatch, the ranks that merely waited counted with the one that took another branch, a checksum that misses
the buffers, a scale confused with noise, the slow rank found by comparing two processes' clocks) costs its own
exercise and no other, and a correct answer written differently from the reference gets every point.

As for labs 2 to 9: each submission runs as nbgrader scores it, minus the demonstrations. The exercises' tests
do not lean on each other: each runs its own broken programs (course.hangs, course.drift,
course.wrong_gradients, course.stragglers), drawn from the judge's seed.
"""
from __future__ import annotations

import pytest

from helpers.rules import NotARule  # noqa: F401 -- the rule table below
from helpers.submissions import CHECK_REBOUND, fairness_tests  # noqa: F401 -- a mistake behind a rebound check

LAB = "10_debugging"

pytestmark = [pytest.mark.grading, pytest.mark.lab(LAB)]

# Correct answers written differently from the reference's ({grade_id: the answer cell's source}); the planted
# mistakes ({name: ({grade_id: [(reference text, replacement)]}, the test cell that must fail)}); and each rule the
# exercises' texts state, beside the mistakes that break it ({grade_id: {quoted rule: mistake name(s) or
# NotARule("why")}}). Each helper fills its block.
DIFFERENT: dict[str, str] = {}
MISTAKES: dict[str, tuple] = {}
RULES: dict[str, dict] = {}

# >>> helper H1: exercises 1 and 2 (first_mismatch, average_gradients)
# Exercises 1 and 2 answered in other correct ways: the calls in a Counter over the sequence numbers some rank
# holds, sizes returned as lists; the count of rows all-reduced first in float64, the loss divided before the
# backward pass, one all-reduce per parameter.
DIFFERENT.update({
    "first_mismatch": '''
def first_mismatch(entries):
    import collections
    tables = {r: {e.seq: (e.op, tuple(tuple(s) for s in e.sizes)) for e in es} for r, es in entries.items()}
    firsts = [min(t) for t in tables.values() if t]
    if not firsts:
        return None
    for seq in sorted({s for t in tables.values() for s in t if s >= max(firsts)}):
        calls = [tables[r].get(seq) for r in sorted(tables)]
        if len(set(calls)) < 2:
            continue
        counts = collections.Counter(calls)
        top = max(counts.values())
        leaders = {c for c, n in counts.items() if n == top}
        call = next(tables[r].get(seq) for r in sorted(tables) if tables[r].get(seq) in leaders)
        if len(leaders) > 1:
            ranks = sorted(tables)
        else:
            ranks = sorted(r for r in tables if tables[r].get(seq) != call)
        op, sizes = call if call is not None else (None, None)
        return {"ranks": ranks, "op": op, "seq": seq,
                "sizes": None if sizes is None else [list(s) for s in sizes]}
    return None
''',
    "average_gradients": '''
def average_gradients(model, inputs, targets):
    count = torch.tensor([len(inputs)], dtype=torch.float64)
    dist.all_reduce(count)
    loss = ((model(inputs) - targets) ** 2).sum() / (count.item() * targets.shape[1])
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
''',
})

MISTAKES.update({
    # Exercise 1: the first mismatch, not the last entries; a call is its op and sizes; the ranks that branched;
    # calls found by sequence number.
    "the last entries compared, not the first mismatch": (
        {"first_mismatch": [("for entry in found}", "for entry in found[-1:]}")]}, "test_first_mismatch"),
    "ops compared without sizes": (
        {"first_mismatch": [("(entry.op, tuple(map(tuple, entry.sizes)))", "(entry.op, ())")]},
        "test_first_mismatch"),
    "the ranks that waited reported": (
        {"first_mismatch": [("if call != usual]", "if call == usual]")]}, "test_first_mismatch"),
    "the lists compared by position": (
        {"first_mismatch": [("{entry.seq: (entry.op, tuple(map(tuple, entry.sizes))) for entry in found}",
                             "{i + 1: (entry.op, tuple(map(tuple, entry.sizes))) for i, entry in enumerate(found)}")]},
        "test_first_mismatch"),
    # Exercise 2: every rank the same calls; the mean over every rank's rows.
    "the empty rank returns before its all_reduce": (
        {"average_gradients": [('    loss = torch.nn.functional.mse_loss(model(inputs), targets, reduction="sum")',
                                "    if len(inputs) == 0:\n        return\n"
                                '    loss = torch.nn.functional.mse_loss(model(inputs), targets, reduction="sum")')]},
        "test_average_gradients"),
    "the ranks' means averaged": (
        {"average_gradients": [('reduction="sum")', 'reduction="sum") / max(targets.numel(), 1)'),
                               ("torch.tensor([float(targets.numel())])", "torch.tensor([1.0])")]},
        "test_average_gradients"),
    "the sums divided by the ranks, not the rows, the kernel's check rebound": (
        {"average_gradients": [("torch.tensor([float(targets.numel())])", "torch.tensor([1.0])"),
                               ("def average_gradients(", CHECK_REBOUND + "def average_gradients(")]},
        "test_average_gradients"),
})

RULES.update({
    "first_mismatch": {
        "the first sequence number at which the ranks' calls are not all the same":
            "the last entries compared, not the first mismatch",
        "A call is an entry's `op` and `sizes` together": "ops compared without sizes",
        "the ranks that branched, not the ones that waited for them": "the ranks that waited reported",
        "Find each call by its `seq`, never by its position in the list": "the lists compared by position",
    },
    "average_gradients": {
        "Every rank must make the same collective calls, whatever its number of rows":
            "the empty rank returns before its all_reduce",
        "the mean over every element of every rank's rows, a rank with 0 rows included": (
            "the ranks' means averaged", "the sums divided by the ranks, not the rows, the kernel's check rebound"),
    },
})
# <<< helper H1

# >>> helper H2: exercise 3 (replica_check)
# Another correct check: cosine weights for the checksum, the numbers gathered as lists of floats, the most
# common copy found by counting each rank's agreeing ranks.
DIFFERENT.update({
    "replica_check": '''
def replica_check(model, step):
    names, numbers = list(model.state_dict()), []
    for tensor in model.state_dict().values():
        x = tensor.detach().double().flatten().cpu()
        weights = torch.cos(torch.arange(x.numel(), dtype=torch.float64)) + 2.0
        numbers += [float((weights * x).sum()), float(x.abs().sum())]
    mine = torch.tensor(numbers, dtype=torch.float64)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    gathered = [g.tolist() for g in gathered]
    n = len(gathered)
    for k, name in enumerate(names):
        c, s = [g[2 * k] for g in gathered], [g[2 * k + 1] for g in gathered]
        close = [[abs(c[a] - c[b]) <= drift.RTOL * max(s[a], s[b]) + drift.ATOL for b in range(n)]
                 for a in range(n)]
        if all(all(row) for row in close):
            continue
        counts = [sum(row) for row in close]
        leaders = [a for a in range(n) if counts[a] == max(counts)]
        if all(close[leaders[0]][b] for b in leaders):
            return {"step": step, "tensor": name, "ranks": [b for b in range(n) if not close[leaders[0]][b]]}
        return {"step": step, "tensor": name, "ranks": list(range(n))}
    return None
''',
})
# Exercise 3: a checksum that misses the buffers; one blind to a re-ordering (behind a rebound check, so that only
# the judged drawn drifts catch it); exact comparison, which reports legal noise; rank 0's copy taken for the
# truth; the last tensor that differs.
MISTAKES.update({
    "the parameters checked, not the buffers": (
        {"replica_check": [("    state = model.state_dict()\n", "    state = dict(model.named_parameters())\n")]},
        "test_replica_check"),
    "a plain sum as the checksum, the kernel's check rebound": (
        {"replica_check": [
            ("numbers.append(torch.stack([(position * flat).sum(), flat.abs().sum()]))",
             "numbers.append(torch.stack([flat.sum(), flat.abs().sum()]))"),
            ("def replica_check(model, step):", CHECK_REBOUND + "def replica_check(model, step):")]},
        "test_replica_check"),
    "the checksums compared exactly": (
        {"replica_check": [("return abs(c_a - c_b) <= drift.RTOL * max(s_a, s_b) + drift.ATOL", "return c_a == c_b")]},
        "test_replica_check"),
    "each copy compared with rank 0's, not the most common": (
        {"replica_check": [("else [rank for rank in ranks if rank not in common[0]]",
                            "else [rank for rank in ranks if not agree(0, rank)]"),
                           ("differ = list(ranks) if len(common) > 1",
                            "differ = [rank for rank in ranks if not agree(0, rank)] if len(common) > 1")]},
        "test_replica_check"),
    "the last tensor that differs reported, not the first": (
        {"replica_check": [("    state = model.state_dict()\n", "    state, found = model.state_dict(), None\n"),
                           ('return {"step": step, "tensor": name, "ranks": differ}',
                            'found = {"step": step, "tensor": name, "ranks": differ}'),
                           ("\n    return None", "\n    return found")]},
        "test_replica_check"),
})
RULES.update({
    "replica_check": {
        "For each tensor t of `model.state_dict()` (parameters and buffers: a BatchNorm's running statistics and "
        "its count of batches are the model too)": "the parameters checked, not the buffers",
        "A plain sum is no checksum here: a drift that re-orders a tensor's values keeps its sum":
            "a plain sum as the checksum, the kernel's check rebound",
        "Not exact equality: the replicas compute the same update in separate processes":
            "the checksums compared exactly",
        "the ranks whose copy differs from the most common copy (the one most ranks agree with)":
            "each copy compared with rank 0's, not the most common",
        "where two copies tie for the most common (on 2 ranks, any drift), every rank":
            "each copy compared with rank 0's, not the most common",
        "the first name, in `model.state_dict()`'s order, whose copies differ":
            "the last tensor that differs reported, not the first",
    },
})
# <<< helper H2

# >>> helper H3: exercise 4 (locate)
# Written differently: the names' order built by hand, torch.linalg's norms, and the factor as the ratio of the norms
# with the dot's sign, then checked on every rank (the same number as the least-squares fit where it is a scale).
DIFFERENT.update({
    "locate": '''
def locate(gradients, reference, rtol):
    seen = []
    for rank in sorted(reference):
        seen += [name for name in reference[rank] if name not in seen]
    for name in seen:
        off = []
        for rank in sorted(reference):
            if name in reference[rank]:
                got, want = gradients[rank][name].to(torch.float64), reference[rank][name].to(torch.float64)
                if torch.linalg.vector_norm(got - want) > rtol * torch.linalg.vector_norm(want):
                    off.append(rank)
        if not off:
            continue
        pairs = [(gradients[r][name].to(torch.float64), reference[r][name].to(torch.float64)) for r in off]
        dot = sum(float(torch.sum(g * w)) for g, w in pairs)
        size = math.sqrt(sum(float(torch.linalg.vector_norm(g)) ** 2 for g, _ in pairs))
        base = math.sqrt(sum(float(torch.linalg.vector_norm(w)) ** 2 for _, w in pairs))
        factor = None
        if base > 0 and dot != 0:
            c = math.copysign(size / base, dot)
            norm = torch.linalg.vector_norm
            if all(norm(g - c * w) <= rtol * abs(c) * norm(w) for g, w in pairs):
                factor = float(f"{c:.4g}")
        return {"name": name, "ranks": off, "factor": factor}
    return None
''',
})
_LOCATE_FIT = "c = float(got @ want / (want @ want))            # least squares over every element of those ranks"
MISTAKES.update({
    "a ratio of norms called a factor, the kernel's check rebound": (
        {"locate": [(_LOCATE_FIT, "c = float(got.norm() / want.norm())"),
                    ("scaled = math.isfinite(c) and all(", "scaled = True or all("),
                    ("def locate(", CHECK_REBOUND + "def locate(")]},
        "test_locate"),
    "the first rank's first difference": (
        {"locate": [("names = list(dict.fromkeys(name for rank in sorted(reference) for name in reference[rank]))",
                     "names = [name for rank in sorted(reference) for name in reference[rank] if "
                     "(gradients[rank][name].double() - reference[rank][name].double()).norm() > "
                     "rtol * reference[rank][name].double().norm()][:1]")]},
        "test_locate"),
    "a factor from one element": (
        {"locate": [(_LOCATE_FIT, "c = float(got[0] / want[0])")]}, "test_locate"),
    "gradients compared exactly": (
        {"locate": [("if (got - want).norm() > rtol * want.norm()]", "if not torch.equal(got, want)]")]},
        "test_locate"),
})
RULES.update({
    "locate": {
        "the first parameter whose gradient differs on some rank, in the model's order":
            "the first rank's first difference",
        "never compare exactly": "gradients compared exactly",
        "not to one element": "a factor from one element",
        "Then check the fit: a ratio of norms is a number for any two tensors, a scale or not":
            "a ratio of norms called a factor, the kernel's check rebound",
    },
})
# <<< helper H3

# >>> helper H4: exercise 5 (straggler)
# Exercise 5 answered in another correct way: the slow rank as the one with the most compute (its spans, the
# waits cut out, summed), the span against the others' mean, the totals in one dict keyed by (rank, span).
DIFFERENT.update({
    "straggler": """
def straggler(results):
    import collections
    spans = collections.defaultdict(float)
    for s in course.timeline.compute_only(results):
        spans[s.rank, s.name] += s.end - s.start
    busy = {r: sum(v for (rank, _), v in spans.items() if rank == r) for r in results.ranks}
    slow = max(busy, key=busy.get)

    def gap(name):
        theirs = [spans[r, name] for r in results.ranks if r != slow]
        return spans[slow, name] - sum(theirs) / len(theirs)

    return {"rank": slow, "span": max(sorted({name for _, name in spans}), key=gap)}
""",
})
MISTAKES.update({
    # Exercise 5: the waiting ranks named; two ranks' clocks compared; a span not compared with the others'.
    "the rank that waits longest named, not the one the others wait for": (
        {"straggler": [("slow = min(waited, key=waited.get)", "slow = max(waited, key=waited.get)")]},
        "test_straggler"),
    "the slow rank as the one whose collectives start latest, two ranks' clocks compared": (
        {"straggler": [("slow = min(waited, key=waited.get)",
                        "slow = max(results.ranks, key=lambda rank: sum(c.start for c in results.comm.rank(rank)))")]},
        "test_straggler"),
    "the slow rank's longest span, not compared with the others' same span": (
        {"straggler": [('return {"rank": slow, "span": max(work[slow], key=longer_than_theirs)}',
                        'return {"rank": slow, "span": max(work[slow], key=work[slow].get)}')]},
        "test_straggler"),
})
RULES.update({
    "straggler": {
        "the rank the others wait for": "the rank that waits longest named, not the one the others wait for",
        "never a time of one rank with a time of another":
            "the slow rank as the one whose collectives start latest, two ranks' clocks compared",
        "the name of its span that takes longer than the other ranks' same span":
            "the slow rank's longest span, not compared with the others' same span",
        "a span is slow only against the other ranks' same span":
            "the slow rank's longest span, not compared with the others' same span",
    },
})
# <<< helper H4

(test_every_exercise_is_graded, test_every_rule_the_text_states_is_tested,
 test_correct_answers_get_every_point, test_each_mistake_costs_exactly_its_exercise,
 test_grading_round_trip) = fairness_tests(
    LAB, DIFFERENT, MISTAKES, RULES, round_trip=())
