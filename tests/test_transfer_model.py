"""Covers: course.sizes, course.timemodel, course.transfer.

The transfer-size and time models (course.sizes, course.timemodel) against
the sources' figures (shared reference-figures.md) and their own formulas, and
the one argument check of every cost model (course.transfer.check_ranks and
check_nbytes)."""
from __future__ import annotations

import numpy as np
import pytest

from course import grid_model, sizes, timemodel, transfer
from course.sizes import Conv, Dense
from course.timemodel import DETTMERS_BLOG, DETTMERS_GRADIENT_BYTES, NETWORK_40G, PCIE3_X16, Link

MS = 1e-3


# --- sizes ---------------------------------------------------------------------

def test_dettmers_gradient_is_four_million_bytes():
    layer = Dense("fc", 1000, 1000, bias=False)
    assert sizes.nbytes(layer.weights, "float32") == 4_000_000 == DETTMERS_GRADIENT_BYTES


def test_data_parallelism_of_the_model_parallel_example_moves_500000_elements():
    # Dettmers part 2: the 1000 x 500 weight's whole gradient, once per step.
    assert Dense("fc", 1000, 500, bias=False).weights == 500_000


def test_layer_shapes():
    assert Dense("fc", 3, 4).weights == 16 and Dense("fc", 3, 4, bias=False).weights == 12
    assert Dense("fc", 3, 4).activations(batch=5) == 20
    conv = Conv("conv", in_channels=1, out_channels=16, kernel=3, height=8, width=8)
    assert conv.weights == 16 * 9 + 16
    assert conv.activations(batch=2) == 2 * 16 * 64


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
def test_ring_data_parallel_sends_2_n_minus_1_over_n_of_each_gradient(ranks):
    layers = [Dense("a", 100, 30), Dense("b", 30, 10)]
    rows = sizes.data_parallel(layers, ranks, "float32")
    assert [r["layer"] for r in rows] == ["a", "b"]
    for row, layer in zip(rows, layers):
        assert row["elements"] == layer.weights
        assert row["bytes"] == 4 * layer.weights
        assert row["sent"] == pytest.approx(2 * (ranks - 1) / ranks * row["bytes"])
    assert sizes.data_parallel_total(layers, ranks, "float16") == pytest.approx(
        sum(2 * (ranks - 1) / ranks * 2 * layer.weights for layer in layers))


def test_naive_all_reduce_makes_the_root_the_bottleneck():
    layers = [Dense("a", 1000, 1000, bias=False)]
    root = sizes.data_parallel_total(layers, 4, algorithm="naive", rank=0)
    other = sizes.data_parallel_total(layers, 4, algorithm="naive", rank=2)
    ring = sizes.data_parallel_total(layers, 4, algorithm="ring")
    assert (root, other, ring) == (12_000_000, 4_000_000, 6_000_000)
    assert transfer.naive_all_reduce_sends(100, 1, 0) == 0


def test_bad_arguments_say_what_is_allowed():
    with pytest.raises(ValueError, match="dtype must be one of"):
        sizes.nbytes(10, "int7")
    with pytest.raises(ValueError, match="algorithm must be one of"):
        sizes.all_reduce_sent(10, 2, "tree")
    with pytest.raises(ValueError, match=r"rank 5 must lie in 0\.\.3"):
        transfer.naive_all_reduce_sends(10, 4, 5)


@pytest.mark.parametrize("sends", [transfer.naive_all_reduce_sends, transfer.chain_sends,
                                   transfer.binomial_tree_sends])
@pytest.mark.parametrize("rel_rank", [-1, 4, 1.0, True])
def test_a_rank_outside_the_group_is_refused_by_every_per_rank_formula(sends, rel_rank):
    """A rank past the last (or not a whole number) would silently count as one that sends nothing."""
    message = f"rel_rank {rel_rank!r} must lie in 0..3: a rank counted from the root, among 4 ranks"
    with pytest.raises(ValueError) as refused:
        sends(10, 4, rel_rank)
    assert str(refused.value) == message


