"""Covers: course.choosing, course.activations.

course.choosing and course.activations: every layout of a model on a cluster, by hand count.

Layouts listed by hand; memory by hand and equal to course.memory.per_rank; Korthikanti's Table 2
by hand and the savings and FLOPs the paper states; the default (attention recomputed) and
LLaMA-2 70B's 68.2 GB (no dropout, as lab 7 counts it); grouped-query attention's ring bytes (LLaMA-2 70B's
12.35 GB against 1.54 GB); sequence parallelism's bytes; lab 6's claim on the presets; bytes and the
bubble's stretch by hand; what never fits, never runs, never crosses a node; the fastest is fitting
and minimal; context parallelism offered only when asked, by hand, and lab 6's claim on it; bad
arguments refused in words.
"""
from __future__ import annotations

import dataclasses

import pytest

from course import activations, choosing, memory, timemodel
from course.choosing import CLUSTERS, LAB_MLP, LOCAL, MODELS, Layout

MLP = MODELS[LAB_MLP]
H100 = CLUSTERS[choosing.H100_CLUSTER]
LOCAL_MACHINE = CLUSTERS[LOCAL]


def test_two_gpus_layouts_by_hand():
    expected = [(1, 0, 1, 2, 2), (1, 0, 1, 2, 4), (1, 0, 1, 2, 8), (1, 0, 1, 2, 16),     # pipeline, 2 stages
                (1, 0, 2, 1, 1), (1, 0, 2, 1, 2), (1, 0, 2, 1, 4), (1, 0, 2, 1, 8),      # split weights
                (2, 0, 1, 1, 1), (2, 0, 1, 1, 2), (2, 0, 1, 1, 4), (2, 0, 1, 1, 8),      # data parallel
                (2, 1, 1, 1, 1), (2, 1, 1, 1, 2), (2, 1, 1, 1, 4), (2, 1, 1, 1, 8),      # ZeRO-1
                (2, 2, 1, 1, 1), (2, 2, 1, 1, 2), (2, 2, 1, 1, 4), (2, 2, 1, 1, 8),
                (2, 3, 1, 1, 1), (2, 3, 1, 1, 2), (2, 3, 1, 1, 4), (2, 3, 1, 1, 8)]
    assert choosing.layouts(2, 2, 2) == [Layout(*t) for t in expected]
    # one GPU a node: tp would cross nodes; 3 layers: 2 stages do not divide them
    assert {(x.tp, x.pp) for x in choosing.layouts(2, 1, 2)} == {(1, 1), (1, 2)}
    assert {(x.tp, x.pp) for x in choosing.layouts(2, 2, 3)} == {(1, 1), (2, 1)}
    assert choosing.layouts(1, 8, 8) == [Layout(1, 0, 1, 1, m) for m in (1, 2, 4, 8)]


def test_pp_divides_the_layers_and_tp_stays_in_its_node():
    for layout in choosing.layouts(64, 8, 6):
        assert 6 % layout.pp == 0 and 8 % layout.tp == 0 and layout.dp * layout.tp * layout.pp == 64
    assert {x.pp for x in choosing.layouts(64, 8, 6)} == {1, 2}
    assert {x.tp for x in choosing.layouts(64, 8, 96)} == {1, 2, 4, 8}
    assert {x.tp for x in choosing.layouts(16, 4, 96)} == {1, 2, 4}
    found = choosing.options(MODELS["GPT-3 1.3B"], H100, 512, nodes=8)
    assert found and max(o.layout.tp for o in found) == 8 and all(24 % o.layout.pp == 0 for o in found)
    with pytest.raises(ValueError, match="tp=16 would cross nodes of 8 GPUs"):
        choosing.evaluate(MODELS["GPT-3 1.3B"], H100, 512, Layout(1, 0, 16, 1, 1))
    with pytest.raises(ValueError, match="24 layers do not split into 16 stages"):
        choosing.evaluate(MODELS["GPT-3 1.3B"], H100, 512, Layout(1, 0, 1, 16, 16))


def test_memory_of_the_labs_mlp_by_hand():
    assert MLP.parameters == 7 * (64 * 64 + 64) + 64 * 10 + 10 == 29_770
    option = choosing.evaluate(MLP, LOCAL_MACHINE, 64, Layout(dp=2, zero=1, tp=1, pp=2, m=2), precision="fp32")
    # a stage holds 29,770 / 2 = 14,885 parameters: fp32 parameters and gradients 4 bytes each,
    # Adam's two moments 8 bytes on ceil(14,885 / 2) = 7,443 of them (ZeRO-1 over dp = 2)
    assert option.micro_batch == 64 // (2 * 2) == 16
    # the first stage's 4 Linears keep 16 × 64 inputs each, fp32, for min(pp, m) = 2 micro-batches
    activations = 2 * 16 * 4 * 64 * 4
    assert option.memory == {"parameters": 59_540, "gradients": 59_540, "optimizer state": 59_544,
                             "activations": activations, "total": 59_540 * 2 + 59_544 + 32_768}
    assert option.memory == memory.per_rank(14_885, 2, "ZeRO-1", precision="fp32", activations=activations)
    gpipe = choosing.evaluate(MLP, LOCAL_MACHINE, 64, Layout(2, 1, 1, 2, 4), precision="fp32", schedule="gpipe")
    assert gpipe.memory["activations"] == 4 * 8 * 4 * 64 * 4                  # GPipe keeps all m = 4 alive
    # tp = 2 splits the inputs of the row layers (the 2nd and 4th of the stage)
    split = choosing.evaluate(MLP, LOCAL_MACHINE, 64, Layout(1, 0, 2, 2, 2), precision="fp32")
    assert split.memory["activations"] == 2 * 32 * (64 + 32 + 64 + 32) * 4


