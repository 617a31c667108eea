"""Lab 9's grid of ranks: one process group per axis, this rank's place on each, and its pipeline neighbours.

    grid = mesh.Grid.from_rank_lists(groups)       # groups: {axis: [[global ranks], ...]}, exercise 1's answer
    grid = mesh.Grid.from_device_mesh({"dp": 2, "tp": 2})   # the same grid from torch's init_device_mesh
    grid.coords["tp"], grid.ranks["dp"], grid.groups["tp"]   # this rank's place, its group's ranks, the group
    grid.axis_of(record)                           # which axis a course.comm record's bytes crossed

The axes are `AXES`, outermost first: pipeline, data, context, tensor. A layout gives each a size (absent: 1);
ranks are laid out as Megatron-LM lays them out by default and as torch's DeviceMesh of shape (pp, dp, cp, tp)
numbers them, tensor fastest: rank = ((p·DP + d)·CP + c)·TP + t, so that a tensor-parallel group, which talks
most, holds neighbouring ranks (one node's GPUs). Besides the four axes, a grid holds two groups that lab 9's
step needs: `dp_cp`, the ranks that hold the same parameters (same pp and tp place; gradients are reduced over
it), and `embedding`, the first and last stage of this rank's pipeline (the tied embedding's two copies; None
where pp is 1 or this rank is on a middle stage).

Every rank must build its grid with the same lists, in the same order: creating a process group is a
collective of the whole world. Each group is created with its axis as its description (torch's group_desc; a
DeviceMesh's are "mesh_<axis>", and where one axis spans the whole world, the grid makes that axis a group of its
own rather than use torch's default group, which DeviceMesh reuses),
so that course.recorder's records name it (`CommRecord.group`): `axis_of` reads it back; summing
`record.sent` by `axis_of(record)` over `results.comm` gives the bytes a rank sent along each axis.

Used in: lab 9 (09_composition), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

import itertools
import math

import torch
import torch.distributed as dist

from course import placement

#: The grid's axes, outermost (slowest-varying rank) first.
AXES = ("pp", "dp", "cp", "tp")
#: The groups a grid holds besides its axes (a record on one of them names it).
EXTRA = ("dp_cp", "embedding")
_MESSAGES = ("send", "recv", "isend", "irecv")


def sizes_of(sizes: dict) -> dict[str, int]:
    """Every axis's size from a layout such as {"dp": 2, "tp": 2} (absent axes are 1); refuses an unknown axis
    or a size that is not a positive whole number."""
    unknown = sorted(set(sizes) - set(AXES))
    if unknown:
        raise ValueError(f"unknown axis {unknown[0]!r} in the layout {sizes}: a grid has the axes {AXES}")
    full = {axis: sizes.get(axis, 1) for axis in AXES}
    for axis, size in full.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"the {axis} size must be a positive whole number, got {size!r}")
    return full


def axis_of(record) -> str | None:
    """The axis (or "dp_cp", "embedding") whose group a course.comm record ran on, by the group's description:
    a grid's groups are named by their axis, torch's DeviceMesh names its own "mesh_<axis>"; None for another
    group (the default one, "default_pg")."""
    name = getattr(record, "group", "") or ""
    name = name.removeprefix("mesh_")
    return name if name in AXES or name in EXTRA else None


def bytes_per_axis(records) -> dict[str, float]:
    """{axis: the bytes the records say their ranks sent on it (`CommRecord.sent`)}, None for other groups."""
    out: dict = {}
    for record in records:
        axis = axis_of(record)
        out[axis] = out.get(axis, 0) + record.sent
    return out


class Grid:
    """This rank's grid: build it with `from_rank_lists` or `from_device_mesh`, on every rank, in the same order."""

    def __init__(self, groups: dict, ranks: dict, place_of: dict[int, dict[str, int]], device_mesh=None):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.groups, self.ranks = groups, ranks
        self._place_of = place_of                               # every rank's coordinates
        self.coords = dict(place_of[self.rank])
        self.sizes = {axis: len(ranks[axis]) for axis in AXES}
        self.first_stage = self.coords["pp"] == 0
        self.last_stage = self.coords["pp"] == self.sizes["pp"] - 1
        pipeline, p = ranks["pp"], self.coords["pp"]
        self.previous_rank = None if self.first_stage else pipeline[p - 1]
        self.next_rank = None if self.last_stage else pipeline[p + 1]
        self._device_mesh, self._tp_mesh = device_mesh, None

    # --- building ---------------------------------------------------------------------------------
    @classmethod
    def from_rank_lists(cls, groups: dict) -> Grid:
        """The grid whose groups are `groups` ({axis: [[global ranks], ...]} for every axis of AXES, what exercise
        1 returns): checks that each axis's lists cut the world into equal groups, every rank in one, and that
        the axes agree (each group one line of the grid: its ranks differ only in that axis's place); then
        creates every group (dist.new_group) in one order, the same on every rank."""
        lists, place_of = check_rank_lists(groups, dist.get_world_size())
        sizes = {axis: len(lists[axis][0]) for axis in AXES}
        made = {axis: {tuple(g): _new_group(g, axis) for g in lists[axis]} for axis in AXES}
        return cls._finish(made, place_of, sizes, device_mesh=None)

    @classmethod
    def from_device_mesh(cls, sizes: dict) -> Grid:
        """The grid of `sizes` from torch's own `init_device_mesh` (shape (pp, dp, cp, tp), named AXES): its
        groups are the mesh's, in Megatron-LM's order; refuses a world the sizes' product does not equal."""
        from torch.distributed.device_mesh import init_device_mesh

        sizes = sizes_of(sizes)
        world = dist.get_world_size()
        product = math.prod(sizes.values())
        if product != world:
            raise ValueError(f"the layout {_layout(sizes)} needs {product} ranks, but the world has {world}")
        device_mesh = init_device_mesh(placement.device().type, tuple(sizes[a] for a in AXES), mesh_dim_names=AXES)
        table = device_mesh.mesh
        place_of = {int(table[index]): dict(zip(AXES, index)) for index in _indices(sizes)}
        me = place_of[dist.get_rank()]
        made = {}
        for axis in AXES:
            line = tuple(int(r) for r in _line(table, me, axis))
            group = device_mesh.get_group(axis)
            if len(line) == world > 1:      # torch reuses the default group for an axis of the whole world
                group = _new_group(line, axis)
            made[axis] = {line: group}
        return cls._finish(made, place_of, sizes, device_mesh=device_mesh)

    @classmethod
    def _finish(cls, made: dict, place_of: dict, sizes: dict, device_mesh) -> Grid:
        """Add the dp_cp and embedding groups (created on every rank in one order) and build the Grid."""
        rank = dist.get_rank()
        by_place = {tuple(place[a] for a in AXES): r for r, place in place_of.items()}
        mine = {axis: next(g for g in made[axis] if rank in g) for axis in AXES}
        groups = {axis: made[axis][mine[axis]] for axis in AXES}
        ranks = {axis: list(mine[axis]) for axis in AXES}
        # dp_cp: the same pp and tp place; a group of its own, so that its records say "dp_cp" even where its
        # ranks are the dp (or cp) group's
        if sizes["cp"] * sizes["dp"] == 1:
            groups["dp_cp"], ranks["dp_cp"] = groups["dp"], list(ranks["dp"])
        else:
            for p, t in itertools.product(range(sizes["pp"]), range(sizes["tp"])):
                line = [by_place[(p, d, c, t)] for d, c in itertools.product(range(sizes["dp"]), range(sizes["cp"]))]
                group = _new_group(line, "dp_cp")
                if rank in line:
                    groups["dp_cp"], ranks["dp_cp"] = group, line
        # embedding: the first and last stage of each pipeline
        groups["embedding"], ranks["embedding"] = None, None
        for d, c, t in itertools.product(*(range(sizes[a]) for a in ("dp", "cp", "tp"))) if sizes["pp"] > 1 else ():
            ends = [by_place[(0, d, c, t)], by_place[(sizes["pp"] - 1, d, c, t)]]
            group = _new_group(ends, "embedding")
            if rank in ends:
                groups["embedding"], ranks["embedding"] = group, ends
        return cls(groups, ranks, place_of, device_mesh)

    # --- what a rank asks -----------------------------------------------------------------------------
    def layers(self, config) -> range:
        """The global indices of the layers this stage holds: config.layers // pp each, in order."""
        pp = self.sizes["pp"]
        if config.layers % pp:
            raise ValueError(f"{config.layers} layers do not split over {pp} pipeline stages: "
                             f"choose a pp that divides {config.layers}")
        each = config.layers // pp
        return range(self.coords["pp"] * each, (self.coords["pp"] + 1) * each)

    def describe(self) -> str:
        """This rank's place, e.g. "pp 1/2 dp 0/2 cp 0/1 tp 1/2"."""
        return " ".join(f"{axis} {self.coords[axis]}/{self.sizes[axis]}" for axis in AXES)

    def place_of(self, rank: int) -> dict[str, int]:
        """Any rank's coordinates on this grid."""
        return dict(self._place_of[rank])

    def axis_of(self, record) -> str | None:
        """The axis a course.comm record's bytes crossed (module `axis_of`; a message on a group the grid does
        not name, such as the default group, by where its peer sits)."""
        axis = axis_of(record)
        if axis is not None or record.peer is None or not record.group_ranks or record.op not in _MESSAGES:
            return axis
        here, there = self._place_of[record.rank], self._place_of[record.group_ranks[record.peer]]
        differ = [a for a in AXES if here[a] != there[a]]
        return differ[0] if len(differ) == 1 else None

    def tp_mesh(self):
        """A one-dimensional DeviceMesh over this rank's tensor-parallel group (for DTensors), named ("tp",)."""
        if self._tp_mesh is None:
            from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

            if self._device_mesh is not None and self._device_mesh.get_group("tp") is self.groups["tp"]:
                self._tp_mesh = self._device_mesh["tp"]
            elif hasattr(DeviceMesh, "from_group"):
                self._tp_mesh = DeviceMesh.from_group(self.groups["tp"], placement.device().type,
                                                      mesh=torch.tensor(self.ranks["tp"]), mesh_dim_names=("tp",))
            else:  # torch < 2.4: a mesh of torch's own, in this grid's order (a collective of the whole world)
                self._device_mesh = init_device_mesh(placement.device().type,
                                                     tuple(self.sizes[a] for a in AXES), mesh_dim_names=AXES)
                self._tp_mesh = self._device_mesh["tp"]
        return self._tp_mesh

    def __repr__(self):
        return f"Grid(rank {self.rank}: {self.describe()})"


