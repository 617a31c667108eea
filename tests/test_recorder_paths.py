"""Covers: course.recorder.

Every path to the wire is recorded: each spelling of a collective or a message that reaches
gloo (torch.distributed's names, distributed_c10d's functions, the object calls, a process
group's and its backend's own methods, torch.ops.c10d, the functional collectives) leaves a
record with its operation, peer and bytes, and a TorchDispatchMode, which sees every c10d op
whatever its spelling, counts no op the recorder missed."""
import inspect
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as functional
from torch.distributed import distributed_c10d as c10d
from torch.utils._python_dispatch import TorchDispatchMode

import course
from course import comm, recorder
from course.check import messages_only, ring_neighbours_only

RANKS = 3
ELEMENTS = 4
BYTES = ELEMENTS * 4  # one float32 tensor of the spellings below
GROUP_MESSAGES = {"isend", "irecv"}  # what a message at group level is recorded as (it returns a Work)


def _tensor():
    return torch.full((ELEMENTS,), float(dist.get_rank() + 1))


def _default_group():
    return c10d._get_default_group()


def _on_rank_0_and_1(send, receive):
    """A message from rank 0 to rank 1; rank 2 sends nothing."""
    if dist.get_rank() == 0:
        send()
    elif dist.get_rank() == 1:
        receive()


def _object_messages():
    _on_rank_0_and_1(lambda: dist.send_object_list([_tensor()], dst=1),
                     lambda: dist.recv_object_list([None], src=0))


def _group_messages():
    group = _default_group()
    _on_rank_0_and_1(lambda: group.send([_tensor()], 1, 0).wait(), lambda: group.recv([_tensor()], 0, 0).wait())


def _new_group_messages():
    group = dist.new_group([1, 2])  # every rank makes it; in it, rank 1 is 0 and rank 2 is 1
    if dist.get_rank() == 1:
        group.send([_tensor()], 1, 0).wait()
    elif dist.get_rank() == 2:
        group.recv([_tensor()], 0, 0).wait()


def _ops_messages():
    group = _default_group().boxed()  # the dispatcher's ops take the group as a TorchScript object
    _on_rank_0_and_1(lambda: torch.ops.c10d.send([_tensor()], group, 1, 0).wait(),
                     lambda: torch.ops.c10d.recv_.default([_tensor()], group, 0, 0).wait())


def _module_batch():
    _on_rank_0_and_1(lambda: [w.wait() for w in c10d.batch_isend_irecv([dist.P2POp(c10d.isend, _tensor(), 1)])],
                     lambda: [w.wait() for w in c10d.batch_isend_irecv([dist.P2POp(c10d.irecv, _tensor(), 0)])])


def _functional(result):
    return functional.wait_tensor(result) if isinstance(result, torch.Tensor) else result


