"""Covers: course.comm, course.recorder.

Counting communication: formulas exact, gloo's socket bytes close to them."""
import time

import pytest
import torch
import torch.distributed as dist

import course
from course import comm, recorder, transfer

S = 1000 * 500 * 4  # a 1000x500 float32 tensor: 2,000,000 bytes
HEADERS = 2048      # gloo writes a small header per message; a few dozen messages at most


def close_to(measured, predicted):
    """Within 0.1 % plus headers, as the course promises."""
    return measured is not None and abs(measured - predicted) <= 0.001 * predicted + HEADERS


# Bytes each rank sends, worked out by hand from the algorithms (not from
# course.transfer), for N ranks and a tensor of S bytes.
def expected(op, rank, n):
    root = rank == 0
    return {
        "all_reduce": 2 * (n - 1) * S // n,                       # ring
        "broadcast": {0: 2 * S if n == 4 else S, 1: S if n == 4 else 0}.get(rank, 0),  # tree
        "reduce": (n - 1) * S // n if root else S,                 # reduce-scatter + gather
        "all_gather": (n - 1) * S,                                 # ring
        "all_gather_into_tensor": (n - 1) * S,
        "reduce_scatter": 2 * (n - 1) * S,                         # gloo: all-reduce of n*S
        "reduce_scatter_tensor": 2 * (n - 1) * S,
        "all_to_all_single": (n - 1) * S,
        "gather": 0 if root else S,
        "scatter": (n - 1) * S if root else 0,
        "send": S,
        "recv": 0,
        "barrier": 0,
    }[op]


@pytest.mark.parametrize("n", [2, 4])
def test_every_operation_matches_its_formula_and_the_socket_bytes(n):
    results = course.launch(comm.every_collective, n)
    log = results.comm
    ops = ["all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
           "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter",
           "barrier"]
    for rank in range(n):
        mine = log.rank(rank)
        names = [r.op for r in mine]
        p2p = {0: ["send"], 1: ["recv"]}.get(rank, [])
        assert names == ops[:10] + p2p + ops[10:], names
        for record in mine:
            want = expected(record.op, rank, n)
            assert record.predicted == want, (record.op, rank, record.predicted, want)
            assert close_to(record.measured, want), (record.op, rank, record.measured, want)
            assert record.group_size == n
            assert record.dtype == ("" if record.op == "barrier" else "torch.float32")
            assert record.end is not None and record.end >= record.start >= 0
    first = log.rank(0)
    assert first[0].shape == (1000, 500) and first[0].nbytes == S
    assert first[5].shape == (n, 1000, 500) and first[5].nbytes == n * S  # all the chunks
    assert "gloo has no reduce-scatter" in first[5].algorithm
    assert not any(r.async_op for r in log)
    assert first[1].peer == 0 and first[0].peer is None


def test_the_issue_figures_for_one_all_reduce():
    """A 1000x500 float32 all_reduce: 2,000,000 bytes per rank by formula on
    2 ranks, 3,000,000 on 4; gloo writes a few hundred header bytes more."""
    for n, formula in ((2, 2_000_000), (4, 3_000_000)):
        log = course.launch(one_all_reduce, n).comm
        assert [r.predicted for r in log] == [formula] * n
        assert all(formula <= r.measured <= formula + HEADERS for r in log)


def one_all_reduce():
    dist.all_reduce(torch.ones(1000, 500))