# Korthikanti et al. 2022, Table 3's models (s = 2048, t = 8): (a, h, L)
GPT3_175B, MT_NLG_530B, ONE_T = (96, 12288, 96), (128, 20480, 105), (160, 25600, 128)


def test_layer_activations_are_korthikantis_table_2_by_hand():
    s, b, h, a = 2048, 2, 4096, 32
    sbh = s * b * h
    table = {("none", False, 1): sbh * (34 + 5 * a * s / h),                   # Eq. 1
             ("none", False, 4): sbh * (10 + 24 / 4 + 5 * a * s / (h * 4)),    # Eq. 2
             ("none", True, 4): sbh / 4 * (34 + 5 * a * s / h),                # Eq. 3
             ("selective", False, 4): sbh * (10 + 24 / 4),
             ("selective", True, 4): 34 * sbh / 4,
             ("full", False, 4): 2 * sbh,
             ("full", True, 4): 2 * sbh / 4}
    for (recompute, sp, tp), expected in table.items():
        got = activations.layer_bytes(s, b, h, a, tp, recompute=recompute, sequence_parallel=sp)
        assert got == pytest.approx(expected, rel=1e-12), (recompute, sp, tp)
    # without tensor parallelism, sequence parallelism has nothing to split
    assert activations.layer_bytes(s, b, h, a, 1, recompute="selective", sequence_parallel=True) == 34 * sbh


def test_the_papers_savings():
    def saved(model, **kw):
        a, h, _ = model
        stored, selective = (activations.layer_bytes(2048, 1, h, a, 8, recompute=r, **kw)
                             for r in ("none", "selective"))
        return 1 - selective / stored
    # "5as/h = 80" for GPT-3: selective recomputation saves 80/114 = 70 %, 65 % for MT-NLG (5as/h = 64)
    assert 5 * 96 * 2048 / 12288 == 80 and round(saved(GPT3_175B, sequence_parallel=True), 2) == 0.70
    assert round(saved(MT_NLG_530B, sequence_parallel=True), 2) == 0.65
    # both together, against tensor parallelism alone: "about 5x" less activation memory
    for a, h, _ in (GPT3_175B, MT_NLG_530B, ONE_T):
        baseline = activations.layer_bytes(2048, 1, h, a, 8, recompute="none")
        both = activations.layer_bytes(2048, 1, h, a, 8, recompute="selective", sequence_parallel=True)
        assert 4.9 <= baseline / both <= 5.5


def test_recomputations_flops_by_hand():
    for _, h, layers in (GPT3_175B, MT_NLG_530B):
        s, batch = 2048, 8
        p, tokens = 12 * layers * h * h, batch * s             # the layers' weights: 12h² each
        flop = {r: activations.training_flop(p, layers=layers, sequence=s, hidden=h, tokens=tokens, recompute=r)
                for r in activations.RECOMPUTE}
        # Narayanan et al. 2021: 72·B·s·L·h²·(1 + s/(6h)) without recomputation
        assert flop["none"] == pytest.approx(72 * batch * s * layers * h * h * (1 + s / (6 * h)))
        assert flop["full"] == pytest.approx(4 / 3 * flop["none"])                     # a second forward
        assert flop["selective"] - flop["none"] == 4 * layers * s * h * tokens          # attention's forward again
    # selective adds attention's forward, 4·L·s·h a token: s/(18h + 3s) of the step, under 1 % for GPT-3
    for _, h, layers in (GPT3_175B, MT_NLG_530B):
        flop = [activations.training_flop(12 * layers * h * h, layers=layers, sequence=2048, hidden=h, tokens=2048,
                                          recompute=r) for r in ("none", "selective")]
        assert flop[1] / flop[0] - 1 == pytest.approx(2048 / (18 * h + 3 * 2048)) and flop[1] / flop[0] < 1.01


