"""Covers: course_tools.run, course_tools.trainings, course_tools.__main__.

Each lab's reference training as a script (`python -m course_tools run`) under torchrun: on
one node, and, where the nodes change how its ranks talk (ACROSS_NODES), as two nodes meeting
at a c10d rendezvous on this machine. The script
must end with the parameters and losses of the notebook's own run: the same
solution function launched with `course.launch` from this process, with the
arguments the notebook gives it; and close to one process's, as the notebook checks.
Everything connects to 127.0.0.1 only; every subprocess has a timeout."""
import functools
import os
import re
import signal
import subprocess
import sys
import tempfile
import uuid

import pytest
import torch
from test_launch_contexts import ENV, _free_port, _no_stray_processes  # noqa: F401 (autouse fixture)

import course
from course import _rank_process, check, stages
from course.grid_model import Grid
from course_tools import trainings
from course_tools.run import main
from grader.common.solution import load

pytestmark = pytest.mark.torchrun

STEPS = 3          # few steps, the notebooks' sizes otherwise: seconds on a 2-core machine
PIPELINE = "06_pipeline_parallel"   # rank r holds stage r's parameters; the last rank has the losses
COMPOSITION = "09_composition"      # every rank returns the whole model, gathered from its grid
TIMEOUT = 240      # seconds for one torchrun run, start to end
LOOPBACK = {"GLOO_SOCKET_IFNAME": _rank_process.loopback_interface() or "lo"}  # gloo stays on 127.0.0.1


@pytest.fixture(scope="module", autouse=True)
def _forkserver_started():
    """course.launch's server process lives as long as this process: start it before
    _no_stray_processes takes its list, so that only what a test leaves counts."""
    course.launch(int, 1)


@functools.cache
def solution(lab):
    return load(lab)


# --- the notebook's runs: the cells' own calls, written out here --------------------
# Written from each notebook, not taken from course_tools/trainings.py's LABS: the script is held to them. Each
# is {rank: (params, losses)} from course.launch of the solution's function on `ranks` ranks, as its
# notebook calls it, or the notebook's one-process run on 1.

def _data_parallel_run(nb, ranks, grid):
    """The notebook's train(ranks, torch.float32)."""
    digits = course.data.digits(dtype=torch.float32)
    run = course.launch(nb.data_parallel_training, ranks,
                        args=(functools.partial(course.models.mlp, dtype=torch.float32),
                              digits.train_x, digits.train_y),
                        kwargs=dict(steps=STEPS, batch_size=nb.BATCH_SIZE))
    return {rank: (run[rank]["params"], run[rank]["losses"]) for rank in run.ranks}


def _split_run(nb, ranks, grid):
    """The notebook's train("yours") on RANKS, "whole" on 1."""
    train = functools.partial(nb.split_training, make_block=nb.digits_block,
                              inputs=nb.digits.train_x, targets=nb.digits.train_y,
                              steps=STEPS, batch_size=nb.BATCH_SIZE, lr=nb.LEARNING_RATE)
    run = course.launch(train, ranks, args=("yours" if ranks > 1 else "whole",))
    return {rank: run[rank][:2] for rank in run.ranks}


def _hybrid_run(nb, ranks, grid):
    """The notebook's training on a grid (on 1 rank, a 1x1 grid)."""
    train = functools.partial(nb.hybrid_training, steps=STEPS, batch_size=nb.BATCH_SIZE, lr=nb.LEARNING_RATE)
    grid = grid or Grid(1, 1)
    run = course.launch(train, grid.ranks, args=(grid,))
    return {rank: run[rank][:2] for rank in run.ranks}


def _sharded_run(nb, ranks, grid):
    """The notebook's wide MLP, ZeRO-3 on RANKS, one_process_training on 1."""
    make_model = functools.partial(course.models.mlp, **nb.WIDE_MLP)
    options = dict(steps=STEPS, batch_size=nb.BATCH_SIZE,
                   make_optimizer=functools.partial(torch.optim.SGD, lr=nb.LEARNING_RATE, momentum=0.9))
    if ranks == 1:
        return {0: (nb.one_process_training(make_model, nb.digits.train_x, nb.digits.train_y, **options), None)}
    run = course.launch(nb.sharded_training, ranks, args=(make_model, nb.digits.train_x, nb.digits.train_y),
                        kwargs=dict(stage=3, **options))
    return {rank: (run[rank]["parameters"], run[rank]["losses"]) for rank in run.ranks}


