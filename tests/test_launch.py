"""Covers: course.launch.

course.launch from a plain Python process: results, errors, hangs, leaks."""
import importlib
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

import course
from course import _tracebacks, placement
from helpers import REPO

# --- functions the ranks run (module level: importable, like a notebook's) --------

def rank_and_sum(offset, scale=1):
    t = torch.ones(3) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(),
            "sum": t[0].item() * scale + offset, "device": str(course.device())}


def threads_per_rank():
    return torch.get_num_threads()


def optimizer_imports_already_loaded():
    """Whether the modules a rank's first optimizer needs were there before it was built."""
    loaded = "torch._dynamo" in sys.modules
    torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    return loaded


def prints_lines():
    rank = dist.get_rank()
    print(f"hello from {rank}")
    print(f"to stderr {rank}", file=sys.stderr)
    print(f"no newline {rank}", end="")


def gathers_by_the_old_names():
    rank, world_size = dist.get_rank(), dist.get_world_size()
    gathered = torch.empty(world_size, 2)
    dist.all_gather_into_tensor(gathered, torch.full((1, 2), float(rank)))
    mine = torch.empty(1, 2)
    dist.reduce_scatter_tensor(mine, torch.ones(world_size, 2))
    return gathered[:, 0].tolist(), mine.tolist()


def raises_on_rank_1():
    t = torch.ones(4)
    if dist.get_rank() == 1:
        raise ValueError("rank 1 found a bad shape")
    dist.all_reduce(t)  # rank 0 waits here for a partner that will never come


class Unpicklable(Exception):
    def __init__(self, a, b):  # pickling re-calls __init__ with one argument and fails
        super().__init__(f"{a}-{b}")
        self.lock = threading.Lock()


def raises_unpicklable():
    if dist.get_rank() == 0:
        raise Unpicklable(1, 2)
    dist.barrier()


def exits_on_rank_1(code, stamp=None):
    if dist.get_rank() == 1:
        if stamp:
            Path(stamp).write_text(repr(time.time()))
        os._exit(code)
    dist.all_reduce(torch.ones(4))


def signals_rank_0(signum):
    if dist.get_rank() == 0:
        os.kill(os.getpid(), signum)
    dist.all_reduce(torch.ones(4))


def rank_0_skips_nothing_rank_1_skips_all_reduce():
    t = torch.ones(4)
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    return "done"


def rank_1_loops_forever():
    if dist.get_rank() == 1:
        while True:
            pass
    return "done"


def returns_generator():
    return (i for i in range(3))


def launches_again():
    return course.launch(threads_per_rank, 2)


def sleeps_forever(pid_dir):
    Path(pid_dir, f"{dist.get_rank()}.pid").write_text(str(os.getpid()))
    time.sleep(3600)


# --- results ----------------------------------------------------------------------

@pytest.mark.parametrize("world_size", [2, 4])
def test_results_come_back_by_rank(world_size):
    results = course.launch(rank_and_sum, world_size, args=(10,), kwargs={"scale": 2},
                            device="cpu")
    total = world_size * (world_size + 1) / 2
    assert [r["rank"] for r in results] == list(range(world_size))
    assert all(r["world"] == world_size and r["sum"] == total * 2 + 10 for r in results)
    assert all(r["device"] == "cpu" for r in results)
    assert results.ranks == tuple(range(world_size)) and len(results) == world_size
    assert results.backend == "gloo" and results.devices == ("cpu",) * world_size
    assert set(results.seconds) == set(range(world_size))
    with pytest.raises(IndexError, match=f"no result for rank {world_size}"):
        results[world_size]


def test_one_thread_per_rank_by_default():
    assert list(course.launch(threads_per_rank, 2)) == [1, 1]
    assert list(course.launch(threads_per_rank, 2, num_threads=2)) == [2, 2]