# --- time model -------------------------------------------------------------------

def test_a_dettmers_gradient_over_40_gbit_takes_about_0_8_ms():
    seconds = NETWORK_40G.seconds(DETTMERS_GRADIENT_BYTES)
    assert 0.75 * MS <= seconds <= 0.81 * MS


def test_pcie_3_is_about_three_times_as_fast_as_the_network():
    ratio = NETWORK_40G.seconds(DETTMERS_GRADIENT_BYTES) / PCIE3_X16.seconds(DETTMERS_GRADIENT_BYTES)
    assert 2.9 <= ratio <= 3.2
    assert PCIE3_X16.seconds(DETTMERS_GRADIENT_BYTES) == pytest.approx(DETTMERS_BLOG["one transfer, PCIe 3.0"],
                                                                       rel=0.1)


def test_the_blogs_own_rule_gives_6_75_and_20_25_ms():
    # Network-card time only, one GPU at a time per node, PCIe in parallel: 3 x 3 and 9 x 3 transfers.
    assert timemodel.dettmers_transfers_in_a_row(2) == 3 * 3
    assert timemodel.dettmers_transfers_in_a_row(4) == 9 * 3
    assert timemodel.dettmers_rule_seconds(2) == pytest.approx(6.75 * MS)
    assert timemodel.dettmers_rule_seconds(4) == pytest.approx(20.25 * MS) == DETTMERS_BLOG["four nodes"]
    # The blog's two-node figure is 1 ms more than its own rule gives.
    assert DETTMERS_BLOG["six GPUs, two nodes"] - timemodel.dettmers_rule_seconds(2) == pytest.approx(1 * MS)
    # The rule, with a link that takes exactly the blog's 0.75 ms a transfer, is the same function.
    blog_network = Link("blog", beta=DETTMERS_GRADIENT_BYTES / 0.75e-3, alpha=0.0, source="the blog")
    for nodes in (2, 4):
        assert timemodel.dettmers_serial_network_seconds(nodes, network=blog_network) == pytest.approx(
            timemodel.dettmers_rule_seconds(nodes))


def test_the_models_own_figures_beside_the_blog():
    # The same rule with this model's 40 Gbit/s link (0.805 ms a transfer) ...
    assert timemodel.dettmers_serial_network_seconds(2) == pytest.approx(9 * 0.805 * MS)
    assert timemodel.dettmers_serial_network_seconds(4) == pytest.approx(27 * 0.805 * MS)
    # ... and one ring all-reduce through all GPUs, which the blog did not consider: 5x and 12x faster.
    ring2 = timemodel.flat_ring_all_reduce_seconds(DETTMERS_GRADIENT_BYTES, 2, 3, PCIE3_X16, NETWORK_40G)
    ring4 = timemodel.flat_ring_all_reduce_seconds(DETTMERS_GRADIENT_BYTES, 4, 3, PCIE3_X16, NETWORK_40G)
    assert ring2 == pytest.approx(10 * (5e-6 + DETTMERS_GRADIENT_BYTES / 6 / 5e9))
    assert ring4 == pytest.approx(22 * (5e-6 + DETTMERS_GRADIENT_BYTES / 12 / 5e9))
    assert ring2 < DETTMERS_BLOG["six GPUs, two nodes"] / 5 and ring4 < DETTMERS_BLOG["four nodes"] / 12