#: name -> (what every rank calls, the operations its records must name, bytes of each record or None
#: where a pickle decides, whether the TorchDispatchMode sees it: a backend's own method skips the dispatcher).
SPELLINGS = {
    "dist.all_reduce": (lambda: dist.all_reduce(_tensor()), {"all_reduce"}, BYTES, True),
    "distributed_c10d.all_reduce": (lambda: c10d.all_reduce(_tensor()), {"all_reduce"}, BYTES, True),
    "distributed_c10d.all_to_all_single": (
        lambda: c10d.all_to_all_single(torch.empty(RANKS * ELEMENTS), torch.ones(RANKS * ELEMENTS)),
        {"all_to_all_single"}, RANKS * BYTES, True),
    "all_gather_object": (lambda: dist.all_gather_object([None] * RANKS, _tensor()), {"all_gather"}, None, True),
    "broadcast_object_list": (lambda: dist.broadcast_object_list([_tensor()], src=0), {"broadcast"}, None, True),
    "gather_object": (lambda: dist.gather_object(_tensor(), [None] * RANKS if dist.get_rank() == 0 else None, dst=0),
                      {"all_gather", "gather"}, None, True),
    "scatter_object_list": (lambda: dist.scatter_object_list([None], [_tensor()] * RANKS, src=0),
                            {"broadcast", "scatter"}, None, True),
    "send_object_list": (_object_messages, {"isend", "irecv"}, None, True),
    "group.allreduce": (lambda: _default_group().allreduce([_tensor()]).wait(), {"all_reduce"}, BYTES, True),
    "group.allgather": (lambda: _default_group().allgather([[_tensor() for _ in range(RANKS)]], [_tensor()]).wait(),
                        {"all_gather"}, BYTES, True),
    "group.alltoall_base": (lambda: _default_group().alltoall_base(torch.empty(RANKS * ELEMENTS),
                                                                    torch.ones(RANKS * ELEMENTS), [], []).wait(),
                            {"all_to_all_single"}, RANKS * BYTES, True),
    "group.send": (_group_messages, {"isend", "irecv"}, BYTES, True),
    "new_group().send": (_new_group_messages, {"isend", "irecv"}, BYTES, True),
    "backend.allreduce": (lambda: _default_group()._get_backend(torch.device("cpu")).allreduce([_tensor()]).wait(),
                          {"all_reduce"}, BYTES, False),
    "torch.ops.c10d.broadcast_": (lambda: torch.ops.c10d.broadcast_([_tensor()], _default_group().boxed(), 0, 0, False),
                                  {"broadcast"}, BYTES, True),
    "torch.ops.c10d.allgather_.default": (
        lambda: torch.ops.c10d.allgather_.default([[_tensor() for _ in range(RANKS)]], [_tensor()],
                                                  _default_group().boxed(), False)[1].wait(),
        {"all_gather"}, BYTES, True),
    "torch.ops.c10d.send": (_ops_messages, {"isend", "irecv"}, BYTES, True),
    "torch.ops._c10d_functional.all_reduce": (
        lambda: _functional(torch.ops._c10d_functional.all_reduce(_tensor(), "sum", _default_group().group_name)),
        {"all_reduce"}, BYTES, True),
    "functional all_reduce": (lambda: _functional(functional.all_reduce(_tensor(), "sum", _default_group())),
                              {"all_reduce"}, BYTES, True),
    "functional all_gather_tensor": (lambda: _functional(functional.all_gather_tensor(_tensor(), 0, _default_group())),
                                     {"all_gather_into_tensor"}, BYTES, True),
    "functional all_to_all_single": (
        lambda: _functional(functional.all_to_all_single(torch.ones(RANKS * ELEMENTS), None, None, _default_group())),
        {"all_to_all_single"}, RANKS * BYTES, True),
    "functional autograd all_to_all_single": (
        lambda: _functional(torch.ops._c10d_functional_autograd.all_to_all_single(
            torch.ones(RANKS * ELEMENTS), [ELEMENTS] * RANKS, [ELEMENTS] * RANKS, _default_group().group_name)),
        {"all_to_all_single"}, RANKS * BYTES, True),
    "distributed_c10d.batch_isend_irecv": (_module_batch, {"isend", "irecv"}, BYTES, True),
}


class _C10dOps(TorchDispatchMode):
    """The c10d ops that reach the dispatcher and name a group, whatever called them (waiting for a
    result or wrapping one for autograd names none)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        names = {argument.name for argument in func._schema.arguments}
        if "c10d" in func.namespace and names & {"process_group", "group_name"}:
            self.seen.append(f"{func.namespace}.{func.__name__}")
        return func(*args, **(kwargs or {}))


def every_spelling():
    """Each spelling in turn: how many records it made on this rank, and the c10d ops seen."""
    log = recorder.active().log
    made = {}
    for name, (call, *_) in SPELLINGS.items():
        before = len(log)
        with _C10dOps() as ops:
            call()
        made[name] = (len(log) - before, ops.seen)
    return made


@pytest.fixture(scope="module")
def spellings_run():
    return course.launch(every_spelling, RANKS)


def _records_of(results, name):
    """Each rank's records of one spelling (ranks run the spellings in the same order)."""
    order = list(SPELLINGS)
    mine = []
    for rank in results.ranks:
        records = results.comm.rank(rank)
        start = sum(results[rank][n][0] for n in order[:order.index(name)])
        mine += records[start:start + results[rank][name][0]]
    return mine


@pytest.mark.parametrize("name", SPELLINGS)
def test_each_spelling_is_recorded_with_its_operation_and_bytes(spellings_run, name):
    _, ops, nbytes, _ = SPELLINGS[name]
    records = _records_of(spellings_run, name)
    assert records, f"{name} left no record"
    assert {r.op for r in records} == ops, (name, [r.op for r in records])
    for record in records:
        assert record.end is not None and record.end >= record.start
        if nbytes is not None and record.op != "barrier":
            assert record.nbytes == nbytes, (name, record)
        assert record.nbytes > 0 or record.op == "barrier", (name, record)
        if record.op in ("broadcast", "reduce", "gather", "scatter"):
            assert record.peer == 0, (name, record)  # every rooted spelling above roots at rank 0


