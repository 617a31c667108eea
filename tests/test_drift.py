"""Covers: course.drift.

Lab 10's drifted replicas: each planted drift moves what it says, at the step and on the rank it says, and
nothing else; the legal noise stays inside the lab's tolerance while being no bitwise copy; a check that
misses buffers, sums plainly or compares exactly is caught by the drift meant for it; the ranks stop
together, whatever one rank's check returns; and the drawn cases are the seed's.
"""
from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

import course
from course import drift


def truth(case: drift.Drift, world_size: int):
    """The report a correct check gives for the drift: computed here from the drift, not by the module."""
    every = list(range(world_size))
    if case.kind == "none":
        return None
    if case.kind == "initialisation":
        return {"step": 1, "tensor": case.tensor, "ranks": every}
    tensor = "norm.running_mean" if case.kind == "buffer" else case.tensor
    return {"step": case.step, "tensor": tensor, "ranks": [case.rank] if world_size > 2 else every}


def gathered_check(model, step, *, parameters_only=False, plain_sum=False, exact=False, rank_zero_alone=False):
    """A replica check written apart from the lab's answer: every value gathered, each rank compared with the
    most common under drift.RTOL/ATOL (or, for the planted mistakes, the parameters alone, each tensor's plain
    sum, or exact equality)."""
    state = dict(model.named_parameters()) if parameters_only else model.state_dict()
    world_size = dist.get_world_size()
    for name, tensor in state.items():
        mine = tensor.detach().double().reshape(-1)
        mine = mine.sum().reshape(1) if plain_sum else mine
        every = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(every, mine)

        def same(a, b, every=every):
            if exact:
                return torch.equal(every[a], every[b])
            scale = max(every[a].abs().sum().item(), every[b].abs().sum().item())
            return (every[a] - every[b]).abs().sum().item() <= drift.RTOL * scale + drift.ATOL

        groups = {tuple(q for q in range(world_size) if same(r, q)) for r in range(world_size)}
        largest = max(map(len, groups))
        if largest == world_size:
            continue
        tops = [group for group in groups if len(group) == largest]
        ranks = list(range(world_size)) if len(tops) > 1 else sorted(set(range(world_size)) - set(tops[0]))
        if rank_zero_alone and dist.get_rank() != 0:
            return None
        return {"step": step, "tensor": name, "ranks": ranks}
    return None


CASES = [drift.Drift("buffer", rank=2, step=3, noise_step=2),
         drift.Drift("permutation", rank=1, step=4, tensor="out.bias", noise_step=1),
         drift.Drift("permutation", rank=3, step=2, tensor="inp.weight"),
         drift.Drift("initialisation", tensor="out.weight", rank=1, noise_step=3),
         drift.Drift("none", rank=0, noise_step=2)]
CHECKS = {"right": {}, "parameters alone": {"parameters_only": True}, "plain sums": {"plain_sum": True},
          "exact": {"exact": True}}


def every_check_on_every_case(cases):
    """Runs on every rank: {check's name: [its report for each case]}."""
    return {name: drift.run(functools.partial(gathered_check, **kwargs), cases) for name, kwargs in CHECKS.items()}


@pytest.fixture(scope="module")
def four_ranks():
    return course.launch(every_check_on_every_case, 4, args=(CASES,))


def test_a_right_check_finds_each_drift_at_its_step_tensor_and_ranks(four_ranks):
    for rank in four_ranks.ranks:
        assert four_ranks[rank]["right"] == [truth(case, 4) for case in CASES], f"rank {rank}"


def test_a_buffer_drift_moves_buffers_alone(four_ranks):
    # The drift meant for a check of the parameters alone: it sees nothing (the BatchNorm's stats moved).
    assert four_ranks[0]["parameters alone"][0] is None
    assert four_ranks[0]["parameters alone"][1:4] == [truth(case, 4) for case in CASES[1:4]]