def test_the_part_1_table_holds_the_blog_its_rule_and_the_model():
    rows = {row["figure"]: row for row in timemodel.dettmers_part_1()}
    one = rows["one transfer of 4,000,000 bytes (ms)"]
    assert (one["the blog"], one["the blog's rule"]) == (0.75, 0.75)
    assert one["this model"] == pytest.approx(0.805)           # 4e6 B / 5e9 B/s + 5 us
    two, four = rows["6 GPUs in 2 nodes (ms)"], rows["12 GPUs in 4 nodes (ms)"]
    assert [two["the blog"], two["the blog's rule"], two["this model"]] == pytest.approx([7.75, 6.75, 9 * 0.805])
    assert [four["the blog"], four["the blog's rule"], four["this model"]] == pytest.approx([20.25, 20.25, 27 * 0.805])
    matmul = rows["forward of the layer, 100x1000 . 1000x1000 (ms)"]
    # 2 x 100 x 1000 x 1000 flop on a TITAN at half its 4.5 TFLOPS: less than the blog's 0.2 ms
    assert matmul["this model"] == pytest.approx(2e8 / 2.25e12 * 1e3) and matmul["this model"] < matmul["the blog"]
    quoted = [(r["the blog"], r["the blog's rule"], r["this model"])
              for what, r in rows.items() if "Krizhevsky" in what]
    assert quoted == [(3.74, None, None), (6.25, None, None)]
    faster = {r["figure"]: r for r in timemodel.dettmers_part_1(network=timemodel.INFINIBAND_NDR)}
    assert faster["6 GPUs in 2 nodes (ms)"]["this model"] == pytest.approx(9 * (5e-6 + 4e6 / 50e9) * 1e3)


def test_the_ring_time_is_a_flat_bandwidth_term_and_a_growing_latency_term():
    nbytes = 8e6
    for ranks in (1, 2, 4, 16):
        terms = timemodel.ring_all_reduce_terms(nbytes, ranks, NETWORK_40G)
        assert terms["latency"] == pytest.approx(2 * (ranks - 1) * 5e-6)
        assert terms["bandwidth"] == pytest.approx(2 * (ranks - 1) / ranks * nbytes / 5e9)
        assert sum(terms.values()) == pytest.approx(timemodel.ring_all_reduce_seconds(nbytes, ranks, NETWORK_40G))
    # from 4 ranks to 64 the bandwidth term grows by a quarter at most; the latency term 21-fold
    few, many = (timemodel.ring_all_reduce_terms(nbytes, n, NETWORK_40G) for n in (4, 64))
    assert many["bandwidth"] / few["bandwidth"] == pytest.approx((63 / 64) / (3 / 4))
    assert many["latency"] / few["latency"] == pytest.approx(21)


def test_the_hierarchical_all_reduce_by_hand():
    # 2 nodes of 4 GPUs, 8 MB: reduce-scatter and all-gather inside, 3 steps each of 2 MB over
    # NVLink 4; then 4 rings of 2 nodes at once, each 2 steps of 1 MB over its own NDR card.
    nvlink = 3 * (2e-6 + 2e6 / 450e9)
    network = 2 * (5e-6 + 1e6 / 50e9)
    seconds = timemodel.hierarchical_ring_all_reduce_seconds(8e6, 2, 4, timemodel.NVLINK4, timemodel.INFINIBAND_NDR)
    assert seconds == pytest.approx(2 * nvlink + network)
    # through one card per node, the 4 rings' messages go one after the other
    one_card = timemodel.hierarchical_ring_all_reduce_seconds(8e6, 2, 4, timemodel.NVLINK4,
                                                              timemodel.INFINIBAND_NDR, nics_per_node=1)
    assert one_card == pytest.approx(2 * nvlink + 4 * network)
    # one node: a ring over NVLink; one GPU per node: a ring over the network
    assert timemodel.hierarchical_ring_all_reduce_seconds(8e6, 1, 4, timemodel.NVLINK4, NETWORK_40G) == \
        pytest.approx(timemodel.ring_all_reduce_seconds(8e6, 4, timemodel.NVLINK4))
    assert timemodel.hierarchical_ring_all_reduce_seconds(8e6, 4, 1, timemodel.NVLINK4, NETWORK_40G) == \
        pytest.approx(timemodel.ring_all_reduce_seconds(8e6, 4, NETWORK_40G))


