"""Time on expert parallelism's critical path: its all-to-alls waited for, or one micro-batch's dispatch
hidden under another's experts.

    results = expert_overlap.run(2, micro_batches=4)      # both schedules, side by side, on 2 ranks
    expert_overlap.summary(results)    # median seconds a step of each, and what overlapping hid
    expert_overlap.plot(axes, results) # each schedule's last step on the per-rank timeline

Expert parallelism sends four all-to-alls a layer a micro-batch: the dispatch and the combine forward,
and in the backward the combine's gradients to the experts' ranks and the dispatch's gradients back to
the tokens' ranks. An expert cannot start before its rows arrive, so waiting for each all-to-all before
the compute that needs it (`blocking`) puts every one of them on the critical path. `overlapped` issues
micro-batch i+1's all-to-all (`async_op=True`) before micro-batch i's experts compute and waits for it
after, and waits for the combines (each issued as its experts finish) at the end of the pass: what
flies while another micro-batch computes is hidden. Lab 3 found the same of tensor parallelism's
all-reduces inside the forward; replicated experts' gradient all-reduce is different: it runs once a
step and overlaps the backward by itself, as lab 2's buckets do.

The step's shape, not its routing: each rank sends tokens·k rows of h features in equal splits to
every rank (what expert parallelism sends under even routing), and the rows a rank receives are
shared equally by the experts it holds (`moe.experts_of`), each running its MLP (`moe.expert_mlp`)
forward and backward. The timing is the step's and the sizes are expert parallelism's; which token
goes to which expert (lab 8's exercises) is not here.

On CPU ranks gloo runs an asynchronous collective on a thread of its own, which shares the machine's
cores with the ranks' compute: what overlapping hides there is bounded by the cores left over. On GPUs
NCCL's all-to-all runs on a stream of its own (a few of the GPU's SMs), beside the experts' matmuls.

Used in: lab 8 (08_experts), the demo (solutions/demo.ipynb).
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from course import moe, placement, timeline
from course.launch import launch

SCHEDULES = ("blocking", "overlapped")
FORWARD = ("dispatch", "combine")                              # the forward's all-to-alls, in order
BACKWARD = ("combine's gradient", "dispatch's gradient")        # the backward's
SIZES = dict(tokens=256, hidden=256, ffn=512, experts=4, top_k=2)   # a micro-batch's, on each rank


def check_sizes(world_size: int, *, micro_batches: int, tokens: int, hidden: int, ffn: int, experts: int,
                top_k: int, repeats: int) -> None:
    """Refuse sizes that cannot make the step, saying which and what to choose instead."""
    for name, value in (("world_size", world_size), ("micro_batches", micro_batches), ("tokens", tokens),
                        ("hidden", hidden), ("ffn", ffn), ("experts", experts), ("top_k", top_k),
                        ("repeats", repeats)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    if micro_batches < 2:
        raise ValueError(f"micro_batches={micro_batches}: overlapping needs another micro-batch's dispatch to "
                         "issue while one computes; give at least 2")
    if top_k > experts:
        raise ValueError(f"top_k={top_k} experts a token, but only {experts} experts; give top_k <= experts")
    if experts < world_size:
        raise ValueError(f"{experts} experts over {world_size} ranks: each rank must hold at least one expert; "
                         f"give experts >= {world_size}")
    if (tokens * top_k) % world_size:
        raise ValueError(f"tokens·top_k = {tokens}·{top_k} rows a micro-batch do not split equally over "
                         f"{world_size} ranks; give tokens a multiple of {world_size}")


class _InFlight:
    """One all-to-all of equal splits, issued; its received rows once waited for. Logs to `events`."""

    def __init__(self, rows: torch.Tensor, name: str, micro_batch: int, overlapped: bool, events: list):
        self.name, self.micro_batch, self.events = name, micro_batch, events
        self.received = torch.empty_like(rows)
        events.append(("issue", name, micro_batch))
        self.work = dist.all_to_all_single(self.received, rows, async_op=overlapped)
        if not overlapped:
            events.append(("wait", name, micro_batch))

    def wait(self) -> torch.Tensor:
        if self.work is not None:
            self.work.wait()
            self.work = None
            self.events.append(("wait", self.name, self.micro_batch))
        return self.received


def _experts_forward(rows, w1, w2):
    """The rank's experts, each on an equal share of the rows it received: (their inputs, their outputs)."""
    rows = rows.requires_grad_()
    with torch.enable_grad():
        out = torch.cat([moe.expert_mlp(share, w1[e], w2[e]) for e, share in enumerate(rows.tensor_split(len(w1)))])
    return rows, out