# --- checking and placing rank lists -----------------------------------------------------------------------
def check_rank_lists(groups: dict, world_size: int) -> tuple[dict, dict]:
    """(each axis's groups, sorted; {rank: {axis: coordinate}}) for `groups` on a world of `world_size` ranks,
    or a ValueError naming the axis, the group and the rank that make them no grid (what from_rank_lists
    checks before it creates a group). A coordinate is the rank's index in its sorted group: its rank there."""
    lists = _checked_lists(groups, world_size)
    place_of = _places(lists, world_size)
    _check_lines(lists, place_of)
    return lists, place_of


def _layout(sizes: dict) -> str:
    return " × ".join(f"{axis}={sizes[axis]}" for axis in AXES)


def _new_group(ranks, axis: str):
    try:
        return dist.new_group(list(ranks), group_desc=axis)
    except TypeError:      # a torch without group_desc: the group works, its records name no axis
        return dist.new_group(list(ranks))


def _indices(sizes: dict):
    return list(itertools.product(*(range(sizes[a]) for a in AXES)))


def _line(table: torch.Tensor, place: dict, axis: str) -> torch.Tensor:
    """The ranks of `table` (shaped as AXES) at `place` but for `axis`."""
    index = tuple(slice(None) if a == axis else place[a] for a in AXES)
    return table[index]


