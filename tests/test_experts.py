"""Covers: course.experts, course.layout_cost.

A mixture of experts in the cost model: course.experts by hand, Mixtral's published counts, and
the chooser's expert parallelism (course.layout_cost, course.choosing, course.choosing_view): the
experts' memory divided by ep and sharded over the ranks that hold the same experts, the all-to-alls'
bytes by hand, FLOPs of the active parameters, activations of k experts a token, ep offered only for a
model with experts and only where it divides them and dp, and lab 6's claim about Mixtral."""
from __future__ import annotations

import dataclasses

import matplotlib
import numpy as np
import pytest
from matplotlib.markers import MarkerStyle

from course import activations, choosing, choosing_view, experts, memory, sizes
from course.choosing import CLUSTERS, MODELS, Layout
from course.presets import MIXTRAL

matplotlib.use("Agg")
H100 = CLUSTERS[choosing.H100_CLUSTER]
MOE = MODELS[MIXTRAL]
#: the dtypes "mixed" precision reduces gradients and gathers parameters in (course.memory.PRECISIONS)
MIXED = {"dtype": memory.PRECISIONS["mixed"].gradients, "gather_dtype": memory.PRECISIONS["mixed"].parameters}
DENSE_TWIN = dataclasses.replace(MOE, name="Mixtral without experts", experts=0, top_k=0, expert_parameters=0)


def test_mixtral_s_published_counts():
    # 46.7B parameters, 12.9B active (Jiang et al. 2024); the experts: 32 layers × 8 × SwiGLU's 3 × 4096 × 14336
    assert MOE.parameters == 46_702_792_704 and MOE.expert_parameters == 45_097_156_608
    assert MOE.active_parameters == 46_702_792_704 - 45_097_156_608 + 45_097_156_608 * 2 / 8 == 12_879_925_248
    assert DENSE_TWIN.active_parameters == DENSE_TWIN.parameters


def test_the_all_to_all_s_bytes_by_hand():
    # 10 tokens, 2 rows each, 4 features of 2 bytes: 160 bytes of rows, of which 3/4 leave for 3 other ranks
    assert experts.all_to_all_sent(10, 4, 2, 4, 2) == 120
    assert experts.sent_per_layer(10, 4, 2, 4, 2) == 480            # dispatch, combine; forward, backward
    assert experts.all_to_all_sent(10, 4, 2, 1, 2) == 0             # one rank keeps them all
    assert experts.experts_per_rank(8, 4) == 2



def test_capacity_in_the_dispatch_sends_its_fixed_buffers_by_hand():
    # lab 8's digits model on 2 ranks at factor 1.0: 4 experts, 16 places each, 32 features of 4 bytes. A rank sends
    # its 2 other experts' 32 places and returns the 32 it got for its own, forward and backward: the 16,384 bytes
    # the lab's table counts a step
    assert experts.capacity_dispatch_sent(16, 32, 4, 2, 4) == 2 * (2 * 16 + 2 * 16) * 32 * 4 == 16_384
    # 5 experts on 3 ranks: ranks 0 and 1 hold 2, rank 2 holds 1; capacity 3, 1 feature of 1 byte
    assert [experts.capacity_dispatch_sent(3, 1, 5, 3, 1, rank=r) for r in range(3)] == [
        2 * 3 * (3 + 2 * 2), 2 * 3 * (3 + 2 * 2), 2 * 3 * (4 + 2 * 1)]
    assert experts.capacity_dispatch_sent(3, 8, 4, 1, 2) == 0                    # one rank keeps every place
    with pytest.raises(ValueError, match="rank 2 is not one of the 2 ranks 0 to 1"):
        experts.capacity_dispatch_sent(16, 32, 4, 2, 4, rank=2)
    with pytest.raises(ValueError, match="4 experts cannot give each of 5 ranks one"):
        experts.capacity_dispatch_sent(16, 32, 4, 5, 4)
    with pytest.raises(ValueError, match="capacity must be a whole number"):
        experts.capacity_dispatch_sent(-1, 32, 4, 2, 4)


