"""Covers: course.wrong_gradients, course.mixture_step.

course.wrong_gradients: lab 9's step on 4 ranks with its reductions written correctly gives one process's
gradients, sliced as each rank holds its parameters, on every layout the bugs use; each planted bug makes exactly
the gradients its docstring says wrong, by the factor it says (2 for a sum done twice over a group of two, 0.5
for an average where a sum belongs) or by no factor (the tied embedding not summed, a region's input not copied,
sums reduced to one rank, dropout masks identical across tp ranks), on the ranks it says, and leaves the others
right; lab 8's mixture on dp x ep with its reductions right gives one process's gradients, and with its experts
averaged over the group that summed them, ep times them on every rank, its experts only; `draw` gives different
bugs, a scale and a non-scale among them, the same for a seed; `run` refuses an unknown bug, a layout the bug does
not show on and a layer the model lacks, naming them; the stage's `gather` comes back after a forward that
replaced it.

Tolerance: the course's float32 one (course.check, rtol 1e-5, atol 1e-6) for a right gradient: the grid sums in
another order than one process (measured on 6 seeds of each layout, with and without AVX2: 3e-6 relative in
norm at most, every element within a quarter of the tolerance); a wrong one is off by 0.005 or more.
"""
from __future__ import annotations

import pytest
import torch

from course import check, gpt_stage, mixture_step, wrong_gradients
from course.wrong_gradients import Case

TOLERANCE = dict(rtol=1e-5, atol=1e-6)
DP_TP, PP_TP, DP_PP = {"dp": 2, "tp": 2}, {"pp": 2, "tp": 2}, {"dp": 2, "pp": 2}
CASES = {
    "right dp2-tp2": Case(None, DP_TP, 0, 1),
    "right pp2-tp2": Case(None, PP_TP, 0, 2),
    "right dp2-pp2": Case(None, DP_PP, 0, 3),
    "reduced twice": Case("reduced twice", DP_PP, 3, 4),
    "averaged over dp": Case("averaged over dp", DP_TP, 0, 5),
    "replicated summed twice over tp": Case("replicated summed twice over tp", PP_TP, 0, 6),
    "tied not summed": Case("tied not summed", PP_TP, 0, 7),
    "input not copied": Case("input not copied", DP_TP, 1, 8),
    "reduced to one rank": Case("reduced to one rank", PP_TP, 0, 9),
    "dropout identical across tp ranks": Case("dropout identical across tp ranks", PP_TP, 3, 10),
    "right dp4-ep2": Case(None, {"dp": 4, "ep": 2}, 0, 11),
    "right dp4-ep4": Case(None, {"dp": 4, "ep": 4}, 0, 12),
    "experts ep2": Case("experts scaled by the wrong group size", {"dp": 4, "ep": 2}, 0, 13),
    "experts ep4": Case("experts scaled by the wrong group size", {"dp": 4, "ep": 4}, 0, 14),
}


@pytest.fixture(scope="module")
def found():
    """Every case of CASES, in one launch of 4 ranks."""
    return dict(zip(CASES, wrong_gradients.run(list(CASES.values()), timeout=300)))


def _right(got, want):
    try:
        check.assert_close(got, want, "gradient", **TOLERANCE)
        return True
    except AssertionError:
        return False


def _factor(got, want):
    """c where got = c·want within the tolerance, else None."""
    got, want = got.double(), want.double()
    c = float((got * want).sum() / (want * want).sum())
    return round(c, 4) if _right(got.float(), (c * want).float()) else None


def _wrong(case):
    """{(rank, name): the factor or None} of every gradient that is not one process's."""
    gradients, reference = case
    return {(rank, name): _factor(gradients[rank][name], reference[rank][name])
            for rank in sorted(reference) for name in reference[rank]
            if not _right(gradients[rank][name], reference[rank][name])}


def _held(case, test):
    """{(rank, name)} of the parameters held for which test(name) holds."""
    _, reference = case
    return {(rank, name) for rank in sorted(reference) for name in reference[rank] if test(name)}


@pytest.mark.parametrize("name", ["right dp2-tp2", "right pp2-tp2", "right dp2-pp2", "right dp4-ep2",
                                  "right dp4-ep4"])