def _pass(inputs, compute, names, order, overlapped, events, span):
    """One pass over the micro-batches in `order`: the first all-to-all, `compute`, the second. Returns the
    second all-to-all's received rows by micro-batch."""
    first, second = names
    pending = {order[0]: _InFlight(inputs[order[0]], first, order[0], overlapped, events)}
    sent = {}
    for position, i in enumerate(order):
        if i not in pending:                     # blocking: each micro-batch's, in its turn
            pending[i] = _InFlight(inputs[i], first, i, overlapped, events)
        received = pending.pop(i).wait()
        if overlapped and position + 1 < len(order):   # the next micro-batch's flies while this one computes
            following = order[position + 1]
            pending[following] = _InFlight(inputs[following], first, following, overlapped, events)
        events.append(("compute", span, i))
        with timeline.span(f"{span} {i}"):
            result = compute(i, received)
        sent[i] = _InFlight(result, second, i, overlapped, events)
    return {i: flight.wait() for i, flight in sent.items()}


def one_step(x, gradients, w1, w2, overlapped: bool) -> tuple[list, list]:
    """Runs on every rank: one step of the layer's four all-to-alls and its experts on every micro-batch,
    forward then backward (micro-batches in reverse); the events in the order this rank made them, and its
    experts' weight gradients summed over the micro-batches."""
    events, saved, weight_gradients = [], {}, [torch.zeros_like(w1), torch.zeros_like(w2)]
    order = list(range(len(x)))

    def forward(i, received):
        saved[i] = _experts_forward(received, w1, w2)
        return saved[i][1].detach()

    def backward(i, received):
        rows, out = saved.pop(i)
        d_rows, d_w1, d_w2 = torch.autograd.grad(out, (rows, w1, w2), received)
        weight_gradients[0] += d_w1
        weight_gradients[1] += d_w2
        return d_rows

    _pass(x, forward, FORWARD, order, overlapped, events, "experts forward")
    _pass(gradients, backward, BACKWARD, order[::-1], overlapped, events, "experts backward")
    return events, weight_gradients


