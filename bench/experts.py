# One idea past 300 lines: one section of the benchmark report (lab 8's all-to-all and expert-parallel
# layer), its measurements beside the tables that state them, as bench/_results.py has each script own them.
"""Lab 8's all-to-all against all_to_all_single; its expert-parallel step against one process and tensor parallelism;
its dropless dispatch against capacity applied in the dispatch.

1. The all-to-all: the lab's `all_to_all` (the student's, from isend/recv: each rank's counts first, then its
   rows) against `dist.all_to_all_single` on the same seeded rows (ROWS rows of WIDTH float32 features a rank,
   routed at random over 2 ranks), by the lab's `exchange_timing`, which alternates the two call by call. Time:
   the slowest rank's median call, round by round; goal: ≤ 1.3× all_to_all_single's on gloo, from 1 MB a rank.
   Beside them, on the same harness: all_to_all_single told nothing (the counts by an all_to_all_single first)
   and the lab's counts alone, so that what the counts' round trip costs is measured, not guessed; and the rows'
   bandwidth beside the loopback link's, measured in the same run (bench/_limits.py). Bytes, one call of
   each recorded: the rows the lab's isends carry against all_to_all_single's (the formula's, equal), and the
   bytes each rank wrote to its sockets (gloo's headers, and the lab's message of counts, apart).
2. The expert-parallel layer: EXPERTS experts, k = TOP_K, one forward and backward, by three schemes on the same
   seeded tokens, routing and weights: one process (the lab's `moe_forward` on all N·T tokens), expert parallelism
   on 2 ranks (the lab's `expert_parallel`, T tokens a rank, half the experts each) and the experts split by
   tensor parallelism on 2 ranks (the lab's `moe_forward` between its `CopyToRanks` and `SumOverRanks`, every rank
   all N·T tokens and half of each expert's columns), at the lab's expert size and a wider one. Median step time
   (the slowest rank's), the three alternating round by round; the bytes each rank's float32 all-to-alls and
   all-reduces send in a step, counted, against the formulas; and the outputs and the tokens' gradients of both
   parallel schemes against one process's.
3. Dropless against capacity in the dispatch: the lab's `expert_parallel` (counts exchanged, every slot sent) and
   its `capped_dispatch` at capacity factors 1.0 and 1.25 (fixed E x C buffers a rank, the slots past C dropped
   on the sending rank, no counts exchanged), on the same seeded layer, tokens and random routing. Median step
   time (the slowest rank's) alternating round by round; the bytes each rank's float32 all-to-alls send in a step,
   counted, against the routing's (dropless) and the fixed buffers' (capacity); the collectives a step; the share
   of slots dropped.

    python bench/experts.py [--rounds 5] [--quick] [--json bench/results/experts.json]
"""
from __future__ import annotations

import os
import statistics
import time

import _limits
import _script
import torch
import torch.distributed as dist
from _results import count, emit, headline_row
from _rounds import spread, spread_text, unrecorded

import course
from course import experts, moe
from grader.common.solution import load

LAB = load("08_experts")
RANKS = 2
# Rows of `width` features a rank for the all-to-all; (hidden, ffn, tokens a rank) for the layer.
FULL = {"exchange_rows": (1024, 2048, 4096, 32768), "width": 256,          # 1, 2, 4, 32 MB a rank
        "layers": ((LAB.HIDDEN, LAB.FFN, 256), (256, 1024, 1024))}
QUICK = {"exchange_rows": (512,), "width": 64, "layers": ((LAB.HIDDEN, LAB.FFN, 64),)}   # --quick: for the tests
CALLS = 5          # all-to-all calls of each kind a round (the lab's exchange_timing alternates them)
STEPS = 3          # layer steps a round, after one to warm up
GOAL = 1.3         # the lab's all_to_all's time over all_to_all_single's, on gloo
SCHEMES = ("one process", "expert parallel", "tensor parallel")
DISPATCHES = ("expert parallel", "capacity 1.0", "capacity 1.25")     # dropless, then capacity in the dispatch