def test_ranks_start_with_what_an_optimizer_imports_already_imported():
    # torch.optim imports torch._dynamo when the first optimizer is built: 1.3-1.8 s in every
    # rank of every launch on a 2-core machine, unless the forkserver imported it once
    assert list(course.launch(optimizer_imports_already_loaded, 2)) == [True, True]


def test_functions_sent_to_the_ranks_keep_the_file_they_were_defined_in():
    # cloudpickle >= 3.1.3 renames code sent by value '<dynamic-code>'; tracebacks label cells by file
    import cloudpickle

    from course import _pickling

    namespace = {}
    exec(compile("def outer(x):\n    def inner():\n        return x + 1\n    return inner\n",
                 "/tmp/ipykernel_1/4242.py", "exec"), namespace)
    outer = cloudpickle.loads(_pickling.dumps(namespace["outer"]))
    assert outer.__code__.co_filename == "/tmp/ipykernel_1/4242.py"
    assert outer(1).__code__.co_filename == "/tmp/ipykernel_1/4242.py"      # nested code too
    assert outer(1)() == 2


def test_output_reaches_the_caller_prefixed_by_rank(capfd):
    course.launch(prints_lines, 2)
    out, err = capfd.readouterr()
    for rank in (0, 1):
        assert f"[rank {rank}] hello from {rank}\n" in out
        assert f"[rank {rank}] no newline {rank}\n" in out
        assert f"[rank {rank}] to stderr {rank}\n" in err


def test_the_collectives_torch_renamed_run_without_a_word_on_stderr(capfd):
    """nbgrader scores a test cell that writes to stderr 0: torch 2.13's deprecation of the names torch 2.4 to
    2.12 use must not cost a student who used them an exercise."""
    run = course.launch(gathers_by_the_old_names, 2)
    assert run[0] == run[1] == ([0.0, 1.0], [[2.0, 2.0]])
    assert "deprecated" not in capfd.readouterr().err


def test_output_keeps_lines_whole_and_carriage_returns(capfd):
    from course._output import RankOutput
    output = RankOutput()
    output.write(0, "stdout", b"par")
    output.write(1, "stdout", b"other\n")
    output.write(0, "stdout", b"tial\n 50%\r100%\r")
    output.write(0, "stdout", "caf\u00e9".encode()[:4])  # a character split across reads
    output.write(0, "stdout", "caf\u00e9".encode()[4:] + b"\n")
    output.flush()
    out = capfd.readouterr().out
    assert out == ("[rank 1] other\n[rank 0] partial\n[rank 0]  50%\r[rank 0] 100%\r"
                   "[rank 0] caf\u00e9\n")


# --- a rank that raises -------------------------------------------------------------

def test_a_rank_exception_reaches_the_caller_with_its_traceback():
    started = time.monotonic()
    with pytest.raises(ValueError, match="rank 1 found a bad shape") as caught:
        course.launch(raises_on_rank_1, 2, timeout=60)
    assert time.monotonic() - started < 30  # reported at once, not at the timeout
    error = caught.value
    assert error.rank == 1
    assert any("raised on rank 1 of 2" in note for note in error.__notes__)
    remote = str(error.__cause__)
    assert isinstance(error.__cause__, course.RemoteTraceback)
    assert remote.startswith("Traceback on rank 1 (most recent call last):")
    assert 'raise ValueError("rank 1 found a bad shape")' in remote  # the source line
    assert "_worker.py" not in remote and "comm.py" not in remote  # our plumbing is cut
    # the cause is rank 1's error, never rank 0's lost connection
    assert "Connection closed" not in remote and "Connection closed" not in str(error)


def test_an_exception_that_cannot_travel_becomes_a_rank_error():
    with pytest.raises(course.RankError, match="rank 0 raised Unpicklable: 1-2") as caught:
        course.launch(raises_unpicklable, 2)
    assert caught.value.ranks == (0,)
    assert "raise Unpicklable(1, 2)" in str(caught.value.__cause__)