def micro_batches_of(rank: int, micro_batches: int, seed: int = 0, **sizes) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s rows to dispatch and the gradients its combine's output gets, seeded:
    (micro_batches, tokens·k, hidden) each."""
    sizes = {**SIZES, **sizes}
    generator = torch.Generator().manual_seed(seed + 1 + rank)
    shape = (micro_batches, sizes["tokens"] * sizes["top_k"], sizes["hidden"])
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def timed_steps(micro_batches=4, repeats=5, seed=0, **sizes):
    """Runs on every rank: a step of each schedule to warm up, then `repeats` rounds of one step of each, their
    order alternating round by round. Returns this rank's {"seconds": {schedule: per round}, and of each
    schedule's last step: "events", "weight_gradients" and "shown", its (start, end) on the timeline's clock}."""
    sizes = {**SIZES, **sizes}
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mine = moe.experts_of(rank, sizes["experts"], world_size)
    w1, w2 = moe.expert_weights(sizes["experts"], sizes["hidden"], sizes["ffn"], seed=seed)
    device = placement.device()
    w1, w2 = (w[mine[0]:mine[-1] + 1].to(device).requires_grad_() for w in (w1, w2))
    x, gradients = (t.to(device) for t in micro_batches_of(rank, micro_batches, seed, **sizes))
    for schedule in SCHEDULES:                  # connections, allocations
        one_step(x, gradients, w1, w2, schedule == "overlapped")
    found = {"seconds": {s: [] for s in SCHEDULES}, "events": {}, "weight_gradients": {}, "shown": {}}
    for round_ in range(repeats):
        for schedule in SCHEDULES[::1 if round_ % 2 == 0 else -1]:
            dist.barrier()
            start, shown = time.perf_counter(), timeline.now()
            events, weight_gradients = one_step(x, gradients, w1, w2, schedule == "overlapped")
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            found["seconds"][schedule].append(time.perf_counter() - start)
            found["shown"][schedule] = (shown, timeline.now())
            found["events"][schedule] = events
            found["weight_gradients"][schedule] = [g.cpu() for g in weight_gradients]
    return found


def run(ranks: int, *, micro_batches: int = 4, repeats: int = 5, seed: int = 0, **sizes):
    """Both schedules on `ranks` ranks (see timed_steps), the sizes checked first; course.launch's results."""
    unknown = set(sizes) - set(SIZES)
    if unknown:
        raise TypeError(f"unknown sizes {sorted(unknown)}; the sizes are {sorted(SIZES)}")
    check_sizes(ranks, micro_batches=micro_batches, repeats=repeats, **{**SIZES, **sizes})
    return launch(timed_steps, ranks, kwargs=dict(micro_batches=micro_batches, repeats=repeats, seed=seed, **sizes))


def in_window(results, rank: int, schedule: str) -> list[tuple[str, str, float, float]]:
    """Rank `rank`'s intervals in `schedule`'s last step, in the order they began: ("compute", span name, start,
    end) and ("all-to-all", "all_to_all_single", start, end), on the rank's clock."""
    start, end = results[rank]["shown"][schedule]
    found = [("compute", s.name, s.start, s.end) for s in results.timeline.rank(rank) if start <= s.start <= end]
    found += [("all-to-all", r.op, r.start, r.end) for r in results.comm.rank(rank)
              if r.op == "all_to_all_single" and start <= r.start <= end]
    return sorted(found, key=lambda interval: interval[2])


def summary(results) -> dict:
    """Seconds a step, each round's slowest rank's, median over the rounds: {"blocking", "overlapped",
    "hidden" (median of blocking − overlapped, round by round), "waited" (the slowest rank's time inside
    the blocking step's all-to-alls: the most overlapping could hide), "rounds"}."""
    seconds = {s: [max(results[r]["seconds"][s][i] for r in results.ranks)
                   for i in range(len(results[results.ranks[0]]["seconds"][s]))] for s in SCHEDULES}
    waited = max(sum(end - start for kind, _, start, end in in_window(results, r, "blocking") if kind == "all-to-all")
                 for r in results.ranks)
    return {**{s: statistics.median(seconds[s]) for s in SCHEDULES},
            "hidden": statistics.median(b - o for b, o in zip(seconds["blocking"], seconds["overlapped"])),
            "waited": waited, "rounds": len(seconds["blocking"])}


def plot(axes, results):
    """Each schedule's last step on its ax, rank by rank (compute blue, all-to-alls red, from call to
    completion), the same milliseconds wide, titled with its median step."""
    figures = summary(results)
    windows = {s: [results[r]["shown"][s] for r in results.ranks] for s in SCHEDULES}
    # Each rank's clock starts with its function: a window spans every rank's, the widest sets the scale.
    width = max(max(end for _, end in shown) - min(start for start, _ in shown) for shown in windows.values())
    for n, (ax, schedule) in enumerate(zip(axes, SCHEDULES)):
        timeline.plot(ax, results)
        start = min(begin for begin, _ in windows[schedule])
        ax.set_xlim(start * 1e3, (start + width) * 1e3)
        ax.set_title(f"{schedule}: {figures[schedule] * 1e3:.1f} ms a step (median of {figures['rounds']})",
                     loc="left", fontsize="small")
        if n and ax.get_legend() is not None:
            ax.get_legend().remove()
    return axes