@pytest.mark.parametrize("nodes, per_node, inside, between, nics", [
    (2, 3, PCIE3_X16, NETWORK_40G, 3),                       # Dettmers' nodes, with a card per GPU
    (4, 3, PCIE3_X16, NETWORK_40G, 3),
    (2, 3, PCIE3_X16, NETWORK_40G, 1),                       # ... and with the one card they had
    (2, 8, timemodel.NVLINK4, timemodel.INFINIBAND_NDR, 8),  # two DGX H100
    (16, 8, timemodel.NVLINK5, timemodel.INFINIBAND_NDR, 8),
])
def test_the_hierarchical_all_reduce_beats_the_flat_ring_when_the_network_is_slow(nodes, per_node, inside, between,
                                                                                   nics):
    for nbytes in (1e6, 4e6, 1e9):
        flat = timemodel.flat_ring_all_reduce_seconds(nbytes, nodes, per_node, inside, between)
        two_level = timemodel.hierarchical_ring_all_reduce_seconds(nbytes, nodes, per_node, inside, between, nics)
        assert two_level < flat, (nbytes, two_level, flat)


def test_through_one_card_per_node_the_hierarchy_can_lose():
    # The G rings then share one card: it carries 2(M-1)/M of the gradient, about what the flat
    # ring puts through it, plus the steps inside the node. Four of Dettmers' nodes: slower.
    flat = timemodel.flat_ring_all_reduce_seconds(1e9, 4, 3, PCIE3_X16, NETWORK_40G)
    two_level = timemodel.hierarchical_ring_all_reduce_seconds(1e9, 4, 3, PCIE3_X16, NETWORK_40G, nics_per_node=1)
    assert flat == pytest.approx(22 * (5e-6 + 1e9 / 12 / 5e9))
    assert two_level == pytest.approx(4 * (10e-6 + 1e9 / 3 / 15.75e9) + 6 * 3 * (5e-6 + 1e9 / 12 / 5e9))
    assert two_level > flat


def test_the_hierarchical_all_reduce_refuses_a_node_without_a_network_card():
    with pytest.raises(ValueError, match="network cards must be a whole number of at least 1, got nics_per_node=0"):
        timemodel.hierarchical_ring_all_reduce_seconds(1e6, 2, 4, PCIE3_X16, NETWORK_40G, nics_per_node=0)


def test_todays_presets_are_the_datasheets_dense_figures():
    bf16 = {timemodel.A100_BF16: 312e12, timemodel.H100_BF16: 989e12, timemodel.H200_BF16: 989e12,
            timemodel.B200_BF16: 2.25e15}
    for processor, peak in bf16.items():
        assert processor.flops == peak and processor.precision == "bfloat16", processor.name
        assert "dense" in processor.source and "datasheet" in processor.source, processor.name
        assert timemodel.processor_named(processor.name) is processor
    for processor in (timemodel.TITAN, timemodel.A100, timemodel.H100):
        assert processor.precision == "float32" and "float32" in processor.source
    assert timemodel.NVLINK4.beta == 450e9 and timemodel.NVLINK5.beta == 900e9
    assert timemodel.INFINIBAND_NDR.beta == 400e9 / 8
    for link in (timemodel.NVLINK4, timemodel.NVLINK5, timemodel.INFINIBAND_NDR):
        assert timemodel.link_named(link.name) is link and "datasheet" in link.source, link.name
    for link in timemodel.PRESETS.values():     # every link says where its figures come from
        assert "per direction" in link.source or "measured" in link.name, link.name
        assert "latency assumed" in link.source or "alpha" in link.source, link.name


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_ring_beats_naive_and_both_vanish_on_one_gpu(ranks):
    for link in timemodel.PRESETS.values():
        ring = timemodel.ring_all_reduce_seconds(DETTMERS_GRADIENT_BYTES, ranks, link)
        naive = timemodel.naive_all_reduce_seconds(DETTMERS_GRADIENT_BYTES, ranks, link)
        assert ring < naive, link.name
        assert timemodel.ring_all_reduce_seconds(DETTMERS_GRADIENT_BYTES, 1, link) == 0.0
    assert timemodel.ring_all_reduce_seconds(0, ranks, NETWORK_40G) == pytest.approx(2 * (ranks - 1) * 5e-6)


