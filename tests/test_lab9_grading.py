"""Covers: the fairness of lab 9.

Lab 9's tests grade fairly: each classic mistake of a composition (groups built in the wrong rank order, a
layout refused for the wrong reason or not at all, the logits gathered whole for the loss, the max not shared
over the vocabulary's ranks, every tensor rank with the same dropout mask, ...) costs its own exercise and no
other, and a correct answer written differently from the reference gets every point.

As for labs 2 to 8: each submission runs as nbgrader scores it, minus the demonstrations. The exercises' tests
do not lean on each other: exercise 1's is arithmetic in the kernel; the tests of exercises 2 to 6 build their
grids with `course.mesh.Grid.from_device_mesh` (or `dist.new_group` directly), not the student's `grid_groups`;
exercise 5's use the naive gathered cross-entropy of `course.gpt_stage`, not the student's exercise 2.
"""
from __future__ import annotations

import pytest

from helpers.rules import NotARule  # noqa: F401 -- the rule table below
from helpers.submissions import fairness_tests

LAB = "09_composition"

pytestmark = [pytest.mark.grading, pytest.mark.lab(LAB)]

# The same exercises, answered in other correct ways than the reference's: the groups from each rank's
# coordinates by divmod, the refusals in another order and wording.
DIFFERENT = {
    "grid_groups": '''
def grid_groups(world_size, sizes, config):
    pp, dp, cp, tp = (int(sizes.get(a, 1)) for a in ("pp", "dp", "cp", "tp"))
    if pp * dp * cp * tp != world_size:
        raise ValueError(f"pp·dp·cp·tp = {pp * dp * cp * tp} but there are {world_size} ranks")
    if config.layers % pp:
        raise ValueError(f"{config.layers} layers cannot be cut into {pp} stages")
    if config.heads % tp or config.vocab % tp:
        bad = config.heads if config.heads % tp else config.vocab
        raise ValueError(f"{bad} (heads or vocabulary) is not a multiple of tp={tp}")
    if config.sequence % (cp * tp):
        raise ValueError(f"sequence {config.sequence} is not a multiple of cp*tp={cp * tp}")
    strides = {"tp": 1, "cp": tp, "dp": tp * cp, "pp": tp * cp * dp}
    size = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}
    out = {}
    for axis in ("pp", "dp", "cp", "tp"):
        starts = [r for r in range(world_size) if (r // strides[axis]) % size[axis] == 0]
        out[axis] = [[s + k * strides[axis] for k in range(size[axis])] for s in starts]
    return out
''',
}

MISTAKES = {
    # Exercise 1: the rank order; each refusal; the numbers named.
    "the groups built with dp fastest, not tp": (
        {"grid_groups": [("ranks = torch.arange(world_size).reshape(shape)",
                          "ranks = torch.arange(world_size).reshape(shape[::-1]).permute(3, 2, 1, 0)")]},
        "test_grid_groups"),
    "the groups of each axis in the order the reshape gives, not sorted by first rank": (
        {"grid_groups": [("groups[axis] = sorted(row.tolist() for row in rows)",
                          "groups[axis] = [row.tolist() for row in rows][::-1]")]},
        "test_grid_groups"),
    "a world the layout does not fill accepted": (
        {"grid_groups": [("if math.prod(shape) != world_size:", "if math.prod(shape) > world_size:")]},
        "test_grid_groups"),
    "the refusal names the layout's ranks alone": (
        {"grid_groups": [("needs {math.prod(shape)} ranks, the world has {world_size}\")",
                          "needs {math.prod(shape)} ranks, not the world's\")")]},
        "test_grid_groups"),
    "the heads not checked against tp": (
        {"grid_groups": [('(("heads", config.heads, "tp", tp), ', '(')]}, "test_grid_groups"),
    "the vocabulary not checked against tp": (
        {"grid_groups": [('("vocabulary", config.vocab, "tp", tp),', '')]}, "test_grid_groups"),
    "the layers not checked against pp": (
        {"grid_groups": [('("layers", config.layers, "pp", pp),', '')]}, "test_grid_groups"),
    "the sequence checked against cp alone": (
        {"grid_groups": [('"cp · tp", cp * tp)', '"cp", cp)')]}, "test_grid_groups"),
}

# >>> helper G2: exercises 3, 5 and 6 (global_grad_norm, micro_batch_loss/reduce_gradients, checkpoint_state):
# add their DIFFERENT answers, MISTAKES and RULES entries below, in this block.
# <<< helper G2

# Each rule the exercises' texts state, beside the planted mistakes that break it (tests/helpers/rules.py).
RULES: dict[str, dict] = {
    "grid_groups": {
        "each group the sorted list of the global ranks that differ in that axis's coordinate alone, in the layout "
        "above (tp fastest, then cp, dp, pp)": "the groups built with dp fastest, not tp",
        "the groups sorted by their first rank":
            "the groups of each axis in the order the reshape gives, not sorted by first rank",
        "a world of `world_size` ranks that the product of the sizes does not equal":
            "a world the layout does not fill accepted",
        "with a `ValueError` whose message names both numbers that disagree":
            "the refusal names the layout's ranks alone",
        "`config.heads` that tp does not divide": "the heads not checked against tp",
        "`config.vocab` that tp does not divide": "the vocabulary not checked against tp",
        "`config.layers` that pp does not divide": "the layers not checked against pp",
        "`config.sequence` that cp · tp does not divide": "the sequence checked against cp alone",
    },
}

(test_every_exercise_is_graded, test_every_rule_the_text_states_is_tested,
 test_correct_answers_get_every_point, test_each_mistake_costs_exactly_its_exercise,
 test_grading_round_trip) = fairness_tests(
    LAB, DIFFERENT, MISTAKES, RULES, round_trip=())