@pytest.mark.parametrize("call, words", [
    (lambda: experts.experts_per_rank(8, 3), "8 experts do not split over 3 ranks"),
    (lambda: experts.check(8, 9), "1 <= top_k <= experts, got top_k=9 of 8 experts"),
    (lambda: experts.check(8, 0), "got top_k=0"),
    (lambda: experts.active_parameters(10, 11, experts=8, top_k=2), "are part of the model's 10"),
    (lambda: dataclasses.replace(MOE, top_k=9), "1 <= top_k <= experts"),
])
def test_bad_counts_are_refused_in_words(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_the_mlp_block_is_19_of_the_34_and_splits_as_the_paper_says():
    s, b, h = 4096, 2, 4096
    assert activations.mlp_block_bytes(s, b, h) == 19 * s * b * h
    assert activations.mlp_block_bytes(s, b, h, 4) == s * b * h * (3 + 16 / 4)
    assert activations.mlp_block_bytes(s, b, h, 4, sequence_parallel=True) == 19 * s * b * h / 4
    assert activations.mlp_block_bytes(s, b, h, context=2) == 19 * s * b * h / 2


def test_ep_is_offered_only_for_experts_and_only_where_it_divides_them_and_dp():
    dense = choosing.layouts(16, 8, 32)
    assert {x.ep for x in dense} == {1}
    with_experts = choosing.layouts(16, 8, 32, experts=8)
    assert {x.ep for x in with_experts} == {1, 2, 4, 8}
    assert all(x.dp % x.ep == 0 and 8 % x.ep == 0 for x in with_experts)
    assert set(with_experts) - set(dense) == {x for x in with_experts if x.ep > 1}
    assert {x.ep for x in choosing.layouts(12, 4, 32, experts=8)} == {1, 2, 4}      # dp 12: not 3, 6 or 12
    gpt = MODELS["GPT-3 1.3B"]
    assert "has no experts" in choosing.why_not(gpt, 512, Layout(2, 0, 1, 1, 1, ep=2))
    assert "8 experts do not split over 3 ep ranks" in choosing.why_not(MOE, 96, Layout(3, 0, 1, 1, 1, ep=3))
    assert "do not split into groups of 4" in choosing.why_not(MOE, 96, Layout(2, 0, 1, 1, 1, ep=4))
    # beside tp, only with sequence parallelism (Megatron-LM requires it)
    beside_tp = Layout(4, 0, 2, 1, 1, ep=4)
    assert "needs sequence parallelism" in choosing.why_not(MOE, 96, beside_tp)
    assert choosing.why_not(MOE, 96, beside_tp, sequence_parallel=True) is None
    plain, with_sp = (choosing.options(MOE, H100, 64, nodes=1, sequence_parallel=on) for on in (False, True))
    assert not any(o.layout.ep > 1 and o.layout.tp > 1 for o in plain)
    assert any(o.layout.ep > 1 and o.layout.tp > 1 for o in with_sp)
    assert all(o.layout.ep == 1 for o in choosing.options(gpt, H100, 512, nodes=2))


def test_ep_divides_the_experts_memory_and_the_all_to_alls_send_their_rows():
    layout = Layout(dp=8, zero=0, tp=1, pp=1, m=1, ep=8)
    option = choosing.evaluate(MOE, H100, 8, layout)       # one sample of 4096 tokens a rank
    dense_part = MOE.parameters - MOE.expert_parameters
    each = memory.per_rank(dense_part, 8, "data parallel")
    mine = memory.per_rank(MOE.expert_parameters // 8, 1, "data parallel")
    for kind in ("parameters", "gradients", "optimizer state"):
        assert option.memory[kind] == each[kind] + mine[kind], kind
    # 32 layers × 4 all-to-alls × 4096 tokens × 2 experts × 4096 features × 2 bytes (bf16) × 7/8 leave
    assert option.sent["ep"] == 32 * 4 * 4096 * 2 * 4096 * 2 * 7 / 8
    # the dense part's gradients all-reduced over the 8 copies; no rank shares its experts with another
    assert option.sent["dp"] == memory.sent_per_step(dense_part, 8, "data parallel", **MIXED)
    assert option.sent["total"] == option.sent["dp"] + option.sent["ep"]
    whole = choosing.evaluate(MOE, H100, 8, Layout(dp=8, zero=0, tp=1, pp=1, m=1))
    assert whole.sent["ep"] == 0
    assert whole.memory["parameters"] - option.memory["parameters"] == pytest.approx(
        MOE.expert_parameters * 7 / 8 * sizes.DTYPE_BYTES[memory.PRECISIONS["mixed"].parameters], rel=1e-9)


def test_the_experts_gradients_are_averaged_and_sharded_over_the_ranks_that_share_them():
    # 16 copies, experts over groups of 4: each expert is on 4 ranks (16 / 4), ZeRO-1 shards its state over them
    option = choosing.evaluate(MOE, H100, 16, Layout(dp=16, zero=1, tp=1, pp=1, m=1, ep=4))
    dense_part, mine = MOE.parameters - MOE.expert_parameters, MOE.expert_parameters // 4
    assert option.memory["optimizer state"] == (memory.per_rank(dense_part, 16, "ZeRO-1")["optimizer state"]
                                                + memory.per_rank(mine, 4, "ZeRO-1")["optimizer state"])
    assert option.sent["dp"] == pytest.approx(
        memory.sent_per_step(dense_part, 16, "ZeRO-1", **MIXED) + memory.sent_per_step(mine, 4, "ZeRO-1", **MIXED),
        rel=1e-12)


def test_a_token_costs_the_active_parameters_flops_and_keeps_k_mlp_blocks():
    layout = Layout(dp=8, zero=0, tp=1, pp=1, m=1)
    moe, dense = choosing.evaluate(MOE, H100, 8, layout), choosing.evaluate(DENSE_TWIN, H100, 8, layout)
    want = activations.training_flop(MOE.active_parameters, layers=32, sequence=4096, hidden=4096,
                                     tokens=8 * 4096, recompute="selective")
    assert moe.seconds["compute"] == pytest.approx(H100.processor_for("mixed").seconds(want / 8), rel=1e-12)
    assert moe.seconds["compute"] < 0.3 * dense.seconds["compute"]            # 12.9B of 46.7B
    extra = moe.memory["activations"] - dense.memory["activations"]
    assert extra == 32 * 1 * activations.mlp_block_bytes(4096, 1, 4096, dropout=False)   # one more expert a token
    full = choosing.activation_bytes(MOE, layout, 1, precision="mixed", recompute="full")
    assert full - choosing.activation_bytes(DENSE_TWIN, layout, 1, precision="mixed", recompute="full") == \
        activations.mlp_block_bytes(4096, 1, 4096, dropout=False)               # only the layer rebuilt


def test_the_tp_all_reduces_of_an_expert_layer_carry_k_rows_a_token():
    layout = Layout(dp=1, zero=0, tp=8, pp=1, m=1)
    moe, dense = choosing.evaluate(MOE, H100, 1, layout), choosing.evaluate(DENSE_TWIN, H100, 1, layout)
    # 4 all-reduces a layer, 2 of them (the MLP's) with 2 rows a token: 6 where the dense twin has 4
    assert moe.sent["tp"] == pytest.approx(dense.sent["tp"] * 6 / 4, rel=1e-12)


def test_lab_6_s_claim_on_mixtral_and_the_view_s_squares():
    # "On 8 and on 32 nodes ... data parallelism with ZeRO, the experts split over 8 ranks, and neither tp nor pp"
    for nodes in (32, 8):
        best = choosing.fastest(choosing.options(MOE, H100, MOE.batch, nodes=nodes))
        assert best.layout.uses == "dp+zero+ep" and best.layout.ep == 8, (nodes, best.layout)
        assert best.layout.zero == 1, best.layout             # the course guide: "ZeRO-1 data parallelism"
    assert choosing_view.layout_words(best.layout).startswith(f"dp {best.layout.dp} (ZeRO-{best.layout.zero}, ep 8)")
    fig = choosing_view.draw(model=MIXTRAL, nodes=8)
    labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]     # beside the table
    assert "square: with ep" in labels and "triangle: with cp" not in labels
    square = MarkerStyle("s")
    square = square.get_path().transformed(square.get_transform()).vertices
    drawn = [c for c in fig.axes[0].collections if len(c.get_offsets())
             and c.get_paths()[0].vertices.shape == square.shape and np.allclose(c.get_paths()[0].vertices, square)]
    assert sum(len(c.get_offsets()) for c in drawn) == sum(o.layout.ep > 1 for o in choosing.options(
        MOE, H100, MOE.batch, nodes=8)), "every layout with ep drawn as a square, and only those"
    assert f"ep {best.seconds['ep']:.3g} s" in choosing_view.describe(model=MIXTRAL, nodes=8)


# --- lab 8's parts: course.moe, the schemes' bytes and memory, capacity, the view ---------------

def test_experts_go_to_ranks_in_contiguous_blocks_the_first_ranks_holding_one_more():
    from course import moe

    assert moe.owners(5, 3) == [0, 0, 1, 1, 2] and moe.owners(4, 2) == [0, 0, 1, 1]
    assert [moe.experts_of(r, 5, 3) for r in range(3)] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="run at most 4 ranks"):
        moe.owners(4, 5)