def test_every_preset_states_its_source_and_rejects_bad_sizes():
    for name, link in timemodel.PRESETS.items():
        assert link.name == name and link.source and link.beta > 0 and link.alpha >= 0
    with pytest.raises(ValueError, match="cannot be negative"):
        NETWORK_40G.seconds(-1)
    with pytest.raises(ValueError, match="at least 1"):
        timemodel.ring_all_reduce_seconds(10, 0, NETWORK_40G)


def test_dettmers_layer_compute_against_its_transfer():
    # 100 x 1000 . 1000 x 1000: 2e8 flop forward, twice that backward.
    layer = Dense("fc", 1000, 1000, bias=False)
    assert layer.training_flop(100) == 3 * 2 * 100 * 1000 * 1000
    forward = timemodel.TITAN.seconds(2 * 100 * 1000 * 1000)
    # The blog measured about 0.2 ms; this model's TITAN at half its peak says 0.09 ms.
    assert timemodel.DETTMERS_BLOG_MATMUL_SECONDS == 0.2 * MS and timemodel.DETTMERS_MATMUL_BATCH == 100
    assert forward == pytest.approx(0.0889 * MS, rel=1e-3)
    # Either way communication dominates: one 40 Gbit/s transfer outlasts forward + backward.
    assert NETWORK_40G.seconds(DETTMERS_GRADIENT_BYTES) > 3 * 0.2 * MS > 3 * forward


def test_conv_flop_counts_every_output_position():
    conv = Conv("conv", in_channels=3, out_channels=8, kernel=3, height=10, width=10)
    assert conv.training_flop(2) == 6 * 3 * 8 * 9 * 100 * 2


# --- split-weight model parallelism (Dettmers, part 2) ------------------------------

DETTMERS_LAYER = sizes.Dense("fc", 1000, 500, bias=False)   # 128×1000 · 1000×500, 2 GPUs


def test_dettmers_split_shapes_match_the_post():
    column = sizes.split_weight(DETTMERS_LAYER, 128, 2, "column")
    assert column["weight"] == (1000, 250)
    assert (column["forward"], column["forward combine"]) == ((128, 250), "stack")
    assert (column["backward"], column["backward combine"]) == ((128, 1000), "add")
    row = sizes.split_weight(DETTMERS_LAYER, 128, 2, "row")
    assert row["weight"] == (500, 500)
    assert (row["forward"], row["forward combine"]) == ((128, 500), "add")
    assert (row["backward"], row["backward combine"]) == ((128, 500), "stack")


def test_the_exact_count_beside_the_blog_and_data_parallelism():
    # The two matrices the ranks must agree on: 128×500 forward + 128×1000 backward.
    for direction in sizes.DIRECTIONS:
        assert sizes.split_weight(DETTMERS_LAYER, 128, 2, direction)["synchronised"] == 192_000
    assert DETTMERS_LAYER.weights == 500_000                       # data parallelism's gradient
    # What one rank sends with ring collectives on 2 GPUs: the blog's two totals.
    sent = {d: sizes.split_weight_sent(DETTMERS_LAYER, 128, 2, d, "float32") / 4 for d in sizes.DIRECTIONS}
    assert sent == {"column": 160_000, "row": 128_000}


def test_split_weight_refuses_uneven_splits_and_unknown_directions():
    with pytest.raises(ValueError, match="divide evenly over 3 ranks"):
        sizes.split_weight(DETTMERS_LAYER, 128, 3, "column")
    with pytest.raises(ValueError, match="direction must be one of"):
        sizes.split_weight(DETTMERS_LAYER, 128, 2, "diagonal")


def test_ring_all_gather_takes_n_minus_1_steps_of_one_chunk():
    link = timemodel.PCIE3_X16
    assert timemodel.ring_all_gather_seconds(8e6, 1, link) == 0.0
    assert timemodel.ring_all_gather_seconds(8e6, 4, link) == pytest.approx(3 * (link.alpha + 2e6 / link.beta))
    # half an all-reduce's steps: an all-reduce is a reduce-scatter and an all-gather
    assert 2 * timemodel.ring_all_gather_seconds(8e6, 4, link) == pytest.approx(
        timemodel.ring_all_reduce_seconds(8e6, 4, link))


