"""Covers: course.stragglers.

The planted stragglers of lab 10's exercise 5, run on real ranks: the drawn rank is slower in the drawn span by
its delay, the others wait for it inside their collectives, each variant communicates as it says, the training
is still one process's, and `began_apart` moves clocks without changing a duration. The diagnosis lab 10 asks
for (written here, not in the module: the module holds no answer) names the drawn rank and span on every
variant, on shifted clocks too, where the classic wrong ones do not.
"""
from __future__ import annotations

import math

import pytest
import torch

from course import stragglers, timeline
from course.stragglers import Straggler


def totals(spans) -> dict[int, dict[str, float]]:
    """{rank: {span name: seconds, summed over its occurrences}}."""
    found: dict[int, dict[str, float]] = {}
    for s in spans:
        found.setdefault(s.rank, {}).setdefault(s.name, 0.0)
        found[s.rank][s.name] += s.end - s.start
    return found


def waited(results) -> dict[int, float]:
    """{rank: seconds it spent in blocking collectives}."""
    return {r: sum(c.end - c.start for c in results.comm.rank(r) if not c.async_op and c.end is not None)
            for r in results.ranks}


def diagnosis(results, *, rank_by="least waiting", span_by="against the others"):
    """Exercise 5's answer, and its classic wrong forms: the rank by the least time waited in collectives (or,
    wrong, the most; or, wrong, whose collectives start latest on its own clock), the span by its compute
    (waits cut out) against the median of the others' (or, wrong, the slow rank's longest)."""
    wait = waited(results)
    if rank_by == "least waiting":
        slow = min(wait, key=wait.get)
    elif rank_by == "most waiting":
        slow = max(wait, key=wait.get)
    else:  # "latest start": two processes' clocks compared
        slow = max(results.ranks, key=lambda r: sum(c.start for c in results.comm.rank(r)))
    work = totals(timeline.compute_only(results))
    others = [r for r in results.ranks if r != slow]

    def excess(name):
        theirs = sorted(work[r].get(name, 0.0) for r in others)
        return work[slow][name] - theirs[len(theirs) // 2]

    if span_by == "against the others":
        return {"rank": slow, "span": max(work[slow], key=excess)}
    return {"rank": slow, "span": max(work[slow], key=work[slow].get)}


CASES = [stragglers.draw(3, 2, "bucketed"), stragglers.draw(11, 4, "unbucketed"),
         stragglers.draw(5, 2, "synchronised")]


@pytest.fixture(scope="module")
def runs():
    """Each of CASES run once (a launch of 2 or 4 ranks, about 1.5 s each)."""
    return [(case, stragglers.run(case)) for case in CASES]


def test_a_draw_is_its_seed_s_and_reaches_every_rank_span_delay_and_variant():
    assert stragglers.draw(7, 4) == stragglers.draw(7, 4)
    drawn = [stragglers.draw(seed, 4) for seed in range(200)]
    assert {c.slow_rank for c in drawn} == {0, 1, 2, 3}
    assert {c.span for c in drawn} == set(stragglers.SLOW_SPANS)
    assert {c.delay for c in drawn} == set(stragglers.DELAYS)
    assert {c.variant for c in drawn} == set(stragglers.VARIANTS)
    assert len(set(drawn)) > 50
    assert stragglers.draw(7, 2, "unbucketed").variant == "unbucketed"
    # The delay is at least 0.15 s a step, and every rank's loading outlasts it (so "the longest span" is "data").
    assert min(stragglers.DELAYS) >= 0.15 and max(stragglers.DELAYS) < stragglers.LOADING


@pytest.mark.parametrize("arguments, words", [
    ((1, 0, "forward", 0.1, "bucketed"), "2 ranks or more"),
    ((4, 4, "forward", 0.1, "bucketed"), "slow_rank 4 is not a rank of 4"),
    ((2, 0, "data", 0.1, "bucketed"), "span 'data'"),
    ((2, 0, "forward", 0.1, "overlapped"), "variant 'overlapped'"),
    ((2, 0, "forward", 0.3, "bucketed"), "under the loading time"),
])
def test_a_straggler_that_cannot_be_run_is_refused_saying_why(arguments, words):
    with pytest.raises(ValueError, match=words):
        Straggler(*arguments)


def test_run_takes_a_straggler_and_fixed_removes_its_problems():
    with pytest.raises(TypeError, match="takes a Straggler"):
        stragglers.run({"world_size": 2})
    case = stragglers.draw(1, 4, "unbucketed")
    fixed = case.fixed()
    assert (fixed.delay, fixed.variant) == (0.0, "bucketed")
    assert (fixed.slow_rank, fixed.span, fixed.world_size, fixed.seed) == (case.slow_rank, case.span, 4, case.seed)


def test_the_slow_rank_is_slower_in_its_span_and_the_others_wait_for_it(runs):
    for case, results in runs:
        work, wait = totals(timeline.compute_only(results)), waited(results)
        lost = case.delay * case.steps
        for rank in results.ranks:
            if rank == case.slow_rank:
                continue
            assert work[case.slow_rank][case.span] - work[rank][case.span] > 0.5 * lost, (case, rank, work)
            assert wait[rank] - wait[case.slow_rank] > 0.5 * lost, (case, rank, wait)
            assert wait[rank] > 0.8 * lost, (case, rank, wait)   # the wait is in the collectives


def test_each_variant_communicates_as_it_says(runs):
    for case, results in runs:
        pieces = stragglers.MICRO_BATCHES if case.variant == "synchronised" else 1
        parameters = 2 * (len(stragglers.WIDTHS) - 1)
        for rank in results.ranks:
            names = [s.name for s in results.timeline.rank(rank)]
            assert names == (["data"] + ["forward", "backward"] * pieces + ["optimizer"]) * case.steps
            ops = [c.op for c in results.comm.rank(rank)]
            per_step = {"bucketed": 1, "unbucketed": parameters, "synchronised": pieces + 1}[case.variant]
            assert ops == ["all_reduce"] * (per_step * case.steps + 1), (case.variant, ops)   # + the last loss
            if case.variant == "unbucketed":    # from the hooks: inside the backward span
                backward = [s for s in results.timeline.rank(rank) if s.name == "backward"]
                calls = [c for c in results.comm.rank(rank)][:-1]
                assert all(any(s.start <= c.start and c.end <= s.end for s in backward) for c in calls)


def one_process_loss(case: Straggler) -> float:
    """The last step's loss of the same training in one process: each step's gradient the mean of the ranks'."""
    model = stragglers._model(case.seed)
    for step in range(case.steps):
        batches = [stragglers._batch(case, rank, step) for rank in range(case.world_size)]
        model.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(model(x), y) for x, y in batches) / case.world_size
        loss.backward()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= stragglers.LEARNING_RATE * parameter.grad
    return loss.item()