def test_transformer_activations_per_stage():
    gpt = MODELS["GPT-3 1.3B"]                      # s = 2048, h = 2048, a = 16, 24 layers
    whole = choosing.activation_bytes(gpt, Layout(1, 0, 1, 1, 1), 1, precision="mixed", recompute="none")
    assert whole == 24 * (34 * 2048 * 2048 + 5 * 16 * 2048**2)               # 34sbh + 5as²b a layer
    split = choosing.activation_bytes(gpt, Layout(1, 0, 2, 4, 8), 2, precision="mixed", recompute="none")
    assert split == pytest.approx(4 * 6 * 2048 * 2 * 2048 * (10 + 24 / 2 + 5 * 16 * 2048 / (2048 * 2)))
    # the default: attention recomputed; fp32 activations twice the paper's 16 bits
    default = choosing.activation_bytes(gpt, Layout(1, 0, 1, 1, 1), 1, precision="fp32")
    assert default == 2 * 24 * 34 * 2048 * 2048
    sp = choosing.activation_bytes(gpt, Layout(1, 0, 2, 4, 8), 2, precision="mixed", sequence_parallel=True)
    assert sp == pytest.approx(4 * 6 * 34 * 2048 * 2 * 2048 / 2)
    # full: 4 stages of 6 layers, 4 micro-batches of 2 alive, each layer's 16-bit input; one layer rebuilt
    full = choosing.activation_bytes(gpt, Layout(1, 0, 1, 4, 8), 2, precision="mixed", recompute="full")
    assert full == 4 * 6 * 2 * 2048 * 2 * 2048 + 2048 * 2 * 2048 * (34 + 5 * 16 * 2048 / 2048)
    full_sp = choosing.activation_bytes(gpt, Layout(1, 0, 2, 4, 8), 2, precision="mixed", recompute="full",
                                        sequence_parallel=True)
    assert full_sp == pytest.approx((4 * 6 * 2 + (34 + 5 * 16 * 2048 / 2048)) * 2048 * 2 * 2048 / 2)


def test_the_mlp_recomputed_keeps_each_stage_input():
    full = choosing.evaluate(MLP, LOCAL_MACHINE, 64, Layout(1, 0, 1, 2, 4), precision="fp32", recompute="full")
    # min(pp, m) = 2 micro-batches of 16 alive, each the stage's 64-wide input; one's 4 layer inputs rebuilt
    assert full.memory["activations"] == (2 * 16 * 64 + 16 * 4 * 64) * 4
    for kept in ("none", "selective"):
        option = choosing.evaluate(MLP, LOCAL_MACHINE, 64, Layout(1, 0, 2, 2, 4), precision="fp32", recompute=kept,
                                   sequence_parallel=True)
        assert option.memory["activations"] == 2 * 16 * (64 + 32 + 64 + 32) * 4     # no attention, no sequence


def test_recomputation_trades_memory_for_a_second_forward():
    gpt, layout = MODELS["GPT-3 175B"], Layout(dp=8, zero=1, tp=8, pp=16, m=96)     # 2 samples a micro-batch
    kept, selective, full = (choosing.evaluate(gpt, H100, 1536, layout, recompute=r)
                             for r in ("none", "selective", "full"))
    assert not kept.fits and selective.fits and full.fits
    assert full.memory["activations"] < selective.memory["activations"] / 5 < kept.memory["activations"] / 5
    assert full.seconds["compute"] == pytest.approx(4 / 3 * kept.seconds["compute"])    # a second forward
    attention = 4 * 96 * 2048 * 12288 * 1536 * 2048 / (1024 * 989e12 * 0.5)              # its forward again
    assert selective.seconds["compute"] - kept.seconds["compute"] == pytest.approx(attention)


def test_the_default_recomputes_attention_and_llama_2_70b_fits():
    llama = MODELS["LLaMA-2 70B"]
    layout = Layout(dp=4, zero=1, tp=4, pp=4, m=256)
    default = choosing.evaluate(llama, H100, 1024, layout)
    assert default == choosing.evaluate(llama, H100, 1024, layout, recompute="selective", sequence_parallel=False)
    # by hand: 70e9 / 16 bf16 parameters and gradients, fp32 master and Adam's moments over dp 4;
    # 4 micro-batches of one sample alive × 20 layers × sbh(8 + 24/4) bytes: LLaMA-2 has no dropout, so the
    # table's 10 whole terms lose their two 1-byte masks
    held = 70_000_000_000 // 16
    activations_kept = 4 * 20 * 4096 * 8192 * (8 + 24 / 4)
    assert default.memory["total"] == pytest.approx(2 * held + 2 * held + 12 * held / 4 + activations_kept)
    assert round(default.memory["total"] / 1e9, 1) == 68.2 and default.fits
    for nodes in (8, 32):
        assert choosing.fastest(choosing.options(llama, H100, 1024, nodes=nodes)).layout.uses == "dp+zero+tp+pp"
    # the s² scores stored: GPT-3 175B (with dropout: 2e + 1 bytes a score) fits no layout on 8 nodes;
    # LLaMA-2 70B (without: e bytes) fits a few, all with tp = 8
    stored = choosing.options(MODELS["GPT-3 175B"], H100, 1536, nodes=8, recompute="none")
    assert stored and not any(o.fits for o in stored)
    stored = [o for o in choosing.options(llama, H100, 1024, nodes=8, recompute="none") if o.fits]
    assert len(stored) == 7 and all(o.layout.tp == 8 for o in stored)
    assert choosing.fastest(choosing.options(llama, H100, 1024, nodes=8)).layout == Layout(2, 1, 2, 16, 512)