def test_split_weight_transfers_gather_what_is_stacked_and_reduce_what_is_added():
    assert sizes.split_weight_transfers(DETTMERS_LAYER, 128, 2, "column") == [
        ("all-gather", 4 * 128 * 500), ("all-reduce", 4 * 128 * 1000)]
    assert sizes.split_weight_transfers(DETTMERS_LAYER, 128, 2, "row", "float16") == [
        ("all-reduce", 2 * 128 * 500), ("all-gather", 2 * 128 * 1000)]


# --- one argument check for every cost model -----------------------------------------

def ranks_message(name: str, value) -> str:
    return f"the number of ranks must be a whole number of at least 1, got {name}={value!r}"


def bytes_message(name: str, value) -> str:
    return f"a size in bytes must be a number of at least 0 (it cannot be negative), got {name}={value!r}"


LAYER = Dense("d", 4, 4)   # splits over 1, 2 and 4 ranks

#: every public entry point of the four cost models that takes a number of ranks, as
#: (call(nbytes, ranks), the ranks argument's name, the bytes argument's name or None)
RANK_ENTRY_POINTS = [
    pytest.param(lambda b, r: transfer.ring_reduce_scatter(b, r), "ranks", "nbytes", id="transfer.ring_reduce_scatter"),
    pytest.param(lambda b, r: transfer.ring_all_gather(b, r), "ranks", "nbytes_out", id="transfer.ring_all_gather"),
    pytest.param(lambda b, r: transfer.ring_all_reduce(b, r), "ranks", "nbytes", id="transfer.ring_all_reduce"),
    pytest.param(lambda b, r: transfer.naive_all_reduce_sends(b, r, 0), "ranks", "nbytes",
                 id="transfer.naive_all_reduce_sends"),
    pytest.param(lambda b, r: transfer.chain_sends(b, r, 0), "ranks", "nbytes", id="transfer.chain_sends"),
    pytest.param(lambda b, r: transfer.binomial_tree_sends(b, r, 0), "ranks", "nbytes",
                 id="transfer.binomial_tree_sends"),
    pytest.param(lambda b, r: transfer.predict("all_reduce", b, r), "ranks", "nbytes", id="transfer.predict"),
    pytest.param(lambda b, r: sizes.all_reduce_sent(b, r), "ranks", "tensor_bytes", id="sizes.all_reduce_sent"),
    pytest.param(lambda b, r: sizes.data_parallel([LAYER], r), "ranks", None, id="sizes.data_parallel"),
    pytest.param(lambda b, r: sizes.data_parallel_total([LAYER], r), "ranks", None, id="sizes.data_parallel_total"),
    pytest.param(lambda b, r: sizes.split_weight(LAYER, 8, r, "column"), "ranks", None, id="sizes.split_weight"),
    pytest.param(lambda b, r: sizes.split_weight_transfers(LAYER, 8, r, "row"), "ranks", None,
                 id="sizes.split_weight_transfers"),
    pytest.param(lambda b, r: sizes.split_weight_sent(LAYER, 8, r, "row"), "ranks", None,
                 id="sizes.split_weight_sent"),
    pytest.param(lambda b, r: sizes.split_weight_crossover(LAYER, r, "row"), "ranks", None,
                 id="sizes.split_weight_crossover"),
    pytest.param(lambda b, r: timemodel.ring_all_reduce_seconds(b, r, PCIE3_X16), "ranks", "nbytes",
                 id="timemodel.ring_all_reduce_seconds"),
    pytest.param(lambda b, r: timemodel.ring_all_gather_seconds(b, r, PCIE3_X16), "ranks", "nbytes_out",
                 id="timemodel.ring_all_gather_seconds"),
    pytest.param(lambda b, r: timemodel.naive_all_reduce_seconds(b, r, PCIE3_X16), "ranks", "nbytes",
                 id="timemodel.naive_all_reduce_seconds"),
    pytest.param(lambda b, r: timemodel.hierarchical_ring_all_reduce_seconds(b, 2, r, PCIE3_X16, NETWORK_40G),
                 "ranks_per_node", "nbytes", id="timemodel.hierarchical_ring_all_reduce_seconds"),
    pytest.param(lambda b, r: timemodel.flat_ring_all_reduce_seconds(b, 2, r, PCIE3_X16, NETWORK_40G),
                 "ranks_per_node", "nbytes", id="timemodel.flat_ring_all_reduce_seconds"),
    pytest.param(lambda b, r: timemodel.ring_all_reduce_terms(b, r, PCIE3_X16), "ranks", "nbytes",
                 id="timemodel.ring_all_reduce_terms"),
    pytest.param(lambda b, r: timemodel.dettmers_serial_network_seconds(2, r, b), "ranks_per_node", "nbytes",
                 id="timemodel.dettmers_serial_network_seconds"),
    pytest.param(lambda b, r: grid_model.Grid(r, 1), "data", None, id="grid_model.Grid data"),
    pytest.param(lambda b, r: grid_model.Grid(1, r), "model", None, id="grid_model.Grid model"),
    pytest.param(lambda b, r: grid_model.transfers(grid_model.convnet_layers(), grid_model.Grid(r, 2), 8),
                 "data", None, id="grid_model.transfers"),
]


