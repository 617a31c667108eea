"""Where every path to the wire meets: a process group's own methods and the ops that skip Python.

`torch.distributed.<op>` is one spelling of a collective among many. `all_gather_object` and the
other object calls, distributed_c10d's functions called by module (`distributed_c10d.all_gather`),
an original kept aside, a `new_group()`'s own `.send` all end in a method of the process group
(`ProcessGroup.allgather`, or its backend's); `torch.ops.c10d.*` and the functional collectives
(`torch.ops._c10d_functional.*`, which `torch.distributed._functional_collectives` calls) go to
the dispatcher without one. While a rank runs, `GroupPatch` routes all of these through the
recorder, so no spelling reaches gloo unrecorded; a call that `torch.distributed.<op>` already
recorded is not recorded again (the recorder's "inside" flag).

`describe_method` and `describe_op` say what one such call moves, in the course's words: the
operation (`allgather` is an `all_gather`, a group's `send` an `isend`), its tensors as
course.transfer.SIZE_OF names them, its peer (a rank in the group) and its group.

Used by: course.recorder.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from course import _call_sizes, transfer
from course.comm import CommRecord

#: A group's method or a c10d op (a trailing "_" dropped) -> the course's operation.
COURSE_OP = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "allgather": "all_gather", "allgather_coalesced": "all_gather",
    "_allgather_base": "all_gather_into_tensor", "allgather_into_tensor_coalesced": "all_gather_into_tensor",
    "all_gather_single": "all_gather_into_tensor", "all_gather_single_coalesced": "all_gather_into_tensor",
    "all_gather_into_tensor": "all_gather_into_tensor", "all_gather_into_tensor_out": "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor", "reduce_scatter_single_coalesced": "reduce_scatter_tensor",
    "reduce_scatter_tensor": "reduce_scatter_tensor", "reduce_scatter_tensor_out": "reduce_scatter_tensor",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all_single", "all_to_all_single": "all_to_all_single",
    "send": "isend", "isend": "isend", "recv": "irecv", "irecv": "irecv",
    "recv_anysource": "irecv", "recv_any_source": "irecv",
    "barrier": "barrier", "monitored_barrier": "barrier",
}

#: Operations whose size is their input, given after the output at group level (SIZE_OF's "input").
_INPUT_AFTER_OUTPUT = frozenset({"all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                                 "all_to_all", "all_to_all_single", "gather"})
_ROOTED = frozenset({"broadcast", "reduce", "gather", "scatter"})
_PEER_KEYS = ("root_rank", "rootRank", "src", "dst", "srcRank", "dstRank")

#: The dispatcher's namespaces of collectives (c10d_functional: torch before 2.5's functional collectives).
OP_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd", "c10d_functional")
_GROUP_ARGUMENTS = frozenset({"process_group", "group_name", "group_size", "ranks"})
_FUNCTIONAL = frozenset({"_c10d_functional", "_c10d_functional_autograd", "c10d_functional"})


@dataclass
class GroupCall:
    """One operation of a call at group level, in the course's words."""
    op: str
    tensors: list = field(default_factory=list)  # what course.transfer.SIZE_OF names
    peer: int | None = None        # root, source or destination: a rank in `group`
    group: object | None = None    # the ProcessGroup (None: the default group)
    splits: list | None = None     # all_to_all_single's input_split_sizes