def test_lab_6_s_written_answer_numbers():
    # written_layout_accounting: dp 4 (ZeRO-1) × tp 4 × pp 4, m 256, and the wrong answers its rubric names
    llama, layout = MODELS["LLaMA-2 70B"], Layout(dp=4, zero=1, tp=4, pp=4, m=256)
    got = choosing.evaluate(llama, H100, 1024, layout)
    one = 20 * 4096 * 8192 * (8 + 24 / 4)                           # a micro-batch on the first stage
    assert round(one / 1e9, 1) == 9.4 and round(got.memory["activations"] / 1e9, 1) == 37.6
    assert round(256 * one / 1e9) == 2405                            # every micro-batch kept
    assert (round(20 * 4096 * 8192 * 32 / 1e9, 1), round(4 * 20 * 4096 * 8192 * 32 / 1e9, 1)) == (21.5, 85.9)
    assert round(got.sent["tp"] / 1e12, 2) == 2.06 and round(got.sent["tp"] / 256 / 1e9, 2) == 8.05
    stored = choosing.evaluate(llama, H100, 1024, layout, recompute="none")
    assert round(stored.memory["total"] / 1e9) == 111 and not stored.fits
    assert (round(got.seconds["total"]), round(got.seconds["compute"])) == (68, 61)
    best = choosing.fastest(choosing.options(llama, H100, 1024, nodes=8))
    assert round(100 * (1 - best.seconds["total"] / got.seconds["total"])) == 3
    with_masks = choosing.evaluate(dataclasses.replace(llama, dropout=True), H100, 1024, layout)
    assert (round(with_masks.memory["activations"] / 1e9, 1), round(with_masks.memory["total"] / 1e9, 1)) == (42.9,
                                                                                                          73.6)


def test_the_chooser_counts_dropout_as_the_model_trains():
    # LLaMA-2 trains without dropout: the chooser's layer at t = 4 is lab 7's (sequence_view's), 14·sbh,
    # not the 16·sbh a GPT layer's two masks would make it (12.5 % apart)
    from course import sequence_view

    llama = MODELS["LLaMA-2 70B"]
    assert not llama.dropout and not MODELS[choosing.MIXTRAL].dropout and MODELS["GPT-3 175B"].dropout
    one = choosing.evaluate(llama, H100, 1024, Layout(dp=16, zero=1, tp=4, pp=1, m=64))   # one sample alive
    per_layer = one.memory["activations"] / 80
    assert per_layer == sequence_view.layer_bytes("tensor parallel", 4096, "LLaMA-2 70B", 4, 1)
    assert per_layer == 4096 * 8192 * (8 + 24 / 4)
    with_masks = dataclasses.replace(llama, dropout=True)
    assert choosing.evaluate(with_masks, H100, 1024, one.layout).memory["activations"] / 80 == pytest.approx(
        per_layer * 16 / 14)


def test_the_fastest_on_h100s_mixes_every_scheme_where_lab_6_says_so():
    # lab 6: on 32 nodes, every GPT-3 and LLaMA-2 preset's fastest layout uses dp with ZeRO, tp and pp
    for name in ("GPT-3 1.3B", "GPT-3 6.7B", "GPT-3 175B", "LLaMA-2 7B", "LLaMA-2 70B"):
        best = choosing.fastest(choosing.options(MODELS[name], H100, MODELS[name].batch, nodes=32))
        assert best.layout.uses == "dp+zero+tp+pp" and best.layout.tp <= 8, name
    # and not on 8 nodes: a small model needs no tp, GPT-3 175B has no room left for dp
    assert choosing.fastest(choosing.options(MODELS["GPT-3 6.7B"], H100, 1024, nodes=8)).layout.uses == "dp+zero+pp"
    assert choosing.fastest(choosing.options(MODELS["GPT-3 175B"], H100, 1536, nodes=8)).layout.uses == "tp+pp"


def test_sequence_parallelism_splits_what_tp_leaves_and_sends_the_same():
    gpt = MODELS["GPT-3 1.3B"]
    plain, sp = (choosing.evaluate(gpt, H100, 512, Layout(4, 0, 2, 4, 16), sequence_parallel=on)
                 for on in (False, True))
    assert sp.memory["activations"] == pytest.approx(plain.memory["activations"] * (34 / 2) / (10 + 24 / 2))
    assert sp.sent["tp"] == plain.sent["tp"] and sp.seconds["tp"] == plain.seconds["tp"]   # RS + AG = all-reduce
    assert sp.sent["pp"] == plain.sent["pp"] / 2                   # each tp rank sends its half of the sequence
    assert sp.seconds["compute"] == plain.seconds["compute"]