def test_the_training_is_one_process_s_whatever_the_variant(runs):
    for case, results in runs:
        want = one_process_loss(case)
        for rank in results.ranks:
            assert math.isclose(results[rank]["loss"], want, rel_tol=1e-5), (case.variant, rank)
            assert len(results[rank]["seconds"]) == case.steps


def test_began_apart_moves_each_rank_s_clock_and_keeps_every_duration(runs):
    case, results = runs[0]
    apart = stragglers.began_apart(results, {1: 5.0, 0: -2.5})
    assert apart.ranks == results.ranks and apart[1] == results[1] and apart.world_size == results.world_size
    for before, after in zip(results.comm, apart.comm):
        moved = {0: -2.5, 1: 5.0}[before.rank]
        assert after.start == pytest.approx(before.start + moved) and after.end == pytest.approx(before.end + moved)
        assert (after.op, after.shape, after.rank) == (before.op, before.shape, before.rank)
    for before, after in zip(results.timeline, apart.timeline):
        assert after.end - after.start == pytest.approx(before.end - before.start)
    assert results.comm[0].start != apart.comm[0].start        # the original is untouched, a copy moved
    with pytest.raises(ValueError, match="no rank 7 in this run"):
        stragglers.began_apart(results, {7: 1.0})


def test_the_diagnosis_finds_each_drawn_straggler_where_its_classic_mistakes_do_not(runs):
    for case, results in runs:
        truth = {"rank": case.slow_rank, "span": case.span}
        views = [results] + [stragglers.began_apart(results, {rank: 5.0}) for rank in (0, case.world_size - 1)]
        assert all(diagnosis(view) == truth for view in views), case
        assert diagnosis(results, rank_by="most waiting")["rank"] != case.slow_rank
        assert any(diagnosis(view, rank_by="latest start")["rank"] != case.slow_rank for view in views)
        assert diagnosis(results, span_by="the slow rank's longest")["span"] == "data"