def _pipeline_run(nb, ranks, grid):
    """The notebook's training cells: 1F1B on RANKS, one_process_training on 1."""
    x, y = nb.data.synthetic(STEPS * nb.BATCH_SIZE, 64)
    if ranks == 1:
        model, losses = nb.one_process_training(nb.pipe_mlp, x, y, steps=STEPS, batch_size=nb.BATCH_SIZE)
        return {0: ([p.detach() for p in model.parameters()], losses)}
    run = course.launch(nb.pipeline_training, ranks, args=(nb.one_f_one_b, nb.pipe_mlp, x, y),
                        kwargs=dict(steps=STEPS, batch_size=nb.BATCH_SIZE, micro_batches=nb.MICRO_BATCHES))
    return {rank: (run[rank]["parameters"], run[rank]["losses"]) for rank in run.ranks}


def _long_sequence_run(nb, ranks, grid):
    """The notebook's training cell: ring attention over the zig-zag split on RANKS, one_process_training on 1."""
    inputs, targets = nb.training_data()
    if ranks == 1:
        trained = nb.one_process_training(nb.training_block, inputs, targets, steps=STEPS)
        return {0: (trained["parameters"], trained["losses"])}
    run = course.launch(nb.long_sequence_training, ranks, args=(nb.training_block, inputs, targets),
                        kwargs=dict(steps=STEPS))
    return {rank: (run[rank]["parameters"], run[rank]["losses"]) for rank in run.ranks}


def _experts_run(nb, ranks, grid):
    """The notebook's training cell: expert parallelism on RANKS, one_process_training on 1 (its parameters
    in expert_parallel_training's order: the dense ones, then the experts')."""
    inputs, targets = nb.training_data(STEPS)
    if ranks == 1:
        trained = nb.one_process_training(nb.digits_model, inputs, targets)
        model = trained["model"]
        return {0: ([p.detach() for p in model.dense_parameters() + model.expert_parameters()], trained["losses"])}
    run = course.launch(nb.expert_parallel_training, ranks, args=(nb.digits_model, inputs, targets))
    return {rank: (run[rank]["parameters"], run[rank]["losses"]) for rank in run.ranks}


def _composition_run(nb, ranks, layout):
    """The notebook's grid_training on `layout` (a dict of sizes), or, given none, the layout
    course_tools gives `ranks` ranks by default; gpt.one_process_training on 1 (its parameters in GPT's order)."""
    batches = nb.training_batches(steps=STEPS)
    if ranks == 1:
        alone = nb.gpt.one_process_training(nb.CONFIG, batches, seed=nb.SEED)
        return {0: (list(alone.parameters.values()), alone.losses)}
    sizes = layout if isinstance(layout, dict) else trainings.DEFAULT_LAYOUTS[ranks]
    run = course.launch(nb.grid_training, ranks, args=(sizes, batches))
    return {rank: (run[rank]["parameters"], run[rank]["losses"]) for rank in run.ranks}


# lab -> (the solution function its notebook trains with, the notebook's run)
NOTEBOOK_RUNS = {
    "02_data_parallel": ("data_parallel_training", _data_parallel_run),
    "03_model_parallel": ("split_training", _split_run),
    "04_hybrid": ("hybrid_training", _hybrid_run),
    "05_sharded_data_parallel": ("sharded_training", _sharded_run),
    PIPELINE: ("pipeline_training", _pipeline_run),
    "07_long_sequences": ("long_sequence_training", _long_sequence_run),
    "08_experts": ("expert_parallel_training", _experts_run),
    COMPOSITION: ("grid_training", _composition_run),
}


def written_run(lab):
    """NOTEBOOK_RUNS[lab]; for a lab the script runs but nobody wrote its notebook run for, a failure that says so."""
    if lab not in NOTEBOOK_RUNS:
        pytest.fail(f"{lab} is in course_tools/trainings.py's LABS, but tests/test_torchrun.py does not know how its "
                    f"notebook calls {trainings.LABS[lab].function}: write that call in NOTEBOOK_RUNS")
    return NOTEBOOK_RUNS[lab]