def test_a_result_that_cannot_travel_is_reported():
    with pytest.raises(TypeError, match="generator") as caught:
        course.launch(returns_generator, 2)
    assert any("sending its return value to the cell" in n for n in caught.value.__notes__)


# --- a rank that dies -----------------------------------------------------------------

def test_a_rank_that_exits_is_reported_by_rank_and_code_within_a_second(tmp_path):
    stamp = tmp_path / "exit-time"
    with pytest.raises(course.RankExited, match="rank 1 exited with code 3") as caught:
        course.launch(exits_on_rank_1, 2, args=(3, str(stamp)), timeout=60)
    reported = time.time()
    assert caught.value.ranks == (1,)
    assert reported - float(stamp.read_text()) < 1.0  # seen at once, not at the timeout


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSEGV])
def test_a_rank_killed_by_a_signal_is_reported(signum, capfd):
    name = signal.Signals(signum).name
    with pytest.raises(course.RankExited, match=f"rank 0 was killed by signal {signum} "
                                                 rf"\({name}\)"):
        course.launch(signals_rank_0, 2, args=(signum,), timeout=60)
    if signum == signal.SIGSEGV:  # faulthandler shows where, in the rank's stderr
        assert "[rank 0] Fatal Python error: Segmentation fault" in capfd.readouterr().err


# --- ranks that hang ------------------------------------------------------------------

def test_a_deadlock_ends_at_the_timeout_naming_each_rank_and_where_it_waits():
    started = time.monotonic()
    with pytest.raises(course.RankTimeout) as caught:
        course.launch(rank_0_skips_nothing_rank_1_skips_all_reduce, 2, timeout=2)
    elapsed = time.monotonic() - started
    assert 2 <= elapsed < 15
    message = str(caught.value)
    assert caught.value.ranks == (0,)
    assert "rank 0 is waiting here:" in message
    assert "    dist.all_reduce(t)" in message  # the source line it waits on
    assert "waiting in torch.distributed.distributed_c10d.all_reduce" in message
    assert "rank 1 returned from rank_0_skips_nothing_rank_1_skips_all_reduce" in message
    assert isinstance(caught.value, TimeoutError)


def messages_a_rank_that_does_not_exist(op, peer):
    t = torch.zeros(3)
    if dist.get_rank() == 1:
        if op == "recv":
            dist.recv(t, src=peer)
        else:
            dist.isend(t, dst=peer).wait()
    return dist.get_rank()


@pytest.mark.parametrize("op, peer, words", [("recv", 2, "dist.recv from rank 2"),
                                             ("isend", -1, "dist.isend to rank -1")])
def test_a_message_to_or_from_a_rank_that_does_not_exist_is_refused_at_once(op, peer, words):
    # gloo would wait for ever, or end the process with signal 11 and no word of why.
    started = time.monotonic()
    with pytest.raises(ValueError, match="there is no rank") as caught:
        course.launch(messages_a_rank_that_does_not_exist, 2, args=(op, peer), timeout=30)
    assert time.monotonic() - started < 15
    assert f"rank 1: {words}" in str(caught.value) and "the ranks are 0 to 1" in str(caught.value)


def test_a_rank_stuck_in_python_shows_its_line():
    with pytest.raises(course.RankTimeout, match="rank 1 is waiting here") as caught:
        course.launch(rank_1_loops_forever, 2, timeout=1)
    assert "while True:" in str(caught.value) or "pass" in str(caught.value)