def tensors_in(value) -> list:
    """The tensors in an argument: a tensor, or lists of them, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors_in(item)]
    return []


def describe_method(name: str, group, args: tuple, kwargs: dict) -> list[GroupCall]:
    """A process group's (or its backend's) method `name` called with args and kwargs."""
    op = COURSE_OP[name]
    if op == "barrier":
        return [GroupCall(op, group=group)]
    index, words = (1, ("input",)) if op in _INPUT_AFTER_OUTPUT else (0, ("tensor", "output"))
    sized = args[index] if len(args) > index else next(
        (value for key, value in kwargs.items() if any(w in key.lower() for w in words)), None)
    peer = None
    if op in ("isend", "irecv") and name not in ("recv_anysource", "recv_any_source"):
        peer = args[1] if len(args) > 1 else next((kwargs[k] for k in _PEER_KEYS if k in kwargs), None)
    elif op in _ROOTED:
        options = [v for v in (*args, *kwargs.values()) if hasattr(v, "rootRank")]
        numbers = [v for v in args[1:] if isinstance(v, int) and not isinstance(v, bool)]
        peer = options[0].rootRank if options else numbers[0] if numbers else 0
    splits = args[3] if op == "all_to_all_single" and len(args) > 3 else kwargs.get("input_split_sizes")
    tensors = tensors_in(sized) if sized is not None else tensors_in((args, list(kwargs.values())))
    return [GroupCall(op, tensors, peer, group, list(splits) if splits else None)]


def describe_op(namespace: str, name: str, schema, args: tuple, kwargs: dict) -> list[GroupCall]:
    """The dispatcher's op `namespace::name` (its schema names the arguments) called with args and kwargs."""
    bound = dict(zip((a.name for a in schema.arguments), args))
    bound.update(kwargs)
    group = bound.get("process_group", bound.get("group_name"))
    if isinstance(group, str):
        group = resolve_group(group)
    if name == "batch_p2p_ops":  # one message per entry
        return [GroupCall(COURSE_OP.get(kind, kind), [tensor], peer, group)
                for kind, peer, tensor in zip(bound["op_list"], bound["peer_list"], bound["tensors"])]
    op = COURSE_OP.get(name.rstrip("_"), f"{namespace}.{name}")
    if op == "barrier":
        return [GroupCall(op, group=group)]
    sized = next(iter(bound.values()), None)
    if op in _INPUT_AFTER_OUTPUT and namespace not in _FUNCTIONAL:
        sized = next((v for k, v in bound.items() if k.startswith("input")), sized)
    peer = next((bound[k] for k in _PEER_KEYS if isinstance(bound.get(k), int)), None)
    splits = bound.get("input_split_sizes")
    return [GroupCall(op, tensors_in(sized), peer if op in _ROOTED | {"isend", "irecv"} else None, group,
                      list(splits) if splits else None)]


def resolve_group(name: str):
    """The process group a functional collective names (None: unknown, the default group is assumed)."""
    resolve = getattr(torch._C._distributed_c10d, "_resolve_process_group", None)
    try:
        return resolve(name) if resolve else None
    except (RuntimeError, ValueError):
        return None


def rank_and_size(group) -> tuple[int, int]:
    """This process's rank in `group` (a ProcessGroup or backend; None: the default group) and its size."""
    if isinstance(group, torch.ScriptObject):  # the dispatcher's form of a ProcessGroup
        group = torch._C._distributed_c10d.ProcessGroup.unbox(group)
    if group is None or not callable(getattr(group, "size", None)):
        return dist.get_rank(), dist.get_world_size()
    return group.rank(), group.size()


def record(call: GroupCall, rank: int, backend: str) -> CommRecord | None:
    """The record of one GroupCall made by global rank `rank` (None where it is not in the group)."""
    group_rank, size = rank_and_size(call.group)
    if group_rank < 0:
        return None  # this rank is not in the group: torch does nothing
    first = call.tensors[0] if call.tensors else None
    nbytes = sum(t.numel() * t.element_size() for t in call.tensors)
    shape = () if first is None else tuple(first.shape) if len(call.tensors) == 1 else (
        len(call.tensors), *first.shape)
    arguments = {"input_list": call.tensors} if call.op == "all_to_all" else {
        "input": first, "input_split_sizes": call.splits}
    try:
        kept = _call_sizes.own_chunk(call.op, arguments, group_rank, nbytes)
        formula = transfer.predict(_call_sizes.FORMULA_OF.get(call.op, call.op), nbytes, size, rank=group_rank,
                                   root=call.peer if call.peer is not None else 0, backend=backend, kept=kept)
        algorithm, predicted = formula.algorithm, formula.sent
    except (ValueError, IndexError, TypeError):  # an operation with no formula, a peer torch refuses
        algorithm, predicted = "unknown", 0
    return CommRecord(rank, call.op, shape, "" if first is None else str(first.dtype), nbytes, size,
                      call.peer, call.op in ("isend", "irecv"), algorithm, predicted, **named(call.group))