def _checked_lists(groups, world: int) -> dict[str, list[list[int]]]:
    """Each axis's groups as sorted lists; refuses a missing axis, a rank missing, repeated or outside the world,
    groups of different sizes, or sizes whose product is not the world."""
    if not isinstance(groups, dict):
        raise TypeError(f"a grid needs {{axis: [[ranks], ...]}} for the axes {AXES}, got {type(groups).__name__}")
    for axis in groups:
        if axis not in AXES:
            raise ValueError(f"unknown axis {axis!r}: a grid has the axes {AXES}")
    lists = {}
    for axis in AXES:
        if axis not in groups:
            raise ValueError(f"no groups for the {axis} axis: give every axis, [[0], [1], ...] where its size is 1")
        seen: dict[int, list] = {}
        lists[axis] = []
        for group in groups[axis]:
            group = [int(r) for r in group]
            for r in group:
                if not 0 <= r < world:
                    raise ValueError(f"the {axis} group {group} holds rank {r}, outside the world of {world} ranks")
                if r in seen:
                    raise ValueError(f"rank {r} is in two {axis} groups, {seen[r]} and {group}: "
                                     f"each rank belongs to one group of each axis")
                seen[r] = group
            lists[axis].append(sorted(group))
        missing = [r for r in range(world) if r not in seen]
        if missing:
            raise ValueError(f"rank {missing[0]} is in no {axis} group: the {axis} groups must hold every rank "
                             f"of the world once")
        lengths = sorted({len(g) for g in lists[axis]})
        if len(lengths) > 1:
            short = next(g for g in lists[axis] if len(g) == lengths[0])
            raise ValueError(f"the {axis} groups differ in size: {short} holds {lengths[0]} ranks, others "
                             f"{lengths[-1]}; every group of an axis has that axis's size")
        lists[axis].sort()
    sizes = {axis: len(lists[axis][0]) for axis in AXES}
    if math.prod(sizes.values()) != world:
        raise ValueError(f"the groups' sizes {_layout(sizes)} make {math.prod(sizes.values())} places, "
                         f"but the world has {world} ranks")
    return lists


