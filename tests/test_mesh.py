"""Covers: course.mesh, course.recorder.

course.mesh: lab 9's grid from rank lists and from torch's DeviceMesh, on 4 ranks for four layouts: each rank's
coordinates, groups, pipeline neighbours, embedding and dp_cp groups, the tensor-parallel DeviceMesh; the
refusal of rank lists that make no grid (naming axis, group and rank); and course.recorder's records naming the
group each call ran on, so that bytes add up per axis."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

import course
from course import gpt, mesh, recorder

LAYOUTS = [{"dp": 2, "tp": 2}, {"pp": 2, "tp": 2}, {"cp": 2, "tp": 2}, {"pp": 2, "dp": 2}, {"tp": 4}]


def megatron_lists(sizes: dict) -> dict:
    """Test-only: each axis's groups in Megatron-LM's order, rank = ((p·DP + d)·CP + c)·TP + t."""
    sizes = mesh.sizes_of(sizes)
    shape = [sizes[a] for a in mesh.AXES]
    table = torch.arange(len(list(itertools.product(*map(range, shape))))).view(shape)
    out = {}
    for i, axis in enumerate(mesh.AXES):
        lines = table.movedim(i, -1).reshape(-1, sizes[axis])
        out[axis] = sorted(line.tolist() for line in lines)
    return out


def expected_place(rank: int, sizes: dict) -> dict:
    sizes = mesh.sizes_of(sizes)
    place = {}
    for axis in reversed(mesh.AXES):
        place[axis], rank = rank % sizes[axis], rank // sizes[axis]
    return place


def _describe(grid: mesh.Grid, config) -> dict:
    """What a rank knows of its grid, and an all-reduce of its rank on each of its groups (the sum tells who
    is in the group torch made)."""
    sums = {}
    for name, group in grid.groups.items():
        if group is not None:
            value = torch.tensor([float(grid.rank)])
            dist.all_reduce(value, group=group)
            sums[name] = float(value)
    return {"coords": grid.coords, "sizes": grid.sizes, "ranks": grid.ranks, "first": grid.first_stage,
            "last": grid.last_stage, "previous": grid.previous_rank, "next": grid.next_rank, "sums": sums,
            "describe": grid.describe(), "layers": list(grid.layers(config)),
            "tp mesh": grid.tp_mesh().mesh.tolist()}


def _messages_on_the_default_group(grid: mesh.Grid) -> list:
    """A message to the next stage on the default group, and how the grid names what this rank recorded:
    the pp axis for the message, by where its peer sits; None for the default group's all-reduce."""
    value = torch.zeros(3)
    if grid.next_rank is not None:
        dist.send(value, grid.next_rank)
    else:
        dist.recv(value, grid.previous_rank)
    dist.all_reduce(value)
    return [(r.op, grid.axis_of(r)) for r in recorder.active().log[-2:]]


def _every_layout(layouts):
    config = gpt.Config(layers=4)
    out = []
    for sizes in layouts:
        grid = mesh.Grid.from_rank_lists(megatron_lists(sizes))
        out.append({"lists": _describe(grid, config), "device mesh": _describe(mesh.Grid.from_device_mesh(sizes),
                                                                               config)})
        if grid.sizes["pp"] > 1:
            out[-1]["messages"] = _messages_on_the_default_group(grid)
    try:
        mesh.Grid.from_device_mesh({"dp": 3})
    except ValueError as error:
        out.append(str(error))
    return out


@pytest.fixture(scope="module")
def four_layouts():
    return course.launch(_every_layout, 4, args=(LAYOUTS,))


