"""Covers: course.expert_overlap.

Expert parallelism's step on the per-rank timeline, blocking and overlapped, on 2 real ranks: the blocking
schedule's all-to-alls and experts alternate and never overlap; the overlapped one issues micro-batch i+1's
all-to-all before micro-batch i's experts compute (checked on the order of the recorded events, not on time);
both deliver the same rows (the experts' weight gradients match one process's); the summary and the figure
say what they claim; and sizes that cannot make the step are refused before any rank starts. Never speed."""
from __future__ import annotations

import statistics

import pytest
import torch

from course import expert_overlap, moe

RANKS, MICRO_BATCHES, REPEATS = 2, 3, 2
SIZES = dict(tokens=8, hidden=8, ffn=12, experts=4, top_k=2)


@pytest.fixture(scope="module")
def results():
    return expert_overlap.run(RANKS, micro_batches=MICRO_BATCHES, repeats=REPEATS, **SIZES)


def expected_events(overlapped: bool, m: int = MICRO_BATCHES) -> list[tuple]:
    """The schedule written out by hand: per pass, each micro-batch's first all-to-all, its experts, its second."""
    events = []
    for (first, second), span, order in ((expert_overlap.FORWARD, "experts forward", list(range(m))),
                                         (expert_overlap.BACKWARD, "experts backward", list(range(m))[::-1])):
        if not overlapped:
            for i in order:
                events += [("issue", first, i), ("wait", first, i), ("compute", span, i),
                           ("issue", second, i), ("wait", second, i)]
            continue
        events.append(("issue", first, order[0]))
        for position, i in enumerate(order):
            events.append(("wait", first, i))
            if position + 1 < len(order):
                events.append(("issue", first, order[position + 1]))
            events += [("compute", span, i), ("issue", second, i)]
        events += [("wait", second, i) for i in order]
    return events


def issues_the_next_before_computing(events) -> bool:
    """Each compute but a pass's last comes after the issue of the next micro-batch's first all-to-all and
    before its wait: the next dispatch is in flight while this micro-batch's experts compute."""
    for name, (first, _) in (("experts forward", expert_overlap.FORWARD),
                             ("experts backward", expert_overlap.BACKWARD)):
        computes = [(n, e[2]) for n, e in enumerate(events) if e[:2] == ("compute", name)]
        for (at, _), (_, following) in zip(computes, computes[1:]):
            issued, waited = events.index(("issue", first, following)), events.index(("wait", first, following))
            if not issued < at < waited:
                return False
    return True


@pytest.mark.timeout(120)
def test_each_schedule_makes_its_events_in_the_order_it_claims(results):
    for rank in results.ranks:
        assert results[rank]["events"]["blocking"] == expected_events(False)
        assert results[rank]["events"]["overlapped"] == expected_events(True)
        assert issues_the_next_before_computing(results[rank]["events"]["overlapped"])
        # The same check fails on the blocking schedule: it would catch an overlap that waits first.
        assert not issues_the_next_before_computing(results[rank]["events"]["blocking"])


@pytest.mark.timeout(120)
def test_blocking_intervals_alternate_and_never_overlap(results):
    for rank in results.ranks:
        intervals = expert_overlap.in_window(results, rank, "blocking")
        assert [kind for kind, *_ in intervals] == ["all-to-all", "compute", "all-to-all"] * 2 * MICRO_BATCHES
        for (_, _, _, end), (_, _, start, _) in zip(intervals, intervals[1:]):
            assert end <= start, (rank, intervals)
        spans = [name for kind, name, *_ in intervals if kind == "compute"]
        assert spans == ([f"experts forward {i}" for i in range(MICRO_BATCHES)]
                         + [f"experts backward {i}" for i in reversed(range(MICRO_BATCHES))])