def _places(lists: dict, world: int) -> dict[int, dict[str, int]]:
    """Every rank's coordinate on each axis: its index in its (sorted) group of that axis, which is its rank in
    the process group (new_group sorts). `_check_lines` then holds that these coordinates make one grid."""
    place_of = {r: {} for r in range(world)}
    for axis in AXES:
        for group in lists[axis]:
            for index, r in enumerate(group):
                place_of[r][axis] = index
    return place_of


def _check_lines(lists: dict, place_of: dict) -> None:
    """Each group must be one line of the grid: its ranks share every other axis's coordinate; and no two ranks
    may share every coordinate."""
    for axis in AXES:
        for group in lists[axis]:
            for other in AXES:
                if other == axis:
                    continue
                values = {place_of[r][other] for r in group}
                if len(values) > 1:
                    a, b = (next(r for r in group if place_of[r][other] == v) for v in sorted(values)[:2])
                    raise ValueError(f"the {axis} group {group} is not one line of the grid: rank {a} is "
                                     f"{other} {place_of[a][other]} and rank {b} is {other} {place_of[b][other]}; "
                                     f"a {axis} group's ranks differ only in their {axis} place")
    seen: dict[tuple, int] = {}
    for r, place in place_of.items():
        key = tuple(place[a] for a in AXES)
        if key in seen:
            where = " ".join(f"{axis} {place[axis]}" for axis in AXES)
            raise ValueError(f"ranks {seen[key]} and {r} have the same place ({where}): the groups of "
                             f"different axes must cross in one rank each")
        seen[key] = r