@pytest.mark.parametrize("name", [n for n, (_, ops, *_) in SPELLINGS.items() if ops <= GROUP_MESSAGES])
def test_messages_at_group_level_name_their_peer(spellings_run, name):
    """The peer is a rank in the group the message went over (new_group([1, 2]): global rank 1 is 0)."""
    records = _records_of(spellings_run, name)
    first, second = (1, 2) if name == "new_group().send" else (0, 1)
    sends = [r for r in records if r.op == "isend"]
    receives = [r for r in records if r.op == "irecv"]
    assert sends and {r.rank for r in sends} == {first} and {r.peer for r in sends} == {1}, sends
    assert receives and {r.rank for r in receives} == {second} and {r.peer for r in receives} == {0}, receives
    messages_only(SimpleNamespace(comm=comm.CommLog(records), ranks=list(range(RANKS))), name)


@pytest.mark.parametrize("name", [n for n, (_, ops, *_) in SPELLINGS.items() if not ops <= GROUP_MESSAGES])
def test_messages_only_refuses_every_collective_spelling(spellings_run, name):
    records = _records_of(spellings_run, name)
    with pytest.raises(AssertionError, match="must be built from send/recv/isend/irecv alone; it called"):
        messages_only(SimpleNamespace(comm=comm.CommLog(records), ranks=list(range(RANKS))), name)


def test_the_dispatcher_sees_no_c10d_op_that_was_not_recorded(spellings_run):
    """A TorchDispatchMode sees every c10d op that reaches the dispatcher, whatever its spelling:
    each spelling made as many records as ops (a call recorded at torch.distributed's level is not
    recorded again at its group's)."""
    for rank in spellings_run.ranks:
        for name, (made, seen) in spellings_run[rank].items():
            if SPELLINGS[name][3]:
                assert made == len(seen), (name, rank, made, seen)
            else:  # a backend's own method skips the dispatcher: recorded all the same
                assert made >= 1 and not seen, (name, rank, made, seen)


def large_group_calls():
    """A 2 MB all-reduce through the group's method and through the functional collectives, and a message
    through the group's send: what each wrote to its sockets is measured into its own record."""
    group, tensor = _default_group(), torch.ones(1000, 500)
    group.allreduce([tensor]).wait()
    _functional(functional.all_reduce(tensor, "sum", group))
    _on_rank_0_and_1(lambda: group.send([tensor], 1, 0).wait(), lambda: group.recv([tensor], 0, 0).wait())


def test_group_level_records_measure_their_own_socket_bytes():
    size, headers = 1000 * 500 * 4, 2048  # gloo's header per message, as tests/test_comm.py allows
    log = course.launch(large_group_calls, 2).comm
    for rank, ops in ((0, ["all_reduce", "all_reduce", "isend"]), (1, ["all_reduce", "all_reduce", "irecv"])):
        records = log.rank(rank)
        assert [r.op for r in records] == ops
        for record in records:
            want = size if record.op == "all_reduce" or record.op == "isend" else 0  # 2 ranks: a ring sends S
            assert record.predicted == want, record
            assert record.measured is not None and abs(record.measured - want) <= 0.001 * want + headers, record
            assert not record.shared and record.end >= record.start, record


def ring_of_group_messages():
    """A ring step made of a group's own send and recv: recorded as messages to the right neighbour."""
    group, rank, n = _default_group(), dist.get_rank(), dist.get_world_size()
    outgoing, incoming = _tensor(), torch.empty(ELEMENTS)
    sending = group.send([outgoing], (rank + 1) % n, 0)
    group.recv([incoming], (rank - 1) % n, 0).wait()
    sending.wait()
    return incoming


def ring_of_one_gather():
    """The red team's ring: one all_gather_object, then each rank keeps its left neighbour's part."""
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, _tensor())
    return parts[(dist.get_rank() - 1) % dist.get_world_size()]