def test_narayanan_et_al_s_gpt3_layout_is_offered_and_fits():
    # Narayanan et al. 2021, GPT-3 175B on 1,024 GPUs: tp 8, pp 16, batch 1536 in micro-batches of 1
    found = choosing.options(MODELS["GPT-3 175B"], H100, 1536, nodes=128)
    (theirs,) = [o for o in found if o.layout == Layout(dp=8, zero=1, tp=8, pp=16, m=192)]
    assert theirs.micro_batch == 1 and theirs.fits
    assert choosing.fastest(found).seconds["total"] <= theirs.seconds["total"]


def test_bytes_by_hand():
    gpt = MODELS["GPT-3 1.3B"]
    option = choosing.evaluate(gpt, H100, 512, Layout(dp=4, zero=0, tp=2, pp=4, m=16))
    b = 512 // (4 * 16)                                                     # 8 samples a micro-batch
    held = 1_300_000_000 // 8                                               # a stage's half of the weights
    assert option.sent["dp"] == 2 * 3 / 4 * held * 2                        # ring all-reduce, bf16
    activation = b * 2048 * 2048 * 2
    assert option.sent["tp"] == 4 * 6 * 16 * (2 * 1 / 2 * activation)       # 4 all-reduces a layer, 6 layers
    assert option.sent["pp"] == 2 * 16 * activation                         # a middle stage: forward and back
    assert option.sent["total"] == sum(option.sent[k] for k in ("dp", "tp", "pp"))
    zero1 = choosing.evaluate(gpt, H100, 512, Layout(4, 1, 2, 4, 16))
    assert zero1.sent["dp"] == option.sent["dp"]                            # reduce-scatter + all-gather, once
    # ZeRO-2 reduce-scatters every micro-batch's gradients, ZeRO-3 also gathers twice a micro-batch
    shard = 3 / 4 * held * 2                                                # (N-1)/N of the gradients, bf16
    assert choosing.evaluate(gpt, H100, 512, Layout(4, 2, 2, 4, 16)).sent["dp"] == (16 + 1) * shard
    assert choosing.evaluate(gpt, H100, 512, Layout(4, 3, 2, 4, 16)).sent["dp"] == 3 * 16 * shard
    one_micro_batch = [choosing.evaluate(gpt, H100, 512, Layout(4, zero, 2, 1, 1)).sent["dp"] for zero in (0, 3)]
    assert one_micro_batch[1] == pytest.approx(1.5 * one_micro_batch[0])    # ZeRO-3: 1.5 × data parallelism
    two_stages = choosing.evaluate(gpt, H100, 512, Layout(4, 0, 2, 2, 16))
    assert two_stages.sent["pp"] == 16 * 8 * 2048 * 2048 * 2                # each stage sends one way only


def test_fp32_gradients_are_reduced_in_fp32_and_computed_on_tensor_cores():
    gpt, bf16 = MODELS["GPT-3 1.3B"], "bf16 with fp32 gradients"
    held = 1_300_000_000 // 8
    # data parallel: an all-reduce; ZeRO-1: a reduce-scatter and an all-gather; ZeRO-3: m × (RS + 2 AG)
    for zero, expected in ((0, 2 * 3 / 4 * held * 4), (1, 3 / 4 * held * (4 + 2)),
                           (3, 16 * 3 / 4 * held * (4 + 2 * 2))):
        option = choosing.evaluate(gpt, H100, 512, Layout(4, zero, 2, 4, 16), precision=bf16)
        assert option.sent["dp"] == pytest.approx(expected), zero          # reduced in 4 bytes, gathered in 2
    mixed = choosing.evaluate(gpt, H100, 512, Layout(4, 1, 2, 4, 16))
    option = choosing.evaluate(gpt, H100, 512, Layout(4, 1, 2, 4, 16), precision=bf16)
    assert option.seconds["compute"] == mixed.seconds["compute"]                  # the bf16 peak, as "mixed"
    assert option.memory["activations"] == mixed.memory["activations"]             # 16-bit activations
    assert option.seconds["dp"] > mixed.seconds["dp"]


def test_the_bubble_stretches_compute_by_hand():
    layout = Layout(dp=1, zero=0, tp=1, pp=4, m=4)
    option = choosing.evaluate(MLP, LOCAL_MACHINE, 64, layout, precision="fp32")
    compute = 6 * 29_770 * 64 / 4 / choosing.LOCAL_CPU.flops                  # efficiency 1: a measured rate
    assert option.seconds["compute"] == pytest.approx(compute)
    # bubble (N-1)/(m+N-1) = 3/7 of the stretched time: compute / (1 - 3/7) = compute × 7/4
    assert option.seconds["bubble"] == pytest.approx(compute * 3 / 4)
    boundary = 16 * 64 * 4
    assert option.seconds["pp"] == pytest.approx(2 * 4 * (timemodel.LOCAL_GLOO.alpha
                                                          + boundary / timemodel.LOCAL_GLOO.beta))
    assert option.seconds["total"] == pytest.approx(compute * 7 / 4 + option.seconds["pp"])
    assert option.seconds["dp"] == option.seconds["tp"] == 0