def exchange_bytes(rows, width, seed=0):
    """Runs on every rank, recorded: one call of the lab's all_to_all and one of all_to_all_single (the lab's
    exchange_timing with one repeat); this rank's formula bytes."""
    return LAB.exchange_timing(rows, width, 1, seed)["formula"]


def _single_with_counts(rows, counts):
    """torch's all-to-all told nothing, as the lab's is: the counts by an all_to_all_single first, then the rows."""
    sent = torch.tensor([int(c) for c in counts], dtype=torch.int64)
    heard = torch.empty_like(sent)
    dist.all_to_all_single(heard, sent)
    received = torch.empty((int(heard.sum()), *rows.shape[1:]), dtype=rows.dtype)
    dist.all_to_all_single(received, rows, output_split_sizes=heard.tolist(), input_split_sizes=sent.tolist())
    return received, heard.tolist()


def _counts_alone(rows, counts):
    """The lab's all-to-all's first half only: one count to each other rank and one from each, by isend/irecv,
    every receive posted first (the reference's order): the round trip its rows wait for."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    others = [peer for peer in range(world_size) if peer != rank]
    heard = [torch.zeros(1, dtype=torch.int64) for _ in others]
    requests = [dist.irecv(count, peer) for count, peer in zip(heard, others)]
    requests += [dist.isend(torch.tensor([int(counts[peer])]), peer) for peer in others]
    for request in requests:
        request.wait()
    return None, None


#: What each round times against all_to_all_single, on the lab's own harness (`exchange_timing`, its `all_to_all`
#: swapped for each): the lab's, torch's with its counts exchanged first, and the lab's counts alone.
EXCHANGES = {"yours": None, "with its counts": _single_with_counts, "counts alone": _counts_alone}


@unrecorded
def exchange_rounds(sizes, width, rounds, seed=0):
    """Runs on every rank, unrecorded: {rows: [{exchange: (its median seconds, all_to_all_single's beside it)}
    per round]}."""
    harness = LAB.exchange_timing.__globals__
    labs = harness["all_to_all"]
    times = {rows: [] for rows in sizes}
    try:
        for round_ in range(rounds + 1):                    # round 0 warms up: connections, allocations
            for rows in sizes:
                found = {}
                LAB.exchange_timing(rows, width, 1, seed)   # untimed: the first calls after another size pay for it
                for name, exchange in EXCHANGES.items():
                    harness["all_to_all"] = labs if exchange is None else exchange
                    seconds = LAB.exchange_timing(rows, width, CALLS if round_ else 2, seed)["seconds"]
                    found[name] = (seconds["yours"], seconds["all_to_all_single"])
                if round_:
                    times[rows].append(found)
    finally:
        harness["all_to_all"] = labs
    return times


def exchange_rows(sizes, rounds) -> list[dict]:
    width = sizes["width"]
    timed = course.launch(exchange_rounds, RANKS, args=(sizes["exchange_rows"], width, rounds), timeout=300)
    found = []
    for rows in sizes["exchange_rows"]:
        run = course.launch(exchange_bytes, RANKS, args=(rows, width))
        frame = run.comm.to_frame()
        per_rank = []
        for rank in run.ranks:
            mine = frame[frame["rank"] == rank]
            yours = mine[mine["op"].isin(["send", "isend", "recv", "irecv"])]
            theirs = mine[mine["op"] == "all_to_all_single"]
            rows_sent = yours[(yours["op"].isin(["send", "isend"])) & (yours["dtype"] == "torch.float32")]
            counts_sent = yours[(yours["op"].isin(["send", "isend"])) & (yours["dtype"] != "torch.float32")]
            measured = None if yours["measured"].isna().any() or theirs["measured"].isna().any() else (
                int(yours["measured"].sum()), int(theirs["measured"].sum()))
            per_rank.append({"rank": rank, "formula": run[rank],
                             "yours_rows": int(rows_sent["predicted"].sum()),
                             "yours_counts": int(counts_sent["predicted"].sum()),
                             "yours_messages": len(rows_sent) + len(counts_sent),
                             "all_to_all_single": int(theirs["predicted"].sum()),
                             "yours_measured": measured and measured[0], "theirs_measured": measured and measured[1]})
        # Each round: each exchange's slowest rank, and all_to_all_single's beside it (timed in the same calls).
        slowest = [{name: tuple(max(timed[r][rows][i][name][k] for r in timed.ranks) for k in (0, 1))
                    for name in EXCHANGES} for i in range(rounds)]
        yours = [s["yours"][0] for s in slowest]
        single = [s["yours"][1] for s in slowest]
        ratio = spread(y / t for y, t in zip(yours, single))
        leaving = max(b["formula"] for b in per_rank)
        found.append({"rows": rows, "width": width, "bytes": per_rank,
                      "yours_ms": spread(1e3 * t for t in yours),
                      "all_to_all_single_ms": spread(1e3 * t for t in single),
                      "time_ratio": ratio, "goal_met": ratio["median"] <= GOAL,
                      "with_counts_ms": spread(1e3 * s["with its counts"][0] for s in slowest),
                      "over_with_counts": spread(s["yours"][0] / s["with its counts"][0] for s in slowest),
                      "counts_alone_ms": spread(1e3 * s["counts alone"][0] for s in slowest),
                      "yours_GBps": leaving / statistics.median(yours) / 1e9,
                      "all_to_all_single_GBps": leaving / statistics.median(single) / 1e9})
    return found


def layer_case(hidden, ffn, tokens, ranks=RANKS, seed=0):
    """The group's ranks·tokens tokens, their routing, every expert's weights and the output's gradient, seeded:
    the same for every scheme."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(ranks * tokens, hidden, generator=generator)
    weights, chosen = moe.random_routing(ranks * tokens, LAB.EXPERTS, LAB.TOP_K, generator)
    w1, w2 = moe.expert_weights(LAB.EXPERTS, hidden, ffn, seed=seed)
    return x, weights, chosen, w1, w2, torch.randn(ranks * tokens, hidden, generator=generator)


def layer_step(scheme, hidden, ffn, tokens, ranks=RANKS, seed=0):
    """One forward and backward of the layer by `scheme`, as a function of no arguments that returns this rank's
    output and its tokens' gradient (for expert parallelism, this rank's T tokens; otherwise all N·T)."""
    x, weights, chosen, w1, w2, mix = layer_case(hidden, ffn, tokens, ranks, seed)
    device = course.device()
    if scheme in DISPATCHES:
        rank = dist.get_rank()
        mine, held = slice(rank * tokens, (rank + 1) * tokens), moe.experts_of(rank, LAB.EXPERTS, ranks)
        x, weights, chosen, mix = x[mine], weights[mine], chosen[mine], mix[mine]
        w1, w2 = w1[held[0]:held[-1] + 1], w2[held[0]:held[-1] + 1]
        if scheme == "expert parallel":
            def layer(*a):
                return LAB.expert_parallel(*a, LAB.EXPERTS)
        else:
            def layer(*a):
                return LAB.capped_dispatch(*a, LAB.EXPERTS, capacity_of(scheme, tokens))[0]
    elif scheme == "tensor parallel":
        columns = torch.arange(ffn).tensor_split(ranks)[dist.get_rank()]
        w1, w2 = w1[:, :, columns], w2[:, columns]
        def layer(x, *a):
            return LAB.SumOverRanks.apply(LAB.moe_forward(LAB.CopyToRanks.apply(x), *a))
    elif scheme == "one process":
        layer = LAB.moe_forward
    else:
        raise ValueError(f"scheme must be one of {SCHEMES + DISPATCHES[1:]}, got {scheme!r}")
    x, w1, w2 = (t.contiguous().to(device).requires_grad_() for t in (x, w1, w2))
    weights, chosen, mix = weights.to(device), chosen.to(device), mix.to(device)

    def step():
        for t in (x, w1, w2):
            t.grad = None
        y = layer(x, weights, chosen, w1, w2)
        y.backward(mix)
        return y.detach(), x.grad
    return step


def capacity_of(scheme, tokens):
    """The places an expert a sending rank by a "capacity <factor>" scheme, for `tokens` tokens a rank."""
    return experts.capacity(tokens, LAB.EXPERTS, LAB.TOP_K, float(scheme.split()[1]))


def synchronize():
    if course.device().type == "cuda":
        torch.cuda.synchronize()


def layer_once(scheme, hidden, ffn, tokens):
    """Runs on every rank, recorded: one step; this rank's output and tokens' gradient."""
    y, grad = layer_step(scheme, hidden, ffn, tokens)()
    return {"output": y.cpu(), "x's gradient": grad.cpu()}


@unrecorded
def timed_layer(scheme, hidden, ffn, tokens):
    """Runs on every rank, unrecorded: the median seconds of STEPS steps, after one to warm up."""
    step, seconds = layer_step(scheme, hidden, ffn, tokens), []
    for i in range(STEPS + 1):
        dist.barrier()
        start = time.perf_counter()
        step()
        synchronize()
        if i:
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def relative_difference(found, want) -> float:
    found, want = found.cpu(), want.cpu()        # a GPU rank returns its own device's tensors
    return float((found - want).abs().max() / want.abs().max())


def layer_rows(sizes, rounds) -> list[dict]:
    owner = torch.tensor(moe.owners(LAB.EXPERTS, RANKS))
    rows = []
    for hidden, ffn, tokens in sizes["layers"]:
        want_y, want_grad = layer_step("one process", hidden, ffn, tokens)()
        chosen = layer_case(hidden, ffn, tokens)[2].reshape(RANKS, tokens, LAB.TOP_K)
        row = {"hidden": hidden, "ffn": ffn, "tokens": tokens, "sent": {}, "difference": {}}
        for scheme in SCHEMES[1:]:
            run = course.launch(layer_once, RANKS, args=(scheme, hidden, ffn, tokens))
            frame = run.comm.to_frame()
            moved = frame[frame["op"].isin(["all_to_all_single", "all_reduce"]) & (frame["dtype"] == "torch.float32")]
            mine = [slice(r * tokens, (r + 1) * tokens) if scheme == "expert parallel" else slice(None)
                    for r in run.ranks]
            row["difference"][scheme] = max(
                max(relative_difference(run[r]["output"], want_y[mine[r]]),
                    relative_difference(run[r]["x's gradient"], want_grad[mine[r]])) for r in run.ranks)
            if scheme == "expert parallel":   # each row bound for another rank's expert: there and back, twice
                routed = [2 * 4 * hidden * (int((owner[chosen[r]] != r).sum()) + sum(
                    int((owner[chosen[s]] == r).sum()) for s in range(RANKS) if s != r)) for r in run.ranks]
                formula = experts.sent_per_layer(tokens, hidden, LAB.TOP_K, RANKS, 4)
            else:
                routed = [None] * RANKS
                formula = experts.tensor_parallel_sent(tokens * RANKS, hidden, RANKS, 4)
            row["sent"][scheme] = [{"rank": r, "counted": float(moved[moved["rank"] == r]["predicted"].sum()),
                                    "by the routing": routed[r], "formula": formula} for r in run.ranks]
        seconds = {scheme: [] for scheme in SCHEMES}
        for _ in range(rounds):
            for scheme in SCHEMES:
                run = course.launch(timed_layer, 1 if scheme == "one process" else RANKS,
                                    args=(scheme, hidden, ffn, tokens), timeout=300)
                seconds[scheme].append(max(run[r] for r in run.ranks))
        row["ms"] = {scheme: spread(1e3 * t for t in seconds[scheme]) for scheme in SCHEMES}
        row["over_one_process"] = spread(e / o for e, o in zip(seconds["expert parallel"], seconds["one process"]))
        row["over_tensor_parallel"] = spread(e / t for e, t in zip(seconds["expert parallel"],
                                                                   seconds["tensor parallel"]))
        rows.append(row)
    return rows


def dispatch_rows(sizes, rounds) -> list[dict]:
    rows = []
    for hidden, ffn, tokens in sizes["layers"]:
        chosen = layer_case(hidden, ffn, tokens)[2].reshape(RANKS, tokens, LAB.TOP_K)
        row = {"hidden": hidden, "ffn": ffn, "tokens": tokens, "sent": {}, "collectives": {}, "dropped": {}}
        for scheme in DISPATCHES:
            run = course.launch(layer_once, RANKS, args=(scheme, hidden, ffn, tokens))
            frame = run.comm.to_frame()
            rows_sent = frame[(frame["op"] == "all_to_all_single") & (frame["dtype"] == "torch.float32")]
            row["collectives"][scheme] = len(frame) / RANKS
            if scheme == "expert parallel":
                owner = torch.tensor(moe.owners(LAB.EXPERTS, RANKS))
                expected = [2 * 4 * hidden * (int((owner[chosen[r]] != r).sum()) + sum(
                    int((owner[chosen[s]] == r).sum()) for s in range(RANKS) if s != r)) for r in run.ranks]
                row["dropped"][scheme] = 0.0
            else:
                places = capacity_of(scheme, tokens)
                expected = [experts.capacity_dispatch_sent(places, hidden, LAB.EXPERTS, RANKS, 4, rank=r)
                            for r in run.ranks]
                kept = [LAB.kept_by_loop(chosen[r], LAB.EXPERTS, places) for r in run.ranks]
                row["dropped"][scheme] = 1 - sum(map(sum, sum(kept, []))) / chosen.numel()
            row["sent"][scheme] = [{"rank": r, "counted": float(rows_sent[rows_sent["rank"] == r]["predicted"].sum()),
                                    "expected": expected[r]} for r in run.ranks]
        seconds = {scheme: [] for scheme in DISPATCHES}
        for _ in range(rounds):
            for scheme in DISPATCHES:
                run = course.launch(timed_layer, RANKS, args=(scheme, hidden, ffn, tokens), timeout=300)
                seconds[scheme].append(max(run[r] for r in run.ranks))
        row["ms"] = {scheme: spread(1e3 * t for t in seconds[scheme]) for scheme in DISPATCHES}
        row["over_dropless"] = {scheme: spread(c / d for c, d in zip(seconds[scheme], seconds["expert parallel"]))
                                for scheme in DISPATCHES[1:]}
        rows.append(row)
    return rows


def main(argv=None):
    args = _script.options(__doc__, argv, full=FULL, quick=QUICK, default_rounds=5, rounds_help="rounds of each timing",
                           quick_help="small sizes, 1 round: for tests")
    sizes, rounds = args.sizes, args.rounds
    figures = {"quick": args.quick, "rounds": rounds, "cores": os.cpu_count(), "ranks": RANKS,
               "backend": course.placement.choose(RANKS).backend, "experts": LAB.EXPERTS, "top_k": LAB.TOP_K,
               "limits": _limits.measure(rounds),
               "exchange": exchange_rows(sizes, rounds), "layer": layer_rows(sizes, rounds),
               "dispatch": dispatch_rows(sizes, rounds)}
    emit(args.json, title="Lab 8's all-to-all and expert parallelism against torch.distributed, one process and "
         "tensor parallelism", markdown=markdown(figures), headline=headline(figures), figures=figures)


def goal_text(row) -> str:
    return f"goal ≤ {GOAL}×: {'met' if row['goal_met'] else 'missed'}"


def headers(row) -> str:
    """The bytes the lab's all_to_all wrote to its sockets beyond all_to_all_single's, over the ranks."""
    extra = [b["yours_measured"] - b["theirs_measured"] for b in row["bytes"] if b["yours_measured"] is not None]
    if not extra:
        return "not measured here (needs gloo on Linux)"
    return f"{min(extra):+,} B" if min(extra) == max(extra) else f"{min(extra):+,} to {max(extra):+,} B"


def headline(figures) -> list[dict]:
    over = count(figures["rounds"], "round")
    rows = []
    for r in figures["exchange"]:
        rows.append(headline_row(f"lab 8's all_to_all / `all_to_all_single`, {figures['ranks']} ranks, {r['rows']:,} "
                                 f"rows of {r['width']} float32 a rank", f"{spread_text(r['time_ratio'], unit='×')} "
                                 f"({goal_text(r)}); its counts' round trip alone {r['counts_alone_ms']['median']:.2f} "
                                 f"ms; / `all_to_all_single` with its counts "
                                 f"{spread_text(r['over_with_counts'], unit='×')}", over))
    equal = all(b["yours_rows"] == b["all_to_all_single"] == b["formula"] for r in figures["exchange"]
                for b in r["bytes"])
    rows.append(headline_row("lab 8's all_to_all: bytes of rows against `all_to_all_single`'s; on the sockets, beyond",
                             f"{'equal' if equal else 'NOT equal'}; {headers(figures['exchange'][-1])} (its counts "
                             "and their header)", count(len(figures["exchange"]), "size")))
    for r in figures["layer"]:
        setting = f"{r['hidden']} wide, {r['tokens']:,} tokens a rank"
        rows.append(headline_row(f"expert-parallel step / one process, {setting}", spread_text(r["over_one_process"]),
                                 over))
        rows.append(headline_row(f"expert-parallel step / tensor-parallel experts, {setting}",
                                 spread_text(r["over_tensor_parallel"]), over))
    for r in figures["dispatch"]:
        for scheme in DISPATCHES[1:]:
            rows.append(headline_row(f"{scheme} in the dispatch / dropless, {r['hidden']} wide, {r['tokens']:,} "
                                     f"tokens a rank ({r['dropped'][scheme]:.1%} of slots dropped)",
                                     spread_text(r["over_dropless"][scheme]), over))
    return rows


def markdown(figures) -> str:
    placement = course.placement.choose(RANKS)
    quick = "; **--quick**: sizes for the tests, not figures" if figures["quick"] else ""
    rounds = count(figures["rounds"], "round")
    lines = [f"{placement.backend}, {', '.join(sorted(set(placement.devices)))}, {figures['ranks']} ranks, "
             f"{figures['cores']} cores{quick}.", "",
             _limits.limits_text(figures["limits"]), "",
             f"The all-to-all: rows routed at random, the lab's `all_to_all` (isend/recv, its counts first) and "
             f"`all_to_all_single` (told the counts) alternating call by call ({CALLS} of each a round, the lab's "
             f"`exchange_timing`); beside them, timed the same way, `all_to_all_single` told nothing (the counts by "
             f"an `all_to_all_single` first, as a dispatcher does) and the lab's counts alone (one int64 each way "
             f"to every other rank: the round trip its rows wait for). Medians and ranges over {rounds} of the "
             f"slowest rank's median call; course recording off. Rows' bandwidth: the bytes that leave a rank over "
             f"the call's time, and its share of the loopback link both ways.", "",
             f"| rows a rank | lab's all_to_all | all_to_all_single | lab's / all_to_all_single (range) | "
             f"goal ≤ {GOAL}× | all_to_all_single with its counts | lab's / that | the counts alone | rows' "
             f"bandwidth, lab's | all_to_all_single's |", "|---|---|---|---|---|---|---|---|---|---|"]
    link = figures["limits"]["loopback_both_ways_GBps"]["median"]
    for r in figures["exchange"]:
        lines.append(f"| {r['rows']:,} × {r['width']} ({r['rows'] * r['width'] * 4 / 2**20:g} MiB) | "
                     f"{r['yours_ms']['median']:.2f} ms | "
                     f"{r['all_to_all_single_ms']['median']:.2f} ms | {spread_text(r['time_ratio'])} | "
                     f"{'met' if r['goal_met'] else '**missed**'} | {r['with_counts_ms']['median']:.2f} ms | "
                     f"{spread_text(r['over_with_counts'])} | {r['counts_alone_ms']['median']:.2f} ms | "
                     f"{r['yours_GBps']:.2f} GB/s ({r['yours_GBps'] / link:.0%}) | "
                     f"{r['all_to_all_single_GBps']:.2f} GB/s ({r['all_to_all_single_GBps'] / link:.0%}) |")
    lines += ["", "Bytes a rank sends in one call of each (recorded): the rows by the formula (rows that leave the "
              "rank × width × 4), what the lab's isends of rows and of counts carry, all_to_all_single's, and the "
              "bytes each wrote to its sockets (gloo's headers included).", "",
              "| rows a rank | rank | formula | lab's rows | lab's counts | all_to_all_single | lab's messages | "
              "lab's on sockets | all_to_all_single on sockets | difference |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in figures["exchange"]:
        for b in r["bytes"]:
            sockets = ("n/a | n/a | n/a" if b["yours_measured"] is None else
                       f"{b['yours_measured']:,} | {b['theirs_measured']:,} | "
                       f"{b['yours_measured'] - b['theirs_measured']:+,}")
            lines.append(f"| {r['rows']:,} | {b['rank']} | {b['formula']:,} | {b['yours_rows']:,} | "
                         f"{b['yours_counts']:,} | {b['all_to_all_single']:,} | {b['yours_messages']} | {sockets} |")
    lines += ["", f"The layer: {figures['experts']} experts, k = {figures['top_k']}, float32, one forward and backward "
              f"on the same seeded tokens, routing (random) and weights; one process runs all {figures['ranks']}·T "
              "tokens, expert parallelism T a rank and half the experts, tensor parallelism every token on every "
              f"rank and half of each expert's columns. Medians and ranges over {rounds}, the three alternating, each "
              f"round the slowest rank's median of {STEPS} steps; course recording off.", "",
              "| hidden | ffn | T | one process | expert parallel | tensor parallel | expert / one process | "
              "expert / tensor parallel |", "|---|---|---|---|---|---|---|---|"]
    for r in figures["layer"]:
        ms = r["ms"]
        lines.append(f"| {r['hidden']} | {r['ffn']} | {r['tokens']:,} | {ms['one process']['median']:.2f} ms | "
                     f"{ms['expert parallel']['median']:.2f} ms | {ms['tensor parallel']['median']:.2f} ms | "
                     f"{spread_text(r['over_one_process'])} | {spread_text(r['over_tensor_parallel'])} |")
    lines += ["", "Bytes a rank sends in a step (its float32 all-to-alls or all-reduces, counted by the formula of "
              "each call): expert parallelism against the rows its routing sends and the even-routing formula "
              "(`experts.sent_per_layer`), tensor parallelism against `experts.tensor_parallel_sent`; and the "
              "largest difference of either's outputs and tokens' gradients from one process's, relative to its "
              "largest value.", "",
              "| hidden | T | scheme | rank | counted | by the routing | formula | outputs and gradients, relative "
              "difference |", "|---|---|---|---|---|---|---|---|"]
    for r in figures["layer"]:
        for scheme, sent in r["sent"].items():
            for b in sent:
                routed = "-" if b["by the routing"] is None else f"{b['by the routing']:,}"
                lines.append(f"| {r['hidden']} | {r['tokens']:,} | {scheme} | {b['rank']} | {b['counted']:,.0f} | "
                             f"{routed} | {b['formula']:,.0f} | {r['difference'][scheme]:.1e} |")
    lines += ["", "Dropless against capacity in the dispatch, the same layer, tokens and random routing: the lab's "
              "`expert_parallel` (counts exchanged, every slot sent) and its `capped_dispatch` (E x C buffers a "
              "rank, C = `experts.capacity` of the rank's T tokens, drops on the sender, no counts). Step time as "
              "above; bytes of rows a rank a step, counted, against the routing's rows (dropless) or the fixed "
              "buffers' places bound for other ranks (capacity); collectives a rank a step (recorded), slots "
              "dropped.", "",
              "| hidden | T | dispatch | step | / dropless (range) | collectives | bytes counted (rank 0) | "
              "expected | slots dropped |", "|---|---|---|---|---|---|---|---|---|"]
    for r in figures["dispatch"]:
        for scheme in DISPATCHES:
            ratio = "-" if scheme == "expert parallel" else spread_text(r["over_dropless"][scheme])
            b = r["sent"][scheme][0]
            lines.append(f"| {r['hidden']} | {r['tokens']:,} | {scheme} | {r['ms'][scheme]['median']:.2f} ms | "
                         f"{ratio} | {r['collectives'][scheme]:.0f} | {b['counted']:,.0f} | {b['expected']:,.0f} | "
                         f"{r['dropped'][scheme]:.1%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