@pytest.mark.timeout(120)
def test_overlapped_timeline_holds_the_calls_in_the_order_the_events_say(results):
    for rank in results.ranks:
        intervals = expert_overlap.in_window(results, rank, "overlapped")
        made = ["all-to-all" if what == "issue" else "compute" for what, *_ in results[rank]["events"]["overlapped"]
                if what != "wait"]
        assert [kind for kind, *_ in intervals] == made
        first_compute = next(n for n, (kind, *_) in enumerate(intervals) if kind == "compute")
        assert first_compute == 2          # two dispatches issued before the first experts run
        window = results[rank]["shown"]["overlapped"]
        assert all(window[0] <= start <= end <= window[1] for _, _, start, end in intervals)


@pytest.mark.timeout(120)
def test_both_schedules_deliver_the_rows_one_process_would(results):
    """Each rank's experts' weight gradients, against one process that gathers the rows by hand."""
    w1, w2 = moe.expert_weights(SIZES["experts"], SIZES["hidden"], SIZES["ffn"], seed=0)
    inputs = [expert_overlap.micro_batches_of(r, MICRO_BATCHES, 0, **SIZES) for r in range(RANKS)]
    for rank in results.ranks:
        mine = moe.experts_of(rank, SIZES["experts"], RANKS)
        held = [w[mine[0]:mine[-1] + 1].clone().requires_grad_() for w in (w1, w2)]
        for i in range(MICRO_BATCHES):   # block `rank` of every rank's rows, in rank order
            rows = torch.cat([x[i].tensor_split(RANKS)[rank] for x, _ in inputs])
            gradient = torch.cat([g[i].tensor_split(RANKS)[rank] for _, g in inputs])
            out = torch.cat([moe.expert_mlp(share, held[0][e], held[1][e])
                             for e, share in enumerate(rows.tensor_split(len(mine)))])
            out.backward(gradient)
        for schedule in expert_overlap.SCHEDULES:
            for found, want in zip(results[rank]["weight_gradients"][schedule], held):
                torch.testing.assert_close(found, want.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
def test_summary_and_plot_say_what_they_claim(results, ax):
    figures = expert_overlap.summary(results)
    assert figures["rounds"] == REPEATS
    per_round = {s: [max(results[r]["seconds"][s][i] for r in results.ranks) for i in range(REPEATS)]
                 for s in expert_overlap.SCHEDULES}
    assert figures["blocking"] == pytest.approx(statistics.median(per_round["blocking"]))
    assert figures["overlapped"] == pytest.approx(statistics.median(per_round["overlapped"]))
    assert figures["hidden"] == pytest.approx(sum(b - o for b, o in zip(per_round["blocking"],
                                                                        per_round["overlapped"])) / REPEATS)
    assert figures["waited"] > 0
    second = ax.figure.add_subplot(2, 1, 2)
    expert_overlap.plot([ax, second], results)
    assert ax.get_title(loc="left").startswith("blocking: ") and second.get_title(loc="left").startswith("overlapped")
    widths = [a.get_xlim()[1] - a.get_xlim()[0] for a in (ax, second)]
    assert widths[0] == pytest.approx(widths[1]) and widths[0] > 0
    assert second.get_legend() is None and ax.get_legend() is not None


@pytest.mark.parametrize("sizes, words", [
    (dict(micro_batches=1), "at least 2"),
    (dict(tokens=3, top_k=1), "multiple of 2"),
    (dict(experts=1, top_k=1), "experts >= 2"),
    (dict(top_k=5), "top_k <= experts"),
    (dict(repeats=0), "repeats must be a positive whole number"),
    (dict(hidden=2.5), "hidden must be a positive whole number"),
])
def test_sizes_that_cannot_make_the_step_are_refused_before_any_rank_starts(sizes, words):
    with pytest.raises(ValueError, match=words):
        expert_overlap.run(RANKS, **{**SIZES, **sizes})


def test_an_unknown_size_is_named():
    with pytest.raises(TypeError, match="unknown sizes \\['batch'\\]"):
        expert_overlap.run(RANKS, batch=4)