def test_the_default_timeout_comes_from_the_environment(monkeypatch):
    launching = importlib.import_module("course.launch")   # the module; course.launch is the function
    monkeypatch.delenv("COURSE_RANK_TIMEOUT", raising=False)
    assert launching.default_timeout() == launching.DEFAULT_TIMEOUT_S == 30.0
    # help(course.launch) says where the default comes from
    default = inspect.signature(course.launch).parameters["timeout"].default
    assert repr(default) == "$COURSE_RANK_TIMEOUT or 30 s"
    monkeypatch.setenv("COURSE_RANK_TIMEOUT", " 120 ")
    assert launching.default_timeout() == 120.0
    monkeypatch.setenv("COURSE_RANK_TIMEOUT", "1")
    started = time.monotonic()
    with pytest.raises(course.RankTimeout, match="within 1 s") as caught:
        course.launch(rank_0_skips_nothing_rank_1_skips_all_reduce, 2)
    assert time.monotonic() - started < 15
    # the report says how to wait longer, for one launch or for all
    assert "timeout=120" in str(caught.value) and "COURSE_RANK_TIMEOUT=120" in str(caught.value)


@pytest.mark.parametrize("value", ["thirty", "0", "-5", "inf", "nan"])
def test_a_bad_timeout_variable_is_refused_before_anything_starts(monkeypatch, value):
    monkeypatch.setenv("COURSE_RANK_TIMEOUT", value)
    with pytest.raises(ValueError, match=f"COURSE_RANK_TIMEOUT='{value}' is not a number of seconds: "
                                         "set it to a positive number"):
        course.launch(threads_per_rank, 2)
    assert list(course.launch(threads_per_rank, 2, timeout=60)) == [1, 1]  # an explicit one is used as is


# --- what a notebook shows when a launch fails ------------------------------------------

def _frames(tb):
    return [(entry.tb_frame.f_code.co_filename, entry.tb_frame.f_code.co_name) for entry in traceback_walk(tb)]