def test_a_permutation_keeps_each_plain_sum_within_tolerance(four_ranks):
    assert four_ranks[0]["plain sums"][1:3] == [None, None]
    assert four_ranks[0]["plain sums"][0] == truth(CASES[0], 4)


def test_the_noise_is_no_bitwise_copy_but_within_tolerance(four_ranks):
    # Exact comparison reports the noise's step (every parameter of that rank, inp.weight first); the right
    # check the drift after it, or nothing.
    found = four_ranks[0]["exact"]
    for case, report in zip(CASES, found):
        if case.noise_step and case.kind != "initialisation":
            assert report == {"step": case.noise_step, "tensor": "inp.weight", "ranks": [case.rank]}, case
    assert found[2] == truth(CASES[2], 4)       # no noise: the copies are bitwise the same until the drift


def test_two_ranks_are_a_tie_every_rank_reported():
    results = course.launch(drift.run, 2, args=(gathered_check, [drift.Drift("buffer", rank=1, step=2),
                                                                 drift.Drift("none", rank=1, noise_step=3)]))
    assert results[0] == results[1] == [{"step": 2, "tensor": "norm.running_mean", "ranks": [0, 1]}, None]


def stopped_steps(case):
    """Runs on every rank: the last step each rank ran, when rank 0's check alone reports."""
    return drift.train(functools.partial(gathered_check, rank_zero_alone=True), case)["step"]


def test_the_ranks_stop_together_when_one_rank_alone_reports():
    results = course.launch(stopped_steps, 2, args=(drift.Drift("permutation", rank=0, step=3, tensor="out.bias"),),
                            timeout=20)
    assert [results[rank] for rank in results.ranks] == [3, 3]


def watched(case):
    return drift.train(lambda model, step: None, case, stop=False, watch=True)


def test_spreads_are_zero_until_the_drift_then_not():
    results = course.launch(watched, 2, args=(drift.Drift("permutation", rank=1, step=3, tensor="inp.bias"),))
    spreads, out = results[0]["spreads"], results[0]
    assert out["step"] == drift.STEPS and out["report"] is None
    assert all(value == 0 for step in (1, 2) for value in spreads[step].values())
    assert spreads[3]["inp.bias"] > 1e-2 and spreads[3]["out.weight"] == 0
    assert list(spreads[3]) == list(drift.make_model().state_dict())
    assert results[1]["spreads"] == spreads


def test_draw_is_the_seed_s_and_puts_noise_before_the_drift():
    for seed in range(40):
        for kind in drift.KINDS:
            case = drift.draw(seed, 4, kind)
            assert case == drift.draw(seed, 4, kind) and case.kind == kind and 0 <= case.rank < 4
            assert 1 <= case.noise_step < drift.STEPS
            if kind in ("buffer", "permutation"):
                assert 3 <= case.step <= drift.STEPS and case.noise_step < case.step
    assert len({drift.draw(seed, 4, "permutation") for seed in range(40)}) > 10


def test_bad_drifts_are_refused_saying_what_to_choose():
    with pytest.raises(ValueError, match="choose one of"):
        drift.Drift("sign")
    with pytest.raises(ValueError, match="not 'norm.weight'"):
        drift.Drift("permutation", tensor="norm.weight")
    with pytest.raises(ValueError, match="steps run 1 to 6"):
        drift.Drift("buffer", step=7)
    with pytest.raises(ValueError, match="choose one of"):
        drift.draw(0, 2, "sign")


def test_the_model_has_parameters_and_buffers_in_the_order_the_lab_names():
    assert list(drift.make_model().state_dict()) == [
        "inp.weight", "inp.bias", "norm.weight", "norm.bias", "norm.running_mean", "norm.running_var",
        "norm.num_batches_tracked", "out.weight", "out.bias"]
    assert "rank 2 runs a validation batch in train mode at step 3" in drift.Drift("buffer", 2, 3).describe()