def notebook_run(lab, ranks, grid=None):
    """{rank: (params, losses)} from course.launch of the solution's function, as its notebook calls it."""
    return written_run(lab)[1](solution(lab), ranks, grid)


def held_by(lab, params, rank, world_size):
    """One process's parameters as rank `rank` of `world_size` holds them: all of them; in a
    pipeline stage `rank`'s, the model cut as the notebook's stages.split cuts it; under expert
    parallelism the dense ones and its own experts'."""
    if lab == "08_experts":       # the experts' rank holds its own: the lab's held_by
        return solution(lab).held_by(params, rank, world_size)
    if lab != PIPELINE:
        return params
    counts = [len(list(part.parameters())) for part in stages.split(solution(lab).pipe_mlp(), world_size)]
    return params[sum(counts[:rank]):sum(counts[:rank + 1])]


def assert_matches_notebook(saved, lab, grid=None, world_size=2):
    """The script's saved result: every rank's parameters and losses as the notebook's run
    on the same ranks, and its parameters close to one process's (the notebook's check)."""
    assert saved["lab"] == lab and saved["world_size"] == world_size and saved["backend"] == "gloo"
    assert saved["options"]["steps"] == STEPS
    assert saved["function"] == written_run(lab)[0]
    assert sorted(saved["ranks"]) == list(range(world_size))
    expected, (one_process, _) = notebook_run(lab, world_size, grid), notebook_run(lab, 1)[0]
    for rank, report in saved["ranks"].items():
        params, losses = expected[rank]
        has_losses = lab != PIPELINE or rank == world_size - 1     # a pipeline's loss is its last stage's
        assert len(report["params"]) == len(params) and len(report["losses"]) == STEPS * has_losses
        check.assert_close(report["params"], params, f"{lab} parameters after {STEPS} steps", rank=rank)
        check.assert_close(torch.tensor(report["losses"]), torch.tensor(losses), f"{lab} losses", rank=rank)
        check.assert_close(report["params"], held_by(lab, one_process, rank, world_size),
                           f"{lab} parameters against one process", rank=rank)


# --- running torchrun ------------------------------------------------------------------