def traceback_walk(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


@pytest.mark.parametrize("fn, args, raised", [
    (raises_on_rank_1, (), ValueError),
    (exits_on_rank_1, (3,), course.RankExited),
    (rank_0_skips_nothing_rank_1_skips_all_reduce, (), course.RankTimeout),
])
def test_a_failures_rendered_traceback_leaves_the_launchers_frames_out(fn, args, raised):
    with pytest.raises(raised) as caught:
        course.launch(fn, 2, args=args, timeout=2)
    error = caught.value
    files = [filename for filename, _ in _frames(error.__traceback__)]
    assert any(f.endswith("launch.py") for f in files) and any(f.endswith("_processes.py") for f in files)
    # what IPython draws (outside IPython: the standard format), from the caller's frame down
    shown = _frames(_tracebacks.without_course_frames(error.__traceback__))
    assert shown[-1] == (__file__, "test_a_failures_rendered_traceback_leaves_the_launchers_frames_out")
    assert not [f for f, _ in shown if f.startswith(_tracebacks.COURSE_DIR)]
    text = "".join(error._render_traceback_())
    assert "course/launch.py" not in text and "_processes.py" not in text
    assert "course.launch(fn, 2, args=args, timeout=2)" in text and raised.__name__ in text
    if raised is ValueError:   # the rank's own traceback, chained above
        assert 'raise ValueError("rank 1 found a bad shape")' in text


# --- nothing outlives a call ------------------------------------------------------------

def _footprint():
    me = psutil.Process()
    children = sorted(p.pid for p in me.children(recursive=True))
    listening = [c for c in me.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    files = sorted(os.listdir(tempfile.gettempdir())) + sorted(os.listdir("/dev/shm"))
    return {"children": children, "fds": len(os.listdir("/proc/self/fd")),
            "listening": len(listening), "files": files}


def twenty_runs() -> dict:
    """Footprint after one warm-up launch (which starts the forkserver) and
    after 20 more: successes, raises, exits and a timeout (a leak of one launch
    shows 20 times over)."""
    course.launch(threads_per_rank, 2)
    before = _footprint()
    failures = {ValueError: 0, course.RankExited: 0, course.RankTimeout: 0}
    for i in range(20):
        try:
            if i % 10 == 3:
                course.launch(raises_on_rank_1, 2)
            elif i % 10 == 7:
                course.launch(exits_on_rank_1, 2, args=(1,))
            elif i == 10:
                course.launch(rank_0_skips_nothing_rank_1_skips_all_reduce, 2, timeout=0.5)
            else:
                course.launch(threads_per_rank, 2)
        except tuple(failures) as error:
            failures[type(error)] += 1
    return {"before": before, "after": _footprint(),
            "failures": [failures[k] for k in (ValueError, course.RankExited, course.RankTimeout)]}


@pytest.mark.slow
def test_twenty_runs_leak_no_process_fd_port_or_file():
    # In a process of its own whose temporary folder is private and empty, so
    # that every file the launcher, the forkserver or a rank leaves is seen. Beside
    # the system's, not in tmp_path: the forkserver's socket lives in it, and a
    # socket's path has at most 107 bytes (an xdist worker's tmp_path is long).
    with tempfile.TemporaryDirectory(prefix="twenty-") as private_tmp:
        _twenty_runs_in(Path(private_tmp))


def _twenty_runs_in(private_tmp: Path):
    code = ("import json, sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; import test_launch; "
            "print(json.dumps(test_launch.twenty_runs()))")
    done = subprocess.run([sys.executable, "-c", code, str(REPO), str(REPO / "tests")],
                          env={**os.environ, "TMPDIR": str(private_tmp)}, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["failures"] == [2, 2, 1]
    assert report["after"] == report["before"]


def test_ranks_start_under_a_temporary_folder_too_long_for_a_unix_socket(tmp_path):
    # multiprocessing's forkserver listens on a socket in TMPDIR; unix socket paths are capped at 107
    # bytes. The launcher puts it in /tmp instead, and multiprocessing removes that folder at exit.
    long_tmp = tmp_path / ("t" * (120 - len(str(tmp_path))))
    long_tmp.mkdir()
    script = ("import multiprocessing.util, course\n"
              "print(course.launch(lambda: 7, 2)[1], multiprocessing.util.get_temp_dir())\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TMPDIR": str(long_tmp)})
    assert done.returncode == 0, done.stderr[-3000:]
    answer, used = done.stdout.split()
    assert answer == "7" and Path(used).parent == Path("/tmp"), done.stdout
    assert not Path(used).exists(), f"{used} left behind"


def test_a_process_killed_with_its_group_leaves_no_multiprocessing_folder():
    # How Jupyter ends a kernel (SIGKILL to its process group) runs no exit handler, so multiprocessing
    # cannot remove its folder, where the forkserver's socket is: hundreds were left in /tmp. The forkserver,
    # in a group of its own (course._forkserver_folder), ends once its starter is gone and removes it.
    script = ("import sys, multiprocessing.util, course\n"
              "print(course.launch(lambda: 7, 2)[1], multiprocessing.util.get_temp_dir(), flush=True)\n"
              "sys.stdin.read()\n")        # until the test kills it
    with tempfile.TemporaryDirectory(prefix="killed-") as private_tmp:
        starter = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True, start_new_session=True,
                                   env={**os.environ, "TMPDIR": private_tmp})
        try:
            answer, folder = starter.stdout.readline().split()     # a whole line: the ranks ran
            forkservers = [p for p in psutil.Process(starter.pid).children()
                           if "multiprocessing.forkserver" in " ".join(p.cmdline())]
        finally:
            os.killpg(starter.pid, signal.SIGKILL)
            starter.communicate()
        assert answer == "7" and Path(folder).parent == Path(private_tmp) and len(forkservers) == 1
        _, alive = psutil.wait_procs(forkservers, timeout=60)
        assert not alive, "the forkserver outlived its starter by a minute"
        # (torchinductor_<user>: torch's compile cache, one folder a user, made on importing torch._dynamo, reused)
        left = [name for name in os.listdir(private_tmp) if not name.startswith("torchinductor_")]
        assert left == [], f"left behind: {left}"


def test_an_interrupt_ends_every_rank_within_two_seconds(tmp_path):
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(REPO)!r}); sys.path.insert(0, {str(REPO / 'tests')!r})
        import course, test_launch
        try:
            course.launch(test_launch.sleeps_forever, 2, args=({str(tmp_path)!r},), timeout=None)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("*.pid"))) < 2:
            assert time.monotonic() < deadline and process.poll() is None, "ranks never started"
            time.sleep(0.05)
        pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
        process.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        out, _ = process.communicate(timeout=10)
        while any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                  for pid in pids):
            assert time.monotonic() - interrupted < 2, "a rank outlived the interrupt"
            time.sleep(0.02)
        assert "interrupted" in out
    finally:
        process.kill()