def test_compute_by_hand_on_h100s():
    gpt = MODELS["GPT-3 6.7B"]
    option = choosing.evaluate(gpt, H100, 1024, Layout(64, 1, 1, 1, 8))
    # 6 FLOPs a parameter a token, attention's 12·L·s·h, and its forward again (recomputed): 16·L·s·h
    flop = (6 * 6.7e9 + 16 * 32 * 2048 * 4096) * 1024 * 2048
    assert option.seconds["compute"] == pytest.approx(flop / (64 * 989e12 * 0.5))
    fp32 = choosing.evaluate(gpt, H100, 1024, Layout(64, 1, 1, 1, 8), precision="fp32")
    assert fp32.seconds["compute"] == pytest.approx(flop / (64 * 67e12 * 0.5))
    # dp = 64 leaves the node: its ring runs over InfiniBand, a reduce-scatter and an all-gather
    shard = 2 * memory.shard(6_700_000_000, 64)
    assert option.seconds["dp"] == pytest.approx(2 * 63 * (5e-6 + shard / 50e9))


def test_gpt3_175b_fits_on_no_single_gpu():
    gpt = MODELS["GPT-3 175B"]
    for cluster in CLUSTERS.values():
        for m in (1, 2, 4, 8):
            assert not choosing.evaluate(gpt, cluster, 1536, Layout(1, 0, 1, 1, m)).fits
        found = choosing.options(gpt, cluster, 1536, nodes=1)
        assert found and not any(o.fits for o in found)
        assert choosing.fastest(found) is None


def test_the_fastest_fits_and_is_minimal():
    found = choosing.options(MODELS["GPT-3 6.7B"], H100, 1024, nodes=8)
    best = choosing.fastest(found)
    assert best.fits and best.memory["total"] <= 80e9
    assert all(best.seconds["total"] <= o.seconds["total"] * (1 + 1e-9) for o in found if o.fits)
    assert [o.seconds["total"] for o in found] == sorted(o.seconds["total"] for o in found)
    assert all(o.layout.dp * o.layout.tp * o.layout.pp == 64 for o in found)
    # LLaMA-2 7B on A100s of 40 GB: the fastest layout of all does not fit (all 32 layers' activations)
    found = choosing.options(MODELS["LLaMA-2 7B"], CLUSTERS["8 × A100 40 GB a node (NVLink 3, InfiniBand HDR)"],
                             1024, nodes=4)
    best = choosing.fastest(found)
    assert not found[0].fits and found[0].seconds["total"] < best.seconds["total"]
    assert found[0].layout == Layout(32, 1, 1, 1, 32) and best.layout == Layout(16, 1, 1, 2, 64)
    assert found[0].memory["total"] > 40e9 >= best.memory["total"]


def test_only_layouts_the_batch_splits_into():
    found = choosing.options(MLP, LOCAL_MACHINE, 8, nodes=2)                    # 4 ranks, 8 samples
    assert found and all(8 % (o.layout.dp * o.layout.m) == 0 and o.micro_batch >= 1 for o in found)
    assert choosing.options(MLP, H100, 8, nodes=128) == []       # 1024 ranks: at least 16 dp ranks for 8 samples
    assert all(o.layout.dp <= 8 for o in choosing.options(MLP, H100, 8, nodes=8))
    assert "does not split into 4 × 4" in choosing.why_not(MLP, 8, Layout(4, 0, 1, 1, 4))


# --- context parallelism (lab 7's ring attention), offered when asked for -----------------------------

def test_context_parallel_layouts_are_offered_only_when_asked_for():
    plain, with_cp = choosing.layouts(8, 8, 4), choosing.layouts(8, 8, 4, context=True)
    assert all(x.cp == 1 for x in plain)
    assert [x for x in with_cp if x.cp == 1] == plain               # lab 6's layouts unchanged
    assert {x.cp for x in with_cp} == {1, 2, 4, 8}
    assert all(x.dp * x.cp * x.tp * x.pp == 8 for x in with_cp)
    # one data-parallel rank beside cp = 2 still has a replica to share ZeRO's shards with
    assert Layout(1, 1, 4, 1, 1, 2) in with_cp and Layout(1, 1, 8, 1, 1, 1) not in with_cp
    assert Layout(2, 1, 1, 2, 4, 2).uses == "dp+zero+pp+cp"
    assert all(o.layout.cp == 1 for o in choosing.options(MODELS["GPT-3 1.3B"], H100, 512))