def test_a_ring_of_group_messages_passes_and_a_gathered_ring_does_not():
    honest = course.launch(ring_of_group_messages, RANKS)
    messages_only(honest, "ring")
    ring_neighbours_only(honest, "ring")
    assert sorted((r.rank, r.op, r.peer) for r in honest.comm) == sorted(
        [(r, "isend", (r + 1) % RANKS) for r in range(RANKS)] + [(r, "irecv", (r - 1) % RANKS) for r in range(RANKS)])
    gathered = course.launch(ring_of_one_gather, RANKS)
    assert all(torch.equal(gathered[r], torch.full((ELEMENTS,), float((r - 1) % RANKS + 1))) for r in range(RANKS))
    with pytest.raises(AssertionError, match=r"ring must be built from send/recv/isend/irecv alone; it called "
                                             r"\['all_gather'\] on ranks 0, 1, 2"):
        messages_only(gathered, "ring")


def no_way_around():
    """What the red team reached the original through, on the recorder's wrappers."""
    found = {"__wrapped__": [n for n in comm.RECORDED if hasattr(getattr(dist, n), "__wrapped__")]
             + (["batch_isend_irecv"] if hasattr(dist.batch_isend_irecv, "__wrapped__") else []),
             "unwrap": [n for n in comm.RECORDED if inspect.unwrap(getattr(dist, n)) is not getattr(dist, n)]}
    try:
        object.__getattribute__(dist.all_to_all_single, "_orig" + "inal")
        found["_original"] = True
    except AttributeError:
        found["_original"] = False
    found["equal"] = dist.isend == c10d.isend and dist.irecv == c10d.irecv
    return found


def test_the_wrappers_lead_nowhere_but_still_compare_equal_to_torchs():
    found = course.launch(no_way_around, 2)[0]
    assert found == {"__wrapped__": [], "unwrap": [], "_original": False, "equal": True}


def paused_paths():
    """Group and op calls inside unrecorded(): none recorded; after it, recorded again."""
    group = _default_group()
    with recorder.unrecorded():
        dist.all_gather_object([None] * dist.get_world_size(), 1)
        group.allreduce([_tensor()]).wait()
        _functional(torch.ops._c10d_functional.all_reduce(_tensor(), "sum", group.group_name))
    group.allreduce([_tensor()]).wait()


def test_unrecorded_leaves_group_and_op_calls_unrecorded_too():
    results = course.launch(paused_paths, 2)
    assert [(r.rank, r.op) for r in results.comm] == [(0, "all_reduce"), (1, "all_reduce")]


def test_the_group_and_op_patches_last_only_while_a_rank_runs():
    from torch._C._distributed_c10d import Backend, ProcessGroup
    methods = (ProcessGroup.allreduce, ProcessGroup.send, Backend.allreduce)
    ops = (torch.ops.c10d.allreduce_._op, torch.ops.c10d.allreduce_.default._op,
           torch.ops._c10d_functional.all_reduce._op)
    calls = recorder.Recorder(rank=0, backend="gloo")
    with calls.patch():
        assert ProcessGroup.allreduce is not methods[0] and Backend.allreduce is not methods[2]
        assert torch.ops.c10d.allreduce_._op is not ops[0]
        assert torch.ops._c10d_functional.all_reduce._op is not ops[2]
    assert (ProcessGroup.allreduce, ProcessGroup.send, Backend.allreduce) == methods
    assert (torch.ops.c10d.allreduce_._op, torch.ops.c10d.allreduce_.default._op,
            torch.ops._c10d_functional.all_reduce._op) == ops


def test_a_torch_without_the_dispatchers_list_still_has_its_c10d_ops_found(monkeypatch):
    """Older torch may lack `_dispatch_get_all_op_names`: the ops are then looked up by the names the course
    knows, and every collective of the current list is among them."""
    from course import _group_recording
    listed = {(namespace, name) for _, namespace, name, _ in _group_recording._collective_ops()}
    monkeypatch.delattr(torch._C, "_dispatch_get_all_op_names")
    monkeypatch.setattr(_group_recording, "_FOUND", (0, []))
    by_name = {(namespace, name) for _, namespace, name, _ in _group_recording._collective_ops()}
    sends = {(namespace, name) for namespace, name in listed if _group_recording.COURSE_OP.get(name.rstrip("_"))}
    assert sends and sends <= by_name, sorted(sends - by_name)