def test_an_interrupt_as_a_rank_starts_leaves_no_rank_and_lets_the_process_end(tmp_path):
    """The interrupt lands just after rank 1's fork, before the launcher has it among its ranks
    (a forked rank may run before start() returns): rank 1 is ended too, and the script exits
    instead of waiting at exit for a rank that waits for it."""
    script = tmp_path / "interrupted_at_start.py"
    script.write_text(textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(REPO)!r}); sys.path.insert(0, {str(REPO / 'tests')!r})
        import multiprocessing.context
        import course, test_launch

        start = multiprocessing.context.ForkServerProcess.start
        def start_then_interrupt(process):
            start(process)
            print("started", process.pid, flush=True)
            if process.name == "rank 1":
                raise KeyboardInterrupt
        multiprocessing.context.ForkServerProcess.start = start_then_interrupt
        try:
            course.launch(test_launch.sleeps_forever, 2, args=({str(tmp_path)!r},), timeout=None)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert "interrupted" in done.stdout, done.stdout + done.stderr
    pids = [int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("started")]
    assert len(pids) == 2, done.stdout
    deadline = time.monotonic() + 5
    while any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in pids):
        assert time.monotonic() < deadline, "a rank outlived the interrupt"
        time.sleep(0.02)


# --- arguments and placement ----------------------------------------------------------

@pytest.mark.parametrize("call, error, message", [
    (lambda: course.launch(threads_per_rank, 0), ValueError, "positive whole number"),
    (lambda: course.launch(threads_per_rank, "2"), ValueError, "positive whole number"),
    (lambda: course.launch(threads_per_rank, 2, backend="mpi"), ValueError, "'gloo' or 'nccl'"),
    (lambda: course.launch(rank_and_sum, 2, args=5), TypeError, "args=\\(x,\\)"),
    (lambda: course.launch(threads_per_rank, 2, timeout=-1), ValueError, "timeout"),
    (lambda: course.launch(threads_per_rank, 2, num_threads=0), ValueError, "num_threads"),
    (lambda: course.launch("not a function", 2), TypeError, "needs a function"),
    (lambda: course.launch(rank_and_sum, 2, args=(threading.Lock(),)), TypeError,
     "could not send rank_and_sum"),
])
def test_bad_arguments_say_what_to_do(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_nccl_without_gpus_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="NCCL needs one GPU per rank: 2 ranks asked for, 0"):
        course.launch(threads_per_rank, 2, backend="nccl")


def test_launch_inside_a_rank_is_refused():
    with pytest.raises(RuntimeError, match="called inside a rank"):
        course.launch(launches_again, 2)


@pytest.mark.parametrize("world_size, backend, device, gpus, expected", [
    (2, None, None, 0, ("gloo", ("cpu", "cpu"))),
    (2, None, None, 1, ("gloo", ("cuda:0", "cuda:0"))),
    (4, None, None, 2, ("gloo", ("cuda:0", "cuda:1", "cuda:0", "cuda:1"))),
    (2, None, None, 2, ("nccl", ("cuda:0", "cuda:1"))),
    (2, None, None, 8, ("nccl", ("cuda:0", "cuda:1"))),
    (2, "gloo", None, 8, ("gloo", ("cuda:0", "cuda:1"))),
    (2, None, "cpu", 8, ("gloo", ("cpu", "cpu"))),
])
def test_placement_picks_backend_and_devices(world_size, backend, device, gpus, expected):
    chosen = placement.choose(world_size, backend, device, gpu_count=gpus)
    assert (chosen.backend, chosen.devices) == expected