def test_a_context_parallel_layout_by_hand():
    llama, s, h = MODELS["LLaMA-2 7B"], 4096, 4096          # 32 layers, 32 heads
    layout = Layout(dp=2, zero=1, tp=1, pp=1, m=1, cp=4)    # 8 H100s; each sample's 4096 tokens over 4 ranks
    got = choosing.evaluate(llama, H100, 8, layout)
    b = 8 // 2                                              # the dp ranks split the batch; cp splits each sample
    # Table 2, selective, 16 bits, no dropout's masks (LLaMA-2 has none): 32·s·b·h a layer, of this rank's
    # s/4 tokens; one micro-batch alive, 32 layers
    assert got.memory["activations"] == 32 * 32 * (s // 4) * b * h
    # its weights' state sharded over the 8 ranks that hold them whole (dp·cp), as ZeRO-1 shards
    assert got.memory == memory.per_rank(7_000_000_000, 8, "ZeRO-1", activations=32 * 32 * (s // 4) * b * h)
    mixed = memory.PRECISIONS["mixed"]
    assert got.sent["dp"] == memory.sent_per_step(7_000_000_000, 8, "ZeRO-1", dtype=mixed.gradients,
                                                  gather_dtype=mixed.parameters)
    # ring attention, a layer: a K and a V block of s/4 tokens, in bf16, passed on 3 times forward and 3 times
    # backward, and the blocks' gradients 4 steps back to their owners: 10 blocks
    block = 2 * (s // 4) * b * h * 2
    assert got.sent["cp"] == 32 * 10 * block
    assert got.sent["tp"] == got.sent["pp"] == 0
    nvlink = H100.inside                                    # the 4 ranks of a cp group share a node
    assert got.seconds["cp"] == pytest.approx(32 * (10 * nvlink.alpha + 10 * block / nvlink.beta))
    # the FLOPs are the 8 GPUs' to share, as without cp
    same_gpus = choosing.evaluate(llama, H100, 8, Layout(8, 1, 1, 1, 1))
    assert got.seconds["compute"] == pytest.approx(same_gpus.seconds["compute"])
    assert got.memory["activations"] == same_gpus.memory["activations"]   # b = 1 sample, all of it, on each


def test_context_parallelism_lets_a_long_sequence_fit():
    # LLaMA-2 7B at 32k tokens, 8 sequences a step on one node of 8 H100s
    long = dataclasses.replace(MODELS["LLaMA-2 7B"], name="LLaMA-2 7B at 32k", sequence=32_768, batch=8)
    plain, with_cp = choosing.options(long, H100, 8), choosing.options(long, H100, 8, context=True)
    fitting = [o for o in plain if o.fits]
    assert fitting and all(o.layout.tp >= 4 for o in fitting)   # without cp, only 4- and 8-way tp fit
    best = choosing.fastest(with_cp)
    assert best.layout.cp > 1 and best.seconds["total"] < choosing.fastest(plain).seconds["total"]
    assert sum(o.fits for o in with_cp) > len(fitting)


@pytest.mark.parametrize("nodes", [8, 32])
def test_lab_6_s_claim_on_context_parallelism_for_the_presets(nodes):
    # Lab 6: ticked, the fastest layout of GPT-3 175B, LLaMA-2 70B and Mixtral splits each sequence over 2 to
    # 8 ranks, a few percent faster; the smaller dense ones' does not change at their own sequence lengths.
    for name, model in MODELS.items():
        if model.is_mlp:
            continue
        plain = choosing.fastest(choosing.options(model, H100, model.batch, nodes=nodes))
        with_cp = choosing.fastest(choosing.options(model, H100, model.batch, nodes=nodes, context=True))
        if name in ("GPT-3 175B", "LLaMA-2 70B", choosing.MIXTRAL):
            assert with_cp.layout.cp in (2, 4, 8), (name, with_cp.layout)
            assert 0.9 < with_cp.seconds["total"] / plain.seconds["total"] < 1, (name, with_cp.seconds, plain.seconds)
        else:      # "the smaller dense presets"
            assert with_cp.layout == plain.layout, (name, with_cp.layout, plain.layout)


def test_grouped_query_attention_s_ring_bytes_by_hand():
    # Ring attention's bytes a layer, LLaMA-2 70B at 131,072 tokens on 16 ranks, bf16, one sequence:
    # 46 blocks (15 forward, 15 again backward, 16 gradient accumulators home) of K and V, each
    # 2 · (s/N) · b · h_kv · e bytes. Full width (h_kv = h = 8192): 46 · 2 · 8192 · 8192 · 2 = 12.35 GB; its
    # 8 K/V heads of 128 (h_kv = 1024): 1.54 GB, 8 times less.
    llama, mixtral = MODELS["LLaMA-2 70B"], MODELS[choosing.MIXTRAL]
    assert (llama.key_value_heads, llama.kv_width, mixtral.key_value_heads, mixtral.kv_width) == (8, 1024, 8, 1024)
    assert MODELS["GPT-3 175B"].kv_width == 12288 and MODELS["LLaMA-2 7B"].kv_width == 4096   # multi-head
    whole = activations.ring_attention_sent(131_072, 1, 8192, 16, element_bytes=2)
    grouped = activations.ring_attention_sent(131_072, 1, 8192, 16, element_bytes=2, kv_width=llama.kv_width)
    assert whole == 46 * 2 * 8192 * 8192 * 2 and round(whole / 1e9, 2) == 12.35
    assert grouped == 46 * 2 * 8192 * 1024 * 2 and round(grouped / 1e9, 2) == 1.54
    assert activations.all_gather_kv_sent(131_072, 1, 8192, 16, element_bytes=2, kv_width=1024) == pytest.approx(
        activations.all_gather_kv_sent(131_072, 1, 8192, 16, element_bytes=2) / 8)
    # the chooser's cp bytes use it: each tp rank its K/V heads' share, Mixtral 32 heads over 8 K/V: 4 times less
    for model, fewer in ((llama, 8), (mixtral, 4)):
        layout = Layout(dp=2, zero=1, tp=2, pp=1, m=4, cp=4)
        multi_head = dataclasses.replace(model, kv_heads=0)
        got, full = (choosing.evaluate(m, H100, 8, layout, sequence_parallel=True) for m in (model, multi_head))
        assert got.sent["cp"] == pytest.approx(full.sent["cp"] / fewer), model.name
        b, layers = 8 // (2 * 4), model.layers * 4
        assert got.sent["cp"] == pytest.approx(layers * activations.ring_attention_sent(
            model.sequence, b, model.hidden // 2, 4, element_bytes=2, kv_width=model.kv_width // 2))
    # tp must divide the K/V heads, as Megatron-LM asks; a width past h is refused in words
    assert "8 key/value heads do not split over 16 tp ranks" in choosing.why_not(llama, 1024, Layout(1, 0, 16, 1, 1))
    with pytest.raises(ValueError, match="kv_width is the width of K and of V"):
        activations.ring_attention_sent(1024, 1, 64, 2, kv_width=128)
    with pytest.raises(ValueError, match="8 key/value heads must divide its 12 heads"):
        dataclasses.replace(llama, name="bad", heads=12)


def test_context_parallelism_needs_a_sequence_it_splits_in_2_cp_chunks():
    assert "no sequence for context parallelism" in choosing.why_not(MLP, 64, Layout(1, 0, 1, 1, 1, 2))
    gpt = MODELS["GPT-3 1.3B"]                              # 2048 tokens: 2 × 1024 chunks, not 2 × 3
    assert choosing.why_not(gpt, 512, Layout(1, 0, 1, 1, 1, 1024)) is None
    assert "does not split into 2 × 3 chunks" in choosing.why_not(gpt, 512, Layout(1, 0, 1, 1, 1, 3))
    assert all(o.layout.cp == 1 for o in choosing.options(MLP, H100, 64, context=True))


@pytest.mark.parametrize("call, words", [
    (lambda: choosing.layouts(0, 8, 8), "number of gpus must be a whole number of at least 1, got gpus=0"),
    (lambda: choosing.options(MLP, H100, 64, nodes=0), "got nodes=0"),
    (lambda: choosing.options("GPT-3", H100, 64), "must be a choosing.Model and a choosing.Cluster"),
    (lambda: choosing.evaluate(MLP, H100, 64, Layout(1, 2, 1, 1, 1)), "0 when dp·cp = 1"),
    (lambda: choosing.evaluate(MLP, H100, 64, Layout(2, 0, 1, 1, 1), precision="fp8"), "precision must be one of"),
    (lambda: choosing.evaluate(MLP, H100, 64, Layout(2, 0, 1, 1, 1), schedule="zb"), "schedule must be one of"),
    (lambda: choosing.evaluate(MLP, H100, 64, Layout(2, 0, 1, 1, 1), recompute=True), "recompute must be one of"),
    (lambda: choosing.evaluate(MLP, H100, 64, Layout(2, 0, 1, 1, 1), sequence_parallel="yes"),
     "sequence_parallel must be True or False"),
    (lambda: activations.layer_bytes(2048, 1, 4096, 32, recompute="flash"), "recompute must be one of"),
    (lambda: choosing.evaluate(MLP, H100, 60, Layout(8, 0, 1, 1, 1)), "batch of 60 does not split into 8 × 1"),
    (lambda: choosing.evaluate(MODELS["GPT-3 1.3B"], CLUSTERS["8 × A100 40 GB a node (NVLink 3, InfiniBand HDR)"],
                               512, Layout(1, 0, 1, 1, 1), optimizer="lion"), "optimizer must be one of"),
])
def test_bad_arguments_are_refused_in_words(call, words):
    with pytest.raises((ValueError, TypeError), match=words):
        call()