def test_a_random_routing_picks_distinct_allowed_experts_with_weights_that_sum_to_one():
    import torch

    from course import moe

    weights, chosen = moe.random_routing(50, 5, 2, torch.Generator().manual_seed(0), avoid=(2, 3))
    assert chosen.shape == weights.shape == (50, 2) and chosen.dtype == torch.int64
    assert set(chosen.unique().tolist()) == {0, 1, 4} and bool((chosen[:, 0] != chosen[:, 1]).all())
    assert torch.allclose(weights.sum(1), torch.ones(50)) and bool((weights > 0).all())
    with pytest.raises(ValueError, match="only 1 of 3 may be chosen"):
        moe.random_routing(4, 3, 2, torch.Generator(), avoid=(0, 1))


def test_the_digits_model_keeps_a_rank_s_experts_only_and_runs_the_block_it_is_given():
    import torch

    from course import moe

    whole, mine = moe.DigitsMixture(5, 2, seed=3), moe.DigitsMixture(5, 2, seed=3).local(1, 3)
    assert torch.equal(mine.w1, whole.w1[2:4]) and torch.equal(mine.w2, whole.w2[2:4])
    assert torch.equal(mine.embed.weight, whole.embed.weight)
    assert all(p is not whole.w1 for p in whole.dense_parameters()) and len(whole.expert_parameters()) == 2
    calls = []

    def mix(h, weights, chosen, w1, w2):
        calls.append((h.shape, chosen.shape, w1.shape))
        return torch.zeros_like(h)

    scores, probabilities, chosen = whole(torch.rand(7, 64), lambda logits, k: logits.topk(k), mix)
    assert scores.shape == (7, 10) and probabilities.shape == (7, 5) and chosen.shape == (7, 2)
    assert calls == [((7, 32), (7, 2), (5, 32, 32))]


