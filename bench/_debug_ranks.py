"""The ranks bench/debug_tools.py tries PyTorch's debugging tools on, and the launcher that starts them.

    values = start(fr_records, 2, env={"TORCH_FR_BUFFER_SIZE": "0"})     # rank -> what it returned, or None

`start` forks real gloo ranks from multiprocessing's forkserver (torch imported once), not course.launch: each
probe needs its own process group timeout, its own environment read before the group exists
(TORCH_DISTRIBUTED_DEBUG, TORCH_FR_BUFFER_SIZE) and ranks that may hang or fail, which course.launch would
report as a failed launch. Each rank sets the environment it is given, makes its group on a FileStore in the
probe's folder with the probe's timeout (PG_TIMEOUT_S where a rank is to wait in vain), runs the probe and writes
what it returned (or the error it raised) as JSON; the launcher waits for every rank to exit, up to its own
timeout, then kills and reaps the rest.
"""
from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import pickle
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

#: Seconds a collective may wait before gloo gives up (the process group's timeout in every probe).
PG_TIMEOUT_S = 2.0
#: The process group's timeout where every rank makes every call: room for a rank slowed by a loaded machine.
UNHURRIED_S = 30.0
#: Seconds a rank that skipped a call waits for the others to be done with it.
WAIT_S = 20.0


def start(fn, world_size: int, *, args=(), env=None, pg_timeout_s: float = PG_TIMEOUT_S,
          timeout_s: float = 60.0) -> dict:
    """fn(rank, world_size, store, folder, *args) on world_size gloo ranks, each with `env` set before its process
    group (of timeout pg_timeout_s) exists ("{folder}" in a value: the probe's folder). Returns {"ranks": {rank:
    the dict it returned, {"raised": text}, or None where it wrote nothing}, "exit_codes": {rank: its exit code,
    -9 where killed after timeout_s}, "stderr": {rank: the end of what it wrote to stdout and stderr}, "folder":
    the probe's folder, a temporary one the caller removes}."""
    folder = Path(tempfile.mkdtemp(prefix="debug_tools_"))
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed"])    # no effect where one already runs
    ranks = [context.Process(target=_rank, args=(fn, rank, world_size, str(folder), dict(env or {}), tuple(args),
                                                        pg_timeout_s),
                             daemon=True) for rank in range(world_size)]
    for process in ranks:
        process.start()
    deadline = time.monotonic() + timeout_s
    for process in ranks:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in ranks:
        if process.is_alive():
            process.kill()
        process.join()
    values, stderr = {}, {}
    for rank in range(world_size):
        path = folder / f"rank{rank}.json"
        values[rank] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        log = folder / f"rank{rank}.log"
        stderr[rank] = log.read_text(encoding="utf-8", errors="replace")[-600:] if log.is_file() else ""
    return {"ranks": values, "exit_codes": {rank: p.exitcode for rank, p in enumerate(ranks)}, "stderr": stderr,
            "folder": folder}


def _rank(fn, rank, world_size, folder, env, args, pg_timeout_s):
    log = os.open(os.path.join(folder, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for stream in (1, 2):                      # gloo's own aborts and torch's C++ logs, kept with the rank
        os.dup2(log, stream)
    os.environ.update({name: value.format(folder=folder) for name, value in env.items()})
    dist.set_debug_level_from_env()            # torch reads TORCH_DISTRIBUTED_DEBUG when torch.distributed is imported
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(folder, "store"), world_size)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size, store=store,
                                timeout=datetime.timedelta(seconds=pg_timeout_s))
        value = fn(rank, world_size, store, Path(folder), *args)
    except Exception as error:                 # noqa: BLE001 - the error is the finding
        value = {"raised": error_text(error), "traceback": traceback.format_exc(limit=3)}
    written = Path(folder) / f"rank{rank}.json.part"
    written.write_text(json.dumps(value, default=str), encoding="utf-8")
    written.rename(Path(folder) / f"rank{rank}.json")     # whole, or not there
    if dist.is_initialized():
        dist.destroy_process_group()


def error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".strip()


def attempt(call) -> dict:
    """{"ok": True} where call() returned, {"raised": its error} where it raised."""
    try:
        call()
        return {"ok": True}
    except Exception as error:                 # noqa: BLE001 - the error is the finding
        return {"raised": error_text(error)}


#: The Flight Recorder's dumps, the one for every backend first (torch._C._distributed_c10d's names).
FR_DUMPS = ("_dump_fr_trace", "_dump_nccl_trace")


def fr_dump() -> dict:
    """This process's Flight Recorder buffer, as torch hands it over (pickled); api None where torch has no dump."""
    c10d = torch._C._distributed_c10d
    for name in FR_DUMPS:
        if hasattr(c10d, name):
            return {"api": name, "trace": pickle.loads(getattr(c10d, name)())}
    return {"api": None, "trace": None}


ENTRY_FIELDS = ("profiling_name", "collective_seq_id", "p2p_seq_id", "is_p2p", "input_sizes", "input_dtypes",
                "output_sizes", "state", "retired", "timeout_ms")
TORCH_FOLDER = os.path.dirname(torch.__file__)