@pytest.mark.parametrize("call, ranks_name, bytes_name", RANK_ENTRY_POINTS)
@pytest.mark.parametrize("ranks", [0, -2])
def test_too_few_ranks_say_so_the_same_way_everywhere(call, ranks_name, bytes_name, ranks):
    with pytest.raises(ValueError) as refused:
        call(1000, ranks)
    assert str(refused.value) == ranks_message(ranks_name, ranks)


@pytest.mark.parametrize("call, ranks_name, bytes_name", RANK_ENTRY_POINTS)
@pytest.mark.parametrize("ranks", [2.0, 2.5, True, "2"])
def test_a_number_of_ranks_that_is_not_a_whole_number_is_refused_everywhere(call, ranks_name, bytes_name,
                                                                             ranks):
    # 2.0 would give float shapes and bytes, True would count as 1 rank: neither is let through
    with pytest.raises(TypeError) as refused:
        call(1000, ranks)
    assert str(refused.value) == ranks_message(ranks_name, ranks)


BYTES_ENTRY_POINTS = [p for p in RANK_ENTRY_POINTS if p.values[2] is not None] + [
    pytest.param(lambda b, r: NETWORK_40G.seconds(b), None, "nbytes", id="timemodel.Link.seconds")]


@pytest.mark.parametrize("call, ranks_name, bytes_name", BYTES_ENTRY_POINTS)
def test_a_negative_size_in_bytes_says_so_the_same_way_everywhere(call, ranks_name, bytes_name):
    with pytest.raises(ValueError) as refused:
        call(-1, 2)
    assert str(refused.value) == bytes_message(bytes_name, -1)


@pytest.mark.parametrize("call, ranks_name, bytes_name", RANK_ENTRY_POINTS)
def test_numpy_integers_count_as_ranks(call, ranks_name, bytes_name):
    assert call(1000, np.int64(2)) == call(1000, 2)


def test_nodes_are_checked_by_the_same_rule():
    message = "^the number of nodes must be a whole number of at least 1, got nodes={}$"
    for seconds in (lambda nodes: timemodel.dettmers_serial_network_seconds(nodes),
                    lambda nodes: timemodel.dettmers_rule_seconds(nodes),
                    lambda nodes: timemodel.flat_ring_all_reduce_seconds(1000, nodes, 3, PCIE3_X16, NETWORK_40G),
                    lambda nodes: timemodel.hierarchical_ring_all_reduce_seconds(1000, nodes, 3, PCIE3_X16,
                                                                                 NETWORK_40G)):
        with pytest.raises(ValueError, match=message.format(0)):
            seconds(0)
        with pytest.raises(TypeError, match=message.format(r"2\.0")):
            seconds(2.0)