def test_the_right_reductions_give_one_process_s_gradients_on_every_layout(found, name):
    gradients, reference = found[name]
    assert sorted(gradients) == [0, 1, 2, 3]
    for rank in gradients:
        assert list(gradients[rank]) == list(reference[rank]), rank
        check.assert_close(gradients[rank], reference[rank], f"the gradients of {name}", rank=rank, **TOLERANCE)


def test_names_are_the_model_s_in_each_stage_s_order_the_output_layer_as_the_embedding(found):
    _, reference = found["right pp2-tp2"]
    shapes = gpt_stage.global_shapes(wrong_gradients.CONFIG)
    assert list(reference[0]) == [n for n in shapes if n.split(".")[0] in ("embedding", "position")
                                  or n.startswith(("blocks.0.", "blocks.1."))]
    assert list(reference[2])[-1] == "embedding.weight" and "position.weight" not in reference[2]
    assert tuple(reference[2]["embedding.weight"].shape) == (wrong_gradients.CONFIG.vocab // 2,
                                                            wrong_gradients.CONFIG.width)    # tp = 2's rows


def test_a_layer_reduced_twice_is_twice_as_large_on_the_ranks_of_its_stage_only(found):
    case = found["reduced twice"]
    assert _wrong(case) == {key: 2.0 for key in _held(case, lambda n: n.startswith("blocks.3."))}
    assert {rank for rank, _ in _wrong(case)} == {2, 3}


def test_gradients_averaged_over_dp_are_half_of_every_gradient(found):
    case = found["averaged over dp"]
    assert _wrong(case) == {key: 0.5 for key in _held(case, lambda n: True)}


def test_replicated_parameters_summed_twice_over_tp_are_twice_as_large_and_the_split_ones_right(found):
    case = found["replicated summed twice over tp"]
    replicated = _held(case, lambda n: gpt_stage.split_dim(n) is None)
    assert ("position.weight" in {n for _, n in replicated}) and len(replicated) < len(_held(case, lambda n: True))
    assert _wrong(case) == {key: 2.0 for key in replicated}


def test_the_tied_embedding_not_summed_is_wrong_on_both_stages_by_no_factor(found):
    assert _wrong(found["tied not summed"]) == {(rank, "embedding.weight"): None for rank in range(4)}


def test_a_region_s_input_not_copied_makes_every_gradient_upstream_wrong_by_no_factor(found):
    case = found["input not copied"]
    upstream = _held(case, lambda n: n.startswith(("embedding.", "position.", "blocks.0.", "blocks.1.ln1.")))
    wrong = _wrong(case)
    assert set(wrong) == upstream        # layer 1's qkv and after, layers 2 and 3 and ln_f: right
    assert wrong[(0, "embedding.weight")] is None and wrong[(1, "position.weight")] is None


def test_sums_reduced_to_one_rank_leave_the_other_ranks_their_own_part(found):
    case = found["reduced to one rank"]
    replicated = _held(case, lambda n: gpt_stage.split_dim(n) is None)
    expected = {key for key in replicated if key[0] in (1, 3)}      # tp rank 1: not its tp group's first
    expected |= {(rank, "embedding.weight") for rank in (2, 3)}     # the last stage: not its tied group's first
    assert set(_wrong(case)) == expected
    assert all(factor is None for factor in _wrong(case).values())


def test_dropout_identical_across_tp_ranks_changes_the_forward_so_every_gradient_is_wrong_by_no_factor(found):
    case = found["dropout identical across tp ranks"]
    wrong = _wrong(case)
    assert set(wrong) == _held(case, lambda n: True)        # layer 3, the last stage's: the loss, so everything
    assert wrong[(0, "embedding.weight")] is None and wrong[(2, "blocks.3.mlp.0.weight")] is None