@pytest.mark.parametrize("kwargs, message", [
    (dict(backend="nccl", gpu_count=1), "NCCL needs one GPU per rank"),
    (dict(backend="nccl", device="cpu", gpu_count=4), "NCCL runs on GPUs only"),
    (dict(device="cuda", gpu_count=0), "sees no GPU"),
    (dict(device="tpu", gpu_count=0), "device must be"),
])
def test_placement_refuses_what_cannot_run(kwargs, message):
    with pytest.raises(ValueError, match=message):
        placement.choose(2, **kwargs)


def test_torchrun_is_detected_from_its_environment(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert not placement.under_torchrun()
    for name, value in dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT="1").items():
        monkeypatch.setenv(name, value)
    assert placement.under_torchrun()
    rank, size, here = placement.torchrun_placement()
    assert (rank, size) == (1, 2) and here.world_size == 1


# --- how many ranks a lab launches, and where messages live ---------------------------

def test_lab_ranks_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(placement.RANKS_VARIABLE, raising=False)
    assert course.lab_ranks(2) == 2
    monkeypatch.setenv(placement.RANKS_VARIABLE, "4")
    assert course.lab_ranks(2) == 4
    for bad in ("0", "-1", "four", ""):
        monkeypatch.setenv(placement.RANKS_VARIABLE, bad)
        with pytest.raises(ValueError, match="COURSE_RANKS.*positive whole number"):
            course.lab_ranks(2)


def _where_messages_live():
    return str(course.message_device())


def test_message_device_is_the_cpu_on_gloo():
    assert str(course.message_device()) == "cpu"  # outside any rank
    assert list(course.launch(_where_messages_live, 2, backend="gloo")) == ["cpu", "cpu"]


def _arrives_after(seconds):
    """Called while a rank unpickles its arguments, before it begins the function."""
    time.sleep(seconds)
    return seconds


class ArrivesSlowly:
    """An argument that takes `seconds` to unpickle on each rank: a rank slow to start."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __reduce__(self):
        return _arrives_after, (self.seconds,)


def sleeps_then_returns(started_late, seconds):
    time.sleep(seconds)
    return started_late


def test_the_timeout_counts_the_function_s_run_not_the_ranks_start():
    # The ranks take 3 s to begin; the function then runs 0.5 s of its 2 s: no timeout.
    begun = time.monotonic()
    results = course.launch(sleeps_then_returns, 2, args=(ArrivesSlowly(3), 0.5), timeout=2)
    assert list(results) == [3, 3] and time.monotonic() - begun >= 3.5
    # Once begun, the function has its timeout and no more: a deadlock is stopped 1 s in.
    with pytest.raises(course.RankTimeout, match=r"ranks \[0\] did not finish "
                                                 r"rank_0_skips_nothing_rank_1_skips_all_reduce within 1 s"):
        course.launch(rank_0_skips_nothing_rank_1_skips_all_reduce, 2, timeout=1)


def test_ranks_that_never_begin_the_function_are_stopped_after_the_start_s_allowance(monkeypatch):
    from course import _processes

    monkeypatch.setattr(_processes, "STARTUP_S", 1)     # read by the launching process, not the ranks
    begun = time.monotonic()
    with pytest.raises(course.RankTimeout) as raised:
        course.launch(sleeps_then_returns, 2, args=(ArrivesSlowly(60), 0), timeout=1)
    assert time.monotonic() - begun < 30
    said = str(raised.value)
    assert "did not finish sleeps_then_returns within 2 s" in said, said
    assert "rank 0 had not reached sleeps_then_returns yet" in said, said