def named(group) -> dict:
    """CommRecord's `group` (description) and `group_ranks` (global ranks) of `group` (a ProcessGroup, its
    backend or the dispatcher's form; None: the default group); "" and () where torch does not know them."""
    try:
        if isinstance(group, torch.ScriptObject):
            group = torch._C._distributed_c10d.ProcessGroup.unbox(group)
        group = dist.group.WORLD if group is None else group
        return {"group": str(getattr(group, "group_desc", "")),
                "group_ranks": tuple(dist.get_process_group_ranks(group))}
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError):  # a backend: not a registered group
        return {"group": str(getattr(group, "group_desc", "")), "group_ranks": ()}


def _group_classes() -> list[type]:
    """ProcessGroup, Backend and every subclass of them torch has bound (gloo's, nccl's, ...)."""
    c10d = torch._C._distributed_c10d
    found, todo = [], [getattr(c10d, n) for n in ("ProcessGroup", "Backend") if hasattr(c10d, n)]
    while todo:
        cls = todo.pop()
        if cls not in found:
            found.append(cls)
            todo += cls.__subclasses__()
    return found


_FOUND: tuple[int, list] = (0, [])  # (how many ops the dispatcher had, the collectives among them)


def _collective_ops() -> list[tuple]:
    """(packet or overload, namespace, name, schema) of every op in OP_NAMESPACES: found once a
    process, again only where ops were registered since."""
    global _FOUND
    listed = getattr(torch._C, "_dispatch_get_all_op_names", None)
    every = listed() if listed else [f"{namespace}::{name}{tail}" for namespace in OP_NAMESPACES
                                     for name in (*COURSE_OP, "wait_tensor") for tail in ("", "_")]
    if len(every) == _FOUND[0]:
        return _FOUND[1]
    found = []
    for qualified in sorted(every):
        namespace, _, name = qualified.partition("::")
        if namespace in OP_NAMESPACES:
            try:
                packet = getattr(getattr(torch.ops, namespace), name)
            except (AttributeError, RuntimeError):  # a name this torch does not have
                continue
            overloads = [getattr(packet, o) for o in packet.overloads()]
            found += [(op, namespace, name, getattr(op, "_schema", None) or overloads[0]._schema)
                      for op in (packet, *overloads)]
    _FOUND = (len(every), found)
    return found


class GroupPatch:
    """While installed, each group method and c10d op goes through `on_call(name, describe, run)`:
    `describe()` says what it moves, as GroupCalls (called only where the recorder records it), and
    `run()` makes the call; `on_wait(tensor)` is told when a functional result is waited for."""

    def __init__(self, on_call, on_wait):
        self._on_call, self._on_wait = on_call, on_wait
        self._methods = [(cls, name, vars(cls)[name]) for cls in _group_classes()
                         for name in COURSE_OP if name in vars(cls)]
        # (packet or overload, namespace, name, schema, its original _op)
        self._ops = [(*op, op[0]._op) for op in _collective_ops()]

    def install(self) -> None:
        for cls, name, original in self._methods:
            setattr(cls, name, self._method(name, original))
        for holder, namespace, name, schema, original in self._ops:
            holder._op = self._op(namespace, name, schema, original)

    def remove(self) -> None:
        for cls, name, original in self._methods:
            setattr(cls, name, original)
        for holder, *_, original in self._ops:
            holder._op = original

    def _method(self, name, original):
        on_call = self._on_call

        def recorded(group, *args, **kwargs):
            return on_call(name, lambda: describe_method(name, group, args, kwargs),
                           lambda: original(group, *args, **kwargs))
        recorded.__name__ = recorded.__qualname__ = name
        recorded.__doc__ = original.__doc__
        return recorded

    def _op(self, namespace, name, schema, original):
        if name == "wait_tensor":
            on_wait = self._on_wait

            def waited(tensor, *args, **kwargs):
                result = original(tensor, *args, **kwargs)
                on_wait(tensor)  # after the wait: the bytes are written by then
                return result
            return waited
        if not _GROUP_ARGUMENTS & {a.name for a in schema.arguments}:
            return original  # names no group, so sends nothing: a check of a tensor, autograd's wrapping
        on_call = self._on_call

        def recorded(*args, **kwargs):
            return on_call(name, lambda: describe_op(namespace, name, schema, args, kwargs),
                           lambda: original(*args, **kwargs))
        recorded.__name__ = recorded.__qualname__ = name  # no __wrapped__: nothing leads to the original
        return recorded