def test_the_right_dropout_masks_are_one_process_s_columns_not_the_same_on_every_tp_rank():
    hook = wrong_gradients._dropout(seed=3, layer=1, units=slice(None))
    width = 4 * wrong_gradients.CONFIG.width
    whole = hook(None, (), torch.ones(2, 8, width))
    kept = whole != 0
    assert torch.equal(kept[0], kept[1])                    # the same for every sequence of the batch
    assert 0.6 < kept.float().mean() < 0.9                 # DROPOUT = 0.25 of the units dropped
    check.assert_close(whole[kept], torch.full_like(whole[kept], 1 / (1 - wrong_gradients.DROPOUT)), "kept")
    halves = [wrong_gradients._dropout(3, 1, slice(t * width // 2, (t + 1) * width // 2))(
        None, (), torch.ones(2, 8, width // 2)) for t in range(2)]
    assert torch.equal(torch.cat(halves, -1), whole)        # tp ranks' columns make one process's mask
    assert not torch.equal(halves[0], halves[1])
    other = wrong_gradients._dropout(seed=3, layer=2, units=slice(None))(None, (), torch.ones(2, 8, width))
    assert not torch.equal(other, whole)                   # each layer its own mask


@pytest.mark.parametrize("name, ep", [("experts ep2", 2), ("experts ep4", 4)])
def test_experts_averaged_over_the_group_that_summed_them_are_ep_times_too_large_the_dense_right(found, name, ep):
    case = found[name]
    assert _wrong(case) == {(rank, n): float(ep) for rank in range(4) for n in ("w1", "w2")}
    gradients, reference = case
    experts = mixture_step.MIXTURE["experts"]
    assert [tuple(reference[rank]["w1"].shape)[0] for rank in range(4)] == [experts // ep] * 4   # the rank's block


def test_draw_is_a_seed_s_different_bugs_a_scale_and_not_a_scale_among_them():
    for seed in range(40):
        cases = wrong_gradients.draw(seed, 3)
        assert cases == wrong_gradients.draw(seed, 3)
        bugs = [case.bug for case in cases]
        assert len(set(bugs)) == 3
        assert set(bugs) & set(wrong_gradients.SCALES) and set(bugs) & set(wrong_gradients.NOT_SCALES)
        for case in cases:
            assert case.sizes in wrong_gradients.BUGS[case.bug] and 0 <= case.layer < 4
    assert len({tuple(c.bug for c in wrong_gradients.draw(seed, 3)) for seed in range(40)}) > 10
    assert {c.bug for c in wrong_gradients.draw(0, 8)} == set(wrong_gradients.BUGS)
    assert set(wrong_gradients.SCALES) | set(wrong_gradients.NOT_SCALES) == set(wrong_gradients.BUGS)


@pytest.mark.parametrize("count", [1, 9, 2.0])
def test_draw_refuses_a_count_it_cannot_draw(count):
    with pytest.raises(ValueError, match=r"count must be a whole number from 2 to 8 \(one case per bug\)"):
        wrong_gradients.draw(0, count)


@pytest.mark.parametrize("case, said", [
    (Case("doubled", DP_TP), "unknown bug 'doubled': the bugs are 'reduced twice', "),
    (Case("tied not summed", DP_TP), "the bug 'tied not summed' shows on the layouts [{'pp': 2, 'tp': 2}, "
                                     "{'dp': 2, 'pp': 2}], not on {'dp': 2, 'tp': 2}"),
    (Case("reduced twice", DP_TP, 4), "layer must be 0 to 3, got 4"),
    (Case(None, {"dp": 2, "ep": 2}), "an expert layout is one of [{'dp': 4, 'ep': 2}, {'dp': 4, 'ep': 4}] (4 "
                                     "ranks), got {'dp': 2, 'ep': 2}"),
    (Case("reduced twice", {"dp": 4, "ep": 2}), "the bug 'reduced twice' shows on the layouts"),
    (Case("experts scaled by the wrong group size", DP_TP), "shows on the layouts [{'dp': 4, 'ep': 2}, "),
    (Case(None, {"dp": 2, "sp": 2}), "unknown axis 'sp'"),
])
def test_run_refuses_a_case_it_cannot_plant_before_launching(case, said):
    with pytest.raises(ValueError) as error:
        wrong_gradients.run([case])
    assert said in str(error.value)


def test_the_stage_s_gather_comes_back_after_the_forward_that_replaced_it_even_when_it_raised():
    real = gpt_stage.gather

    def forward():
        assert gpt_stage.gather is not real
        raise RuntimeError("a forward that fails")

    with pytest.raises(RuntimeError, match="a forward that fails"):
        wrong_gradients._first_gather_uncopied(forward)()
    assert gpt_stage.gather is real