def test_the_schemes_bytes_and_memory_by_hand():
    # tensor parallel: 2 ring all-reduces of T·h elements; replicated: one of the experts' parameters
    assert experts.tensor_parallel_sent(100, 16, 4, 4) == 2 * 2 * 3 / 4 * 100 * 16 * 4
    assert experts.replicated_sent(1000, 4, 2) == 2 * 3 / 4 * 1000 * 2
    assert [experts.held_per_rank(s, 5, 10, 2) for s in experts.SCHEMES] == [50, 25, 30]   # ceil(5/2) experts
    with pytest.raises(ValueError, match="run at most 5"):
        experts.held_per_rank("expert parallel", 5, 10, 6)
    with pytest.raises(ValueError, match="scheme must be one of"):
        experts.held_per_rank("pipeline", 5, 10, 2)
    assert experts.capacity(10, 4, 2, 1.25) == 7 and experts.capacity(8, 4, 2, 1.0) == 4     # ceil(6.25), exact
    with pytest.raises(ValueError, match="must be positive"):
        experts.capacity(8, 4, 2, 0)


def test_the_view_s_crossing_is_where_expert_parallelism_sends_what_replicating_sends():
    from course import experts_view

    mixtral = "Mixtral 8x7B's layer (h 4096, SwiGLU 14336, bf16)"
    tokens = experts_view.crossing(mixtral, 8, 2)
    assert tokens == 86_016       # the lab's written answer: E·P / (2·k·h)
    assert experts_view.sent("expert parallel", tokens, mixtral, 8, 2, 8) == pytest.approx(
        experts_view.sent("replicated", tokens, mixtral, 8, 2, 8), rel=1e-12)
    assert "up to 86,016 tokens a rank" in experts_view.describe(model=mixtral, experts=8, top_k=2, ranks=8)
    # with the gradients reduced in fp32 (lab 5's mixed precision), the replicated experts send twice the
    # bytes and the crossing doubles: 4·k·T·h·2 = 2·E·P·4, T = E·P/(k·h) = 172,032 (lab 8's written answer)
    fp32_gradients = experts.replicated_sent(8 * 3 * 4096 * 14_336, 8, 4)
    assert experts.sent_per_layer(172_032, 4096, 2, 8, 2) == pytest.approx(fp32_gradients, rel=1e-12)
    assert experts.sent_per_layer(86_016, 4096, 2, 8, 2) == pytest.approx(fp32_gradients / 2, rel=1e-12)
    assert experts_view.fitted(4, 8, 16) == (4, 4)       # sliders past the experts: drawn at the experts