def entries(trace) -> list[dict]:
    """Each entry's fields, and "caller": the first frame of its Python stack outside torch, "file:line function"."""
    found = []
    for entry in (trace or {}).get("entries", []):
        frames = [f for f in entry.get("frames", []) if not f["filename"].startswith(TORCH_FOLDER)]
        caller = (f"{os.path.basename(frames[0]['filename'])}:{frames[0]['line']} {frames[0]['name']}"
                  if frames else None)
        found.append({**{field: entry.get(field) for field in ENTRY_FIELDS}, "caller": caller})
    return found


# --- the probes: each runs on every rank ----------------------------------------------------------------------

def fr_records(rank, world_size, store, folder):
    """One of each kind of call; then the rank's Flight Recorder buffer (pickled and JSON); then an all_reduce on a
    group from new_group, and which groups the buffer's entries and its groups' config (pg_config) name."""
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    dist.all_gather([torch.empty(4) for _ in range(world_size)], t)
    if rank == 0:
        dist.send(t, 1)
    elif rank == 1:
        dist.recv(t, 0)
    dist.barrier()
    dump = fr_dump()
    c10d = torch._C._distributed_c10d
    as_json = json.loads(c10d._dump_fr_trace_json()) if hasattr(c10d, "_dump_fr_trace_json") else None
    found = {"api": dump["api"], "keys": sorted(dump["trace"] or {}), "entries": entries(dump["trace"]),
             "json_entries": None if as_json is None else len(as_json.get("entries", [])),
             "pg_config": (dump["trace"] or {}).get("pg_config")}
    dist.all_reduce(t, group=dist.new_group())
    after = fr_dump()["trace"] or {}
    return {**found, "with_new_group": {"groups": sorted({tuple(e["process_group"]) for e in after.get("entries", [])}),
                                        "pg_config": after.get("pg_config")}}


def fr_hang(rank, world_size, store, folder):
    """Rank 1 skips the second all_reduce; the others wait in it until the timeout. Each writes its buffer as
    <folder>/fr/trace_<rank> (the analyzer's layout); rank 1 stays until rank 0 is done, and returns what it saw."""
    (folder / "fr").mkdir(exist_ok=True)
    dist.all_reduce(torch.ones(4))
    seen = {"raised": None}
    if rank != 1:
        seen = attempt(lambda: dist.all_reduce(torch.ones(4)))
    dump = fr_dump()
    (folder / "fr" / f"trace_{rank}").write_bytes(pickle.dumps(dump["trace"]))
    if rank == 0:
        store.set("hang/0", "done")
    else:                               # leaving now would close rank 0's sockets: a peer error, not a timeout
        store.wait(["hang/0"], datetime.timedelta(seconds=WAIT_S))
    return {**seen, "entries": entries(dump["trace"])}


def mismatch(rank, world_size, store, folder, kind):
    """Rank 0 all-reduces 4 floats; rank 1 all-reduces 5 ("shape") or broadcasts 4 ("op")."""
    t = torch.full((5 if rank == 1 and kind == "shape" else 4,), float(rank + 1))
    if rank == 1 and kind == "op":
        seen = attempt(lambda: dist.broadcast(t, 0))
    else:
        seen = attempt(lambda: dist.all_reduce(t))
    return {**seen, "result": t.tolist()}


def monitored(rank, world_size, store, folder, absent):
    """Every rank but `absent` calls monitored_barrier (rank 0 waiting for all); the absent wait for rank 0."""
    if rank in absent:
        store.wait(["barrier/0"], datetime.timedelta(seconds=WAIT_S))
        return {"called": False}
    seen = attempt(lambda: dist.monitored_barrier(timeout=datetime.timedelta(seconds=PG_TIMEOUT_S),
                                                  wait_all_ranks=True))
    if rank == 0:
        store.set("barrier/0", "done")
    return {"called": True, **seen}


def comm_debug(rank, world_size, store, folder):
    """CommDebugMode around a DTensor program (a sharded matmul made whole, a sum) and around a plain all_reduce."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    x = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])
    w = distribute_tensor(torch.randn(4, 4), mesh, [Replicate()])
    with CommDebugMode() as dtensor_mode:
        (x @ w).redistribute(mesh, [Replicate()])
        x.sum().full_tensor()
    with CommDebugMode() as plain_mode:
        dist.all_reduce(torch.ones(4))
    return {"dtensor": {str(op): n for op, n in dtensor_mode.get_comm_counts().items()},
            "dtensor_total": dtensor_mode.get_total_counts(),
            "plain": {str(op): n for op, n in plain_mode.get_comm_counts().items()},
            "plain_total": plain_mode.get_total_counts()}


def profiled(rank, world_size, store, folder):
    """torch.profiler (CPU activity) around four collectives; the names its chrome trace holds for them."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = torch.ones(1000)
        dist.all_reduce(t)
        dist.broadcast(t, 0)
        dist.all_gather([torch.empty(1000) for _ in range(world_size)], t)
        dist.barrier()
    path = folder / f"trace_{rank}.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text(encoding="utf-8")).get("traceEvents", [])
    names = sorted({e["name"] for e in events if isinstance(e.get("name"), str)
                    and any(word in e["name"].lower() for word in ("gloo", "c10d", "all_reduce", "allreduce",
                                                                   "broadcast", "allgather", "all_gather",
                                                                   "barrier"))})
    return {"events": len(events), "names": names}