@pytest.mark.parametrize("builder", ["lists", "device mesh"])
def test_each_rank_knows_its_place_groups_and_neighbours(four_layouts, builder):
    for index, sizes in enumerate(LAYOUTS):
        full, lists = mesh.sizes_of(sizes), megatron_lists(sizes)
        for rank in range(4):
            got, place = four_layouts[rank][index][builder], expected_place(rank, sizes)
            where = (builder, sizes, rank)
            assert got["coords"] == place and got["sizes"] == full, where
            for axis in mesh.AXES:
                assert got["ranks"][axis] == next(g for g in lists[axis] if rank in g), (where, axis)
                assert got["sums"][axis] == sum(got["ranks"][axis]), (where, axis)
            same_parameters = [r for r in range(4) if all(expected_place(r, sizes)[a] == place[a]
                                                          for a in ("pp", "tp"))]
            assert got["ranks"]["dp_cp"] == same_parameters and got["sums"]["dp_cp"] == sum(same_parameters), where
            pp, p = full["pp"], place["pp"]
            assert (got["first"], got["last"]) == (p == 0, p == pp - 1), where
            pipeline = got["ranks"]["pp"]
            assert got["previous"] == (pipeline[p - 1] if p > 0 else None), where
            assert got["next"] == (pipeline[p + 1] if p < pp - 1 else None), where
            if pp == 1:
                assert got["ranks"]["embedding"] is None and "embedding" not in got["sums"], where
            else:
                assert got["ranks"]["embedding"] == [pipeline[0], pipeline[-1]], where
                assert got["sums"]["embedding"] == pipeline[0] + pipeline[-1], where
            assert got["layers"] == list(range(p * 4 // pp, (p + 1) * 4 // pp)), where
            assert got["tp mesh"] == got["ranks"]["tp"], where
            assert got["describe"] == " ".join(f"{a} {place[a]}/{full[a]}" for a in mesh.AXES), where


def test_a_device_mesh_of_the_wrong_size_is_refused_naming_both_numbers(four_layouts):
    assert "needs 3 ranks, but the world has 4" in four_layouts[0][-1]


def test_every_record_names_the_axis_it_crossed(four_layouts):
    records = [r for r in four_layouts.comm if r.op == "all_reduce" and r.group in ("pp", "dp", "cp", "tp")]
    assert records, "the grid's all-reduces were not recorded with their group"
    for r in records:
        assert mesh.axis_of(r) == r.group and r.rank in r.group_ranks and len(r.group_ranks) == r.group_size
    whole_world = [r for r in four_layouts.comm if r.op == "all_reduce" and r.group_size == 4 and r.shape == (1,)]
    assert whole_world and {mesh.axis_of(r) for r in whole_world} == {"tp"}   # tp=4: not torch's default group
    named = {mesh.axis_of(r) for r in four_layouts.comm if r.op == "all_reduce"}
    assert {"pp", "dp", "cp", "tp", "embedding", "dp_cp"} <= named
    for rank in range(4):                               # in a rank, with its grid: a message by its peer's place
        for index, sizes in enumerate(LAYOUTS):
            if sizes.get("pp", 1) > 1:
                ops = [op for op, _ in four_layouts[rank][index]["messages"]]
                assert four_layouts[rank][index]["messages"] == [(ops[0], "pp"), ("all_reduce", None)], (rank, sizes)
    per_axis = mesh.bytes_per_axis(four_layouts.comm)
    assert per_axis["tp"] > 0 and per_axis["dp"] > 0
    assert sum(per_axis.values()) == pytest.approx(sum(r.sent for r in four_layouts.comm))


def test_rank_lists_that_make_no_grid_are_refused_naming_axis_group_and_rank():
    good = megatron_lists({"dp": 2, "tp": 2})
    lists, place_of = mesh.check_rank_lists(good, 4)
    assert place_of == {r: expected_place(r, {"dp": 2, "tp": 2}) for r in range(4)}
    cases = {
        "no groups for the cp axis": {**good, "cp": None},
        "rank 1 is in two dp groups": {**good, "dp": [[0, 1], [1, 3]]},
        "rank 3 is in no tp group": {**good, "tp": [[0, 1], [2]]},
        "outside the world of 4 ranks": {**good, "pp": [[0], [1], [2], [4]]},
        "the tp groups differ in size": {**good, "tp": [[0, 1, 2], [3]]},
        "make 8 places, but the world has 4": {**good, "pp": [[0, 1], [2, 3]]},
        # dp pairs rank 0 (tp 0) with rank 3 (tp 1): the replicas would hold different tensor shards
        "the dp group [0, 3] is not one line of the grid: rank 0 is tp 0 and rank 3 is tp 1":
            {**good, "dp": [[0, 3], [1, 2]]},
        "unknown axis 'ep'": {**good, "ep": [[0], [1], [2], [3]]},
    }
    for message, groups in cases.items():
        groups = {k: v for k, v in groups.items() if v is not None}
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            mesh.check_rank_lists(groups, 4)


def test_a_layout_names_known_axes_with_positive_sizes():
    assert mesh.sizes_of({"tp": 2}) == {"pp": 1, "dp": 1, "cp": 1, "tp": 2}
    with pytest.raises(ValueError, match="unknown axis 'ep'"):
        mesh.sizes_of({"ep": 2})
    with pytest.raises(ValueError, match="the dp size must be a positive whole number, got 0"):
        mesh.sizes_of({"dp": 0})