def ring_step_in_a_batch():
    rank, n = dist.get_rank(), dist.get_world_size()
    out, into = torch.ones(250_000), torch.empty(250_000)
    ops = [dist.P2POp(dist.isend, out, (rank + 1) % n), dist.P2POp(dist.irecv, into, (rank - 1) % n)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    send = dist.isend(out, (rank + 1) % n)
    dist.irecv(into, (rank - 1) % n).wait()
    send.wait()
    return into.sum().item()


def test_async_and_batched_messages_are_recorded_once_each():
    results = course.launch(ring_step_in_a_batch, 2)
    assert list(results) == [250_000.0, 250_000.0]
    for rank in (0, 1):
        mine = results.comm.rank(rank)
        assert [r.op for r in mine] == ["isend", "irecv", "isend", "irecv"]
        assert [r.predicted for r in mine] == [1_000_000, 0, 1_000_000, 0]
        assert [r.peer for r in mine] == [1 - rank] * 4
        assert all(r.async_op and r.shared and r.end is not None for r in mine)
        sends = [r.measured for r in mine if r.op == "isend"]
        assert all(close_to(m, 1_000_000) for m in sends), sends


def overlapping_all_reduces():
    if dist.get_rank() == 1:
        time.sleep(0.3)  # rank 0's first all_reduce cannot finish before its second starts
    big, small = torch.ones(500_000), torch.ones(250_000)
    works = [dist.all_reduce(big, async_op=True), dist.all_reduce(small, async_op=True)]
    for work in works:
        work.wait()


def test_overlapping_operations_share_one_measurement():
    log = course.launch(overlapping_all_reduces, 2).comm.rank(0)
    assert [r.shared for r in log] == [True, True]
    assert log[0].measured == pytest.approx(2 * log[1].measured, rel=0.01)  # split by size
    assert close_to(sum(r.measured for r in log), 2_000_000 + 1_000_000)


def subgroup_calls():
    group = dist.new_group([1, 3])
    t = torch.ones(1000)
    if dist.get_rank() in (1, 3):
        dist.broadcast(t, src=3, group=group)
        dist.all_reduce(t, group=group)
    dist.all_reduce(t)


def test_subgroups_count_their_own_size_and_ranks():
    log = course.launch(subgroup_calls, 4).comm
    assert [r.op for r in log.rank(0)] == ["all_reduce"]
    for rank, root_sends in ((1, 0), (3, 4000)):
        broadcast, in_group, world = log.rank(rank)
        assert broadcast.group_size == 2 and broadcast.peer == 1  # rank 3 is rank 1 of [1, 3]
        assert broadcast.predicted == root_sends
        assert in_group.group_size == 2 and in_group.predicted == 4000
        assert world.group_size == 4 and world.predicted == 6000


# Rows of 1000 float32 each rank sends to each rank, rank 1 sending rank 2 none (an empty split): row r is
# rank r's input_split_sizes, column r its output_split_sizes.
ROWS = [[3, 1, 2],
        [2, 4, 0],
        [1, 5, 2]]
ROW_BYTES = 1000 * 4


def uneven_all_to_all():
    rank = dist.get_rank()
    sending = ROWS[rank]
    receiving = [ROWS[source][rank] for source in range(len(ROWS))]
    rows = torch.cat([torch.full((count, 1000), float(10 * rank + to)) for to, count in enumerate(sending)])
    into = torch.empty(sum(receiving), 1000)
    dist.all_to_all_single(into, rows, output_split_sizes=receiving, input_split_sizes=sending)
    return [int(v) for v in into[:, 0]]


def test_an_uneven_all_to_all_sends_all_but_its_own_rows():
    """Each rank sends every row but those for itself, whatever the split sizes (an empty one included);
    gloo's socket bytes agree."""
    results = course.launch(uneven_all_to_all, 3)
    for rank in range(3):
        assert results[rank] == [10 * source + rank for source in range(3) for _ in range(ROWS[source][rank])]
        (record,) = results.comm.rank(rank)
        own = ROWS[rank][rank] * ROW_BYTES
        assert record.nbytes == sum(ROWS[rank]) * ROW_BYTES
        assert record.predicted == record.nbytes - own, (rank, record.predicted)
        assert close_to(record.measured, record.predicted), (rank, record.measured, record.predicted)
    assert transfer.predict("all_to_all_single", 9000, 3).sent == 6000          # equal chunks: (N - 1) / N


def test_the_log_is_a_table():
    frame = course.launch(one_all_reduce, 2).comm.to_frame()
    assert list(frame.columns[:5]) == ["rank", "op", "shape", "dtype", "nbytes"]
    assert {"algorithm", "predicted", "measured", "shared"} <= set(frame.columns)
    assert list(frame["rank"]) == [0, 1] and set(frame["op"]) == {"all_reduce"}


@pytest.fixture
def one_rank_here():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_recording_patches_only_while_it_runs(one_rank_here):
    original = dist.all_reduce
    calls = recorder.Recorder(rank=0, backend="gloo")
    with calls.patch() as log:
        assert dist.all_reduce is not original and dist.all_reduce == original
        dist.all_reduce(torch.ones(10))
        with pytest.raises(ValueError, match="Invalid destination rank"):
            dist.send(torch.ones(3), dst=0)  # torch refuses to send to itself
        with pytest.raises(RuntimeError, match="invalid root rank: 5"):
            dist.broadcast(torch.ones(3), src=5)  # torch's own words, not the recorder's
    assert dist.all_reduce is original
    # The broadcast the recorder could not read (no rank 5) is recorded where it reached the group.
    assert [r.op for r in log] == ["all_reduce", "send", "broadcast"]
    assert (log[2].peer, log[2].algorithm) == (5, "unknown")
    assert all(r.end is not None for r in log)  # the failed send is closed too


# --- the formulas alone --------------------------------------------------------------

def test_ring_formulas_on_dettmers_gradient():
    assert transfer.ring_all_reduce(S, 2) == 2_000_000
    assert transfer.ring_all_reduce(S, 4) == 3_000_000
    assert transfer.ring_reduce_scatter(S, 4) == 1_500_000
    assert transfer.ring_all_gather(S, 4) == 1_500_000
    assert transfer.ring_all_reduce(10, 3) == pytest.approx(40 / 3)  # not a whole number


@pytest.mark.parametrize("n, sends", [
    (2, [1, 0]), (3, [2, 0, 0]), (4, [2, 1, 0, 0]), (5, [3, 1, 0, 0, 0]),
    (8, [3, 2, 1, 1, 0, 0, 0, 0]),
])
def test_binomial_tree_broadcast_as_gloo_runs_it(n, sends):
    # measured on gloo for n = 2..5 (every root): rank r sends to r + 2**k for 2**k > r
    assert [transfer.binomial_tree_sends(1, n, r) for r in range(n)] == sends
    assert sum(sends) == n - 1  # every rank but the root receives exactly once


def test_nccl_rings_and_chains():
    predict = transfer.predict
    assert predict("reduce_scatter", 4 * S, 4, backend="nccl").sent == 3 * S
    assert [predict("broadcast", S, 4, rank=r, root=2).sent for r in range(4)] == [S, 0, S, S]
    assert [predict("reduce", S, 4, rank=r, root=2).sent for r in range(4)] == [S, S, 0, S]


@pytest.mark.parametrize("args, message", [
    (("all_scatter", 10, 2), "no transfer formula for 'all_scatter'"),
    (("all_reduce", 10, 0), "at least 1"),
    (("all_reduce", -1, 2), "cannot be negative"),
    (("broadcast", 10, 2, {"root": 2}), "must lie in 0..1"),
    (("all_reduce", 10, 2, {"backend": "mpi"}), "backend must be"),
    (("all_reduce", 10, 2, {"kept": 5}), "all_reduce takes none"),
    (("all_to_all_single", 10, 2, {"kept": 11}), "between 0 and nbytes"),
])
def test_formulas_refuse_nonsense(args, message):
    *positional, options = args if isinstance(args[-1], dict) else (*args, {})
    with pytest.raises(ValueError, match=message):
        transfer.predict(*positional, **options)


def _recorded_then_not():
    t = torch.ones(10)
    dist.all_reduce(t)
    with course.recorder.unrecorded():
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
    dist.barrier()
    return t[0].item()


def test_unrecorded_calls_still_run_but_leave_no_record():
    results = course.launch(_recorded_then_not, 2)
    assert list(results) == [4.0, 4.0]          # both all-reduces ran
    assert [r.op for r in results.comm.rank(0)] == ["all_reduce", "barrier"]
    with course.recorder.unrecorded():              # outside a rank: nothing to pause
        pass


def test_a_record_says_what_it_sent_measured_where_read_else_by_the_formula():
    from course.comm import CommRecord

    record = CommRecord(rank=0, op="all_reduce", shape=(4,), dtype="float32", nbytes=16, group_size=2,
                        peer=None, async_op=False, algorithm="ring", predicted=16, measured=None)
    assert record.sent == 16
    record.measured = 80          # on the sockets: the formula's bytes and gloo's header
    assert record.sent == 80
    record.measured = 0           # read, and nothing written: still measured
    assert record.sent == 0