def torchrun(launch_args, script_args, nodes=1):
    """Start `nodes` torchrun processes at once; wait for all, within TIMEOUT; their outputs."""
    command = [sys.executable, "-m", "torch.distributed.run", *launch_args, "-m", "course_tools", "run", *script_args]
    # torchrun keeps its logs in a torchelastic_* folder of TMPDIR and never removes it: a TMPDIR of the run's own
    temporary = tempfile.TemporaryDirectory(prefix="torchrun-")
    started = [subprocess.Popen(command, env={**ENV, **LOOPBACK, "TMPDIR": temporary.name}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
               for _ in range(nodes)]
    outputs = []
    try:
        for process in started:
            out, err = process.communicate(timeout=TIMEOUT)
            outputs.append((process.returncode, out, err))
    finally:
        for process in started:
            if process.poll() is None:  # timed out: end this torchrun and its ranks
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
        temporary.cleanup()
    return outputs


def one_node(*script_args):
    return torchrun(["--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                     "--master-port", str(_free_port())], script_args)


def two_nodes(*script_args, per_node=1):
    """Two torchrun processes, `per_node` ranks each, as two nodes: a c10d rendezvous on localhost."""
    return torchrun(["--nnodes", "2", "--nproc-per-node", str(per_node), "--rdzv-backend", "c10d",
                     "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--rdzv-id", uuid.uuid4().hex,
                     "--local-addr", "127.0.0.1"], script_args, nodes=2)


def assert_ran(outputs, lab=None):
    for code, out, err in outputs:
        assert code == 0, f"torchrun exited with {code}:\n{out[-2000:]}\n{err[-3000:]}"
    printed = "".join(out for _, out, _ in outputs)
    for rank in (0, 1):  # each rank says what it did, wherever it ran
        trained = rf"loss [\d.]+ -> [\d.]+ in {STEPS} steps"
        if lab == PIPELINE:   # stage r on rank r, the loss on the last
            trained = (trained if rank == 1 else rf"{STEPS} steps \(the loss is on the last stage\)") \
                + f", stage {rank} of 2"
        line = rf"\[rank {rank}/2\] \S+ \S+ \(gloo\): {trained}"
        assert re.search(line, printed), printed
    assert printed.count(" on 2 ranks (gloo") == 1, printed  # rank 0's summary, once
    return printed


# --- the labs under torchrun -----------------------------------------------------------

LABS = list(trainings.LABS)   # every lab the script runs: a new one is tested without being listed here


def test_every_lab_the_script_runs_has_its_notebook_run_written_here():
    unknown, gone = sorted(set(LABS) - set(NOTEBOOK_RUNS)), sorted(set(NOTEBOOK_RUNS) - set(LABS))
    assert not unknown, f"course_tools/trainings.py has {unknown}, whose notebook runs NOTEBOOK_RUNS does not write out"
    assert not gone, f"NOTEBOOK_RUNS writes out {gone}, which course_tools/trainings.py's LABS no longer has"


@pytest.mark.parametrize("lab", LABS)
def test_on_one_node_the_script_ends_as_the_notebook_does(lab, tmp_path):
    written_run(lab)  # a lab whose notebook run is not written here fails before torchrun starts
    out = tmp_path / "result.pt"
    printed = assert_ran(one_node(lab, "--steps", str(STEPS), "--out", str(out)), lab)
    assert f"wrote {out}" in printed
    saved = torch.load(out, weights_only=True)  # plain data: no pickled classes
    assert_matches_notebook(saved, lab, Grid(1, 2))  # lab 4: the notebook's grid on 2 ranks
    if lab == "04_hybrid":
        assert saved["options"]["grid"] == "1x2"
    if lab == "05_sharded_data_parallel":
        assert saved["options"]["stage"] == 3  # the default: ZeRO-3
    if lab == PIPELINE:
        assert (saved["options"]["schedule"], saved["options"]["micro_batches"]) == ("1f1b", 8)  # the defaults
        assert "1f1b, 8 micro-batches, one stage a rank holding (stage 0 16,640, stage 1 13,130 parameters)" in printed


# Two nodes change what the script does (the rendezvous; rank 0's node alone writes), which any lab
# shows, but not what a lab's ranks do where they all meet in collectives over the whole world, as
# one node shows. They do in lab 4, whose grid puts its replicas on different nodes, and in lab 6,
# whose stages send point to point, from one node to the other; lab 9's grid has a test of its own below
# (8 ranks, 4 a node: its pipeline axis, outermost, crosses between the nodes).
ACROSS_NODES = [lab for lab in LABS if lab in ("04_hybrid", PIPELINE)]


@pytest.mark.parametrize("lab", ACROSS_NODES)
def test_on_two_nodes_the_script_ends_as_the_notebook_does(lab, tmp_path):
    written_run(lab)
    out = tmp_path / "result.pt"
    grid = ["--grid", "2x1"] if lab == "04_hybrid" else []  # the replicas on different nodes
    outputs = two_nodes(lab, "--steps", str(STEPS), "--out", str(out), *grid)
    assert_ran(outputs, lab)
    assert sum(f"wrote {out}" in printed for _, printed, _ in outputs) == 1  # by rank 0's node only
    assert_matches_notebook(torch.load(out, weights_only=True), lab, Grid(2, 1))


def test_lab_9_s_three_axes_run_on_8_ranks_over_2_nodes_as_the_notebook_does(tmp_path):
    out, layout = tmp_path / "result.pt", {"pp": 2, "dp": 2, "tp": 2}
    outputs = two_nodes(COMPOSITION, "--steps", str(STEPS), "--out", str(out), "--layout", "pp=2,dp=2,tp=2",
                        per_node=4)
    for code, text, err in outputs:
        assert code == 0, f"torchrun exited with {code}:\n{text[-2000:]}\n{err[-3000:]}"
    printed = "".join(text for _, text, _ in outputs)
    for rank in range(8):
        assert re.search(rf"\[rank {rank}/8\] \S+ \S+ \(gloo\): loss [\d.]+ -> [\d.]+ in {STEPS} steps", printed)
    assert sum(f"wrote {out}" in printed for _, printed, _ in outputs) == 1  # by rank 0's node only
    saved = torch.load(out, weights_only=True)
    assert saved["world_size"] == 8 and saved["options"]["layout"] == layout
    expected, (one_process, alone_losses) = notebook_run(COMPOSITION, 8, layout), notebook_run(COMPOSITION, 1)[0]
    for rank, report in saved["ranks"].items():
        check.assert_close(report["params"], expected[rank][0], "lab 9 parameters after 3 steps", rank=rank)
        check.assert_close(report["params"], one_process, "lab 9 parameters against one process", rank=rank)
        check.assert_close(torch.tensor(report["losses"]), torch.tensor(alone_losses), "lab 9 losses", rank=rank)


def test_under_torchrun_options_that_cannot_run_end_every_rank_with_the_message(tmp_path):
    (code, _, err), = one_node("04_hybrid", "--grid", "2x2", "--out", str(tmp_path / "r.pt"))
    assert code != 0 and not (tmp_path / "r.pt").exists()
    # the rank that stops first says why; torchrun may end the other before it does
    assert "a 2x2 grid needs 4 ranks, but 2 run: use a --grid of 2 ranks, such as 1x2" in err


SCRIPT_THAT_TRAINS_AND_LISTS_THREADS = """
import os, sys, torch, torch.distributed as dist
import course

def step():
    model = torch.nn.Linear(4, 2)
    torch.optim.SGD(model.parameters(), lr=0.1)   # the first optimizer imports torch._dynamo
    dist.all_reduce(torch.ones(3))

course.launch(step, None)
dist.destroy_process_group()
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
with open(os.path.join(sys.argv[1], "threads-" + os.environ["RANK"]), "w") as out:
    out.write(" ".join(sorted(names)))
"""


def test_a_rank_that_trained_leaves_no_gloo_threads_running_once_its_process_group_is_destroyed(tmp_path):
    """Were the world group still held (torch.distributed.nn's defaults, imported after the group
    was made), gloo's threads would outlive destroy_process_group and be torn down at interpreter
    exit, where they can abort the rank: CI saw lab 6's rank 1 end with SIGABRT that way."""
    script = tmp_path / "train_once.py"
    script.write_text(SCRIPT_THAT_TRAINS_AND_LISTS_THREADS)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
               "127.0.0.1", "--master-port", str(_free_port()), str(script), str(tmp_path)]
    done = subprocess.run(command, env={**ENV, **LOOPBACK, "TMPDIR": str(tmp_path)}, capture_output=True,
                          text=True, timeout=TIMEOUT)      # (torchrun's torchelastic_* log folder in tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        threads = (tmp_path / f"threads-{rank}").read_text()
        assert "gloo" not in threads, f"rank {rank}'s threads after destroy_process_group: {threads}"


# --- without torchrun, and what is refused ---------------------------------------------

def test_without_torchrun_ranks_starts_the_ranks_here(tmp_path, capsys):
    saved = main(["02_data_parallel", "--ranks", "2", "--steps", str(STEPS), "--sync", "hooks",
                  "--out", str(tmp_path / "r.pt")])
    assert not saved["torchrun"] and saved["options"]["sync"] == "hooks"
    assert torch.load(tmp_path / "r.pt", weights_only=True)["ranks"][1]["losses"] == saved["ranks"][1]["losses"]
    assert_matches_notebook(saved, "02_data_parallel")  # hooks average as the notebook's default does
    printed = capsys.readouterr().out
    assert "[rank 0/2]" in printed and "[rank 1/2]" in printed


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_without_torchrun_each_zero_stage_runs_its_collectives_and_ends_as_one_process(stage):
    saved = main(["05_sharded_data_parallel", "--ranks", "2", "--steps", str(STEPS), "--stage", str(stage)])
    assert saved["options"]["stage"] == stage
    # a hand count, per parameter tensor per step: stage 0 all-reduces its gradient; stages 1 and 2
    # reduce-scatter it and all-gather the updated parameter
    tensors = 2 * (len(solution("05_sharded_data_parallel").WIDE_MLP["hidden"]) + 1)   # weight and bias a layer
    one_process = notebook_run("05_sharded_data_parallel", 1)[0][0]
    for rank, report in saved["ranks"].items():
        assert report["messages"] == {0: 1, 1: 2, 2: 2}[stage] * tensors * STEPS, (stage, report["messages"])
        check.assert_close(report["params"], one_process, f"ZeRO stage {stage}: parameters against one process",
                           rank=rank)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_without_torchrun_a_pipeline_of_4_stages_sends_to_its_neighbours_and_ends_as_one_process(schedule):
    saved = main([PIPELINE, "--ranks", "4", "--steps", str(STEPS), "--schedule", schedule, "--micro-batches", "4"])
    assert (saved["options"]["schedule"], saved["options"]["micro_batches"]) == (schedule, 4)
    one_process, losses = notebook_run(PIPELINE, 1)[0]
    # a hand count, per step: 2 barriers; each of the 4 micro-batches' activations sent forward
    # and its gradient sent back across each boundary: an end stage sends one way and receives
    # the other (2 x 4), a middle stage both ways (4 x 4)
    for rank, report in saved["ranks"].items():
        assert report["messages"] == (2 + (16 if rank in (1, 2) else 8)) * STEPS, (rank, report["messages"])
        check.assert_close(report["params"], held_by(PIPELINE, one_process, rank, 4),
                           f"{schedule}: stage {rank}'s parameters against one process", rank=rank)
        assert report["stage"] == rank and len(report["losses"]) == STEPS * (rank == 3)
    check.assert_close(torch.tensor(saved["ranks"][3]["losses"]), torch.tensor(losses), f"{schedule}: the losses")


@pytest.mark.parametrize("argv, message", [
    (["05_unknown"], f"invalid choice: '05_unknown' (choose from {', '.join(map(repr, trainings.LABS))})"),
    (["02_data_parallel", "--steps", "0", "--ranks", "2"],
     "argument --steps: must be a positive whole number, got '0'"),
    (["02_data_parallel", "--lr", "-1", "--ranks", "2"], "argument --lr: must be a positive number, got '-1'"),
    (["02_data_parallel", "--grid", "1x2", "--ranks", "2"], "unrecognized arguments: --grid 1x2"),
    (["04_hybrid", "--grid", "2by2", "--ranks", "4"], "'2by2' is not a grid: write DATAxMODEL"),
    (["04_hybrid", "--grid", "0x2", "--ranks", "4"], "'0x2' is not a grid"),
    (["02_data_parallel", "--steps", "3"], "how many ranks? Run it under torchrun"),
    (["02_data_parallel", "--ranks", "3"], "a batch of 64 samples does not split evenly over 3 ranks"),
    (["03_model_parallel", "--ranks", "3"], "512 hidden features do not split evenly over 3 ranks"),
    (["03_model_parallel", "--ranks", "2", "--batch-size", "5000"], "more than the 1438 training samples"),
    (["04_hybrid", "--ranks", "2", "--grid", "2x2"],
     "a 2x2 grid needs 4 ranks, but 2 run: use a --grid of 2 ranks, such as 1x2"),
    (["04_hybrid", "--ranks", "3", "--grid", "1x3", "--batch-size", "255"],
     "128 outputs do not split over 3 model-parallel ranks"),
    (["05_sharded_data_parallel", "--stage", "4", "--ranks", "2"],
     "argument --stage: invalid choice: 4 (choose from 0, 1, 2, 3)"),
    (["05_sharded_data_parallel", "--ranks", "5"], "a batch of 48 samples does not split evenly over 5 ranks"),
    ([PIPELINE, "--ranks", "1"], "8-layer MLP runs one stage of whole layers a rank, on 2 to 8 ranks, but 1 would run"),
    ([PIPELINE, "--ranks", "9"], "on 2 to 8 ranks, but 9 would run: start 2 to 8 ranks"),
    ([PIPELINE, "--ranks", "2", "--micro-batches", "5"], "a batch of 48 samples does not cut into 5 equal micro"),
    ([PIPELINE, "--ranks", "2", "--schedule", "interleaved"], "argument --schedule: invalid choice: 'interleaved'"),
    ([PIPELINE, "--ranks", "2", "--micro-batches", "0"], "argument --micro-batches: must be a positive whole number"),
    (["07_long_sequences", "--ranks", "4", "--sequence", "6"],
     "a sequence of 6 tokens cannot be cut into the 8 pieces a zig-zag split of 4 ranks needs"),
    (["08_experts", "--ranks", "5"], "4 experts leave some of the 5 ranks none to hold: start at most 4 ranks"),
    ([COMPOSITION, "--ranks", "3"], "no default layout for 3 ranks: pass --layout, such as dp=3"),
    ([COMPOSITION, "--ranks", "4", "--layout", "dp=2,tp=4"], "makes a grid of 8 ranks, but 4 are running"),
    ([COMPOSITION, "--ranks", "3", "--layout", "tp=3"], "4 heads do not split evenly over tp = 3"),
    ([COMPOSITION, "--ranks", "2", "--layout", "ep=2"], "'ep=2' is not a layout: write AXIS=SIZE pairs"),
    ([COMPOSITION, "--ranks", "4", "--layout", "dp=4", "--batch-size", "12"],
     "a batch of 12 sequences does not split into dp 4 × 2 micro-batches"),
    (["08_experts", "--ranks", "2", "--experts", "1"], "each token goes to 2 experts: use --experts 2 or more"),
])
def test_what_cannot_run_is_refused_with_what_to_do(argv, message, capsys, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_under_torchrun_ranks_must_agree_with_torchrun(capsys, monkeypatch):
    for name, value in dict(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=str(_free_port())).items():
        monkeypatch.setenv(name, value)  # as torchrun sets them; refused before any connection
    with pytest.raises(SystemExit):
        main(["02_data_parallel", "--ranks", "4"])
    assert "--ranks 4, but torchrun started 2 ranks: leave --ranks out" in capsys.readouterr().err


# --- which backend torchrun's ranks take (the GPUs are pretended) ---------------------

@pytest.mark.parametrize("gpus, local_rank, claims, expected", [
    (1, 0, ["GPU-a", "GPU-a"], ("gloo", "cuda:0")),   # two "nodes" on one machine, one GPU
    (2, 1, ["GPU-a", "GPU-b"], ("nccl", "cuda:1")),   # a GPU each: NCCL
    (1, 0, ["GPU-a", ""], ("gloo", "cuda:0")),        # a rank without a GPU: gloo for all
    (0, 0, ["", ""], ("gloo", "cpu")),
    (1, 1, None, ("gloo", "cuda:0")),                 # this node alone: 2 ranks, 1 GPU
    (2, 1, None, ("nccl", "cuda:1")),
])
def test_torchrun_ranks_take_nccl_only_with_a_gpu_each(gpus, local_rank, claims, expected, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    for name, value in dict(RANK=str(local_rank), WORLD_SIZE="2", LOCAL_RANK=str(local_rank),
                            LOCAL_WORLD_SIZE="2").items():
        monkeypatch.setenv(name, value)
    rank, size, here = course.placement.torchrun_placement(claims)
    assert (rank, size, here.backend, here.devices) == (local_rank, 2, expected[0], (expected[1],))
    if gpus == 0:
        assert course.placement.gpu_claim(local_rank) == ""


def test_the_script_is_a_course_tools_command_and_starts_without_nbgrader():
    """`python -m course_tools -h` lists `run`; `python -m course_tools run` imports neither nbgrader
    nor the grading code (it starts on every rank under torchrun)."""
    listed = subprocess.run([sys.executable, "-m", "course_tools", "-h"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and re.search(r"^ +run +a lab's reference training", listed.stdout, re.M), \
        listed.stdout
    assert started_alone("course_tools", "run", "--help") == "[]"


def test_the_old_name_says_the_new_one_and_runs_it_without_nbgrader():
    """`python -m grader run`, for one term: one line naming `python -m course_tools run`, then the same run;
    `python -m grader -h` no longer lists it."""
    listed = subprocess.run([sys.executable, "-m", "grader", "-h"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and not re.search(r"^ +run ", listed.stdout, re.M), listed.stdout
    assert started_alone("grader", "run", "--help", moved=True) == "[]"


def started_alone(package, *argv, moved=False) -> str:
    """`python -m package argv...` run in a fresh interpreter: the grading modules it loaded, as a printed list."""
    probe = (f"import sys, runpy; sys.argv = [{package!r}, *{list(argv)!r}]\n"
             f"try: runpy.run_module({package!r}, run_name='__main__')\n"
             "except SystemExit: pass\n"
             "grading = ('nbgrader', 'grader.grad', 'grader.jail', 'grader.judge', 'grader.feedback')\n"
             "print(sorted(m for m in sys.modules if m.startswith(grading)))")
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    started = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    assert "02_data_parallel" in started.stdout and "04_hybrid" in started.stdout, started.stdout + started.stderr
    said = "`python -m grader run` moved to `python -m course_tools run`; the old name goes in the next term\n"
    assert (said in started.stderr) == moved and started.stderr.count("moved to") == moved, started.stderr
    return started.stdout.strip().splitlines()[-1]
